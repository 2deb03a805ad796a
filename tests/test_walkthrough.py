"""The README's "What it does" commands, run in sequence as a new user would, in a fresh folder: every one
succeeds, warns about nothing, writes the files it names, and no output contradicts another (the same plan has
the same step time and fit everywhere; search's best is no slower than a plan it could have found)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.test_calibrate import synthetic_calibration

README = Path(__file__).parent.parent / "README.md"


def readme_commands() -> list[list[str]]:
    """Every `dlperf ...` line of the README's "What it does" block, comments removed."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## What it does"):]
    block = section[section.index("```bash") + len("```bash"):section.index("```", section.index("```bash") + 7)]
    return [shlex.split(line.split("#", 1)[0])[1:] for line in block.splitlines() if line.startswith("dlperf ")]


def test_the_readme_lists_every_command():
    names = {args[0] for args in readme_commands()}
    assert names == {"list", "show", "predict", "compare", "comm", "search", "sweep", "explain", "calibrate",
                     "validate"}


def test_the_readme_counts_the_built_ins_list_prints(run):
    # the walkthrough's `dlperf list` comment said (22) and (16) after mpt/gpt-oss-120b and aws-p5/dgx-b300 etc. came in
    counts = re.search(r"built-in models \((\d+)\) and hardware \((\d+)\)", README.read_text(encoding="utf-8"))
    code, out, _ = run("list", "--format", "json")
    assert code == 0 and counts
    kinds = [row["kind"] for row in json.loads(out)]
    assert (int(counts[1]), int(counts[2])) == (kinds.count("model"), kinds.count("hardware"))


def test_the_readme_lists_every_plan_option_predict_takes():
    # --mx-swizzle was missing from the list
    from dlperf.commands.predict import predict

    text = README.read_text(encoding="utf-8")
    block = text[text.index("Plan options: `"):]
    listed = set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", block[:block.index("`\n")]))
    not_plan = {"--set", "--symbolic", "--latex", "--full", "--plot", "--format", "--help"}
    taken = {opt for param in predict.params for opt in param.opts if opt.startswith("--")} - not_plan
    assert listed == taken


def test_the_readme_counts_the_pending_rows_validate_lists():
    # it said 119 in one place and 136 in another while `dlperf validate` listed 118
    from dlperf.validate import load_pending

    text = " ".join(README.read_text(encoding="utf-8").split())
    said = re.findall(r"(\d+) pending rows|(\d+) more published rows", text)
    assert len(said) == 2 and {int(a or b) for a, b in said} == {len(load_pending())}


def _json(run, args: list[str]) -> dict:
    code, out, err = run(*args, "--format", "json")
    assert code == 0, err
    return json.loads(out)


def test_readme_walkthrough(run, tmp_path, monkeypatch):
    from dlperf.calibrate import calibration

    monkeypatch.chdir(tmp_path)
    # calibrate's timings on a shared test machine are tested elsewhere (test_calibrate*.py); here the command
    # runs on a fixed, noise-free calibration, so that what it writes and what predict reads are what is checked
    monkeypatch.setattr(calibration, "calibrate", lambda *args, **kwargs: synthetic_calibration())
    outputs = {}
    for args in readme_commands():
        code, out, err = run(*args)
        assert code == 0, f"dlperf {' '.join(args)} -> exit {code}: {err}"
        assert "warning:" not in err, err
        for written in re.findall(r"^wrote (.+)$", err, re.M):
            assert Path(written).stat().st_size > 0
        outputs[" ".join(args)] = out
    for name in ("breakdown.png", "scaling.png", "parity.png", "here.yaml"):
        assert (tmp_path / name).exists(), name

    # the same plan gives the same answer in predict, compare, explain and --symbolic
    resnet = ["resnet50", "dgx-a100", "--gpus", "8", "--global-batch", "256"]
    predicted = _json(run, ["predict", *resnet])
    compared = {row["strategy"]: row for row in _json(run, ["compare", *resnet])}
    assert compared["data"]["step_time_s"] == pytest.approx(predicted["step_time_s"], rel=1e-12)
    assert compared["data"]["fits"] is predicted["fits"] is True
    symbolic = _json(run, ["predict", *resnet, "--symbolic"])
    assert symbolic["T_step_value_s"] == pytest.approx(predicted["step_time_s"], rel=1e-12)

    megatron = ["gpt3-175b", "dgx-a100", "--gpus", "1024", "--tp", "8", "--pp", "16", "--global-batch", "1536",
                "--micro-batch", "1", "--recompute", "full"]
    plan = _json(run, ["predict", *megatron])
    assert plan["fits"] and not [n for n in plan["notes"] if "FIT" in n]
    explained = _json(run, ["explain", *megatron])
    assert explained["step_time_s"] == pytest.approx(plan["step_time_s"], rel=1e-12)
    found = _json(run, ["search", "gpt3-175b", "dgx-a100", "--gpus", "1024", "--global-batch", "1536"])
    assert found["feasible"] > 0
    assert found["plans"][0]["step_time_s"] <= plan["step_time_s"] * (1 + 1e-12)  # Megatron's plan is in the space
    # the search's best plan, predicted on its own, fits and takes the time search said
    best = found["plans"][0]
    again = _json(run, ["predict", "gpt3-175b", "dgx-a100", "--gpus", "1024", "--dp", str(best["dp"]),
                        "--tp", str(best["tp"]), "--pp", str(best["pp"]), "--global-batch", "1536",
                        "--micro-batch", str(best["micro_batch"]), "--schedule", best["schedule"],
                        "--virtual-stages", str(best["virtual_stages"]), "--zero", str(best["zero"]),
                        "--recompute", best["recompute"]]
                  + (["--sequence-parallel"] if best["sequence_parallel"] else []))
    assert again["fits"] and again["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-9)

    # the sweep's 8-GPU point is the data-parallel plan compare shows for the same batch per GPU
    rows = _json(run, ["sweep", "resnet50", "dgx1-v100", "--gpus", "1..256"])
    assert all(r["fits"] for r in rows) and max(r["efficiency"] for r in rows) <= 1.0 + 1e-12
