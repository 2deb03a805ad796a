"""The proof of issue #7 as a test: calibrate this machine, then predict and time real training steps.

Opt-in (`python -m pytest --hardware tests/test_calibrate_check_hw.py`): it runs `dlperf calibrate --check
--quick` (about 2 minutes on a 2-core CPU) and its verdict depends on how quiet the machine is, so the default
suite and CI skip it; benchmarks/bench_calibrate.py --check N prints the same figures over N runs.
"""

import subprocess
import sys

import pytest
import yaml

pytest.importorskip("torch")

from dlperf.calibrate import check  # noqa: E402


@pytest.mark.hardware
def test_calibrated_file_predicts_real_training_steps(tmp_path):
    out = tmp_path / "here.yaml"
    proc = subprocess.run([sys.executable, "-m", "dlperf", "calibrate", "--check", "--quick", "-o", str(out)],
                          capture_output=True, text=True, timeout=900, check=False)
    assert out.exists(), proc.stderr  # the file is written with the check's verdict stamped in it
    stamp = yaml.safe_load(out.read_text())["calibration"]["check"]
    rows = {(r["model"], r["setup"]): r["error"] for r in stamp["rows"]}
    assert len(rows) == len(check.MODELS) + 1  # and the 2-process data-parallel MLP
    assert all(abs(e) <= check.TOLERANCE for e in rows.values()), rows
    assert stamp["median_abs_error"] <= check.MEDIAN_TOLERANCE, rows
    assert proc.returncode == 0 and stamp["passed"] is True
