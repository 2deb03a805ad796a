"""`dlperf comm`: numbers in JSON/CSV, the nccl-tests style sweep, and one-line errors with exit code 2."""

from __future__ import annotations

import csv
import io
import json

import pytest

from dlperf.cli import cli, main
from dlperf.comm import Group, collective_report
from dlperf.commands.comm import parse_sizes
from dlperf.spec.hardware import load_hardware


def run(capsys, *args: str) -> tuple[int, str, str]:
    try:
        main(["comm", *args])
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def test_json_report_matches_library(capsys) -> None:
    code, out, _ = run(capsys, "allreduce", "--size", "1GiB", "--gpus", "16", "--format", "json")
    assert code == 0
    data = json.loads(out)
    expected = collective_report("allreduce", 2.0**30, Group(16), load_hardware("dgx-a100"))
    assert data["chosen"] == expected.chosen and data["time_s"] == pytest.approx(expected.time)
    assert data["busbw_Bps"] == pytest.approx(data["algbw_Bps"] * 2 * 15 / 16)
    assert data["levels"] == ["nvswitch", "infiniband-hdr"]
    names = [row["algorithm"] for row in data["algorithms"]]
    assert {"ring", "tree", "double_tree", "recursive_doubling", "rabenseifner", "hierarchical", "ps"} <= set(names)


def test_table_marks_the_chosen_algorithm(capsys) -> None:
    code, out, _ = run(capsys, "allgather", "--size", "256MiB", "--gpus", "8", "--algorithm", "ring")
    assert code == 0
    assert "ring *" in out and "chosen: ring" in out and "busbw (GB/s)" in out


def test_sweep_rows_are_powers_of_two(capsys) -> None:
    code, out, _ = run(capsys, "broadcast", "--sizes", "1KiB..8KiB", "--gpus", "4", "--format", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [int(r["size (B)"]) for r in rows] == [1024, 2048, 4096, 8192]
    for r in rows:  # broadcast: busbw == algbw == size / time
        assert float(r["busbw (GB/s)"]) == pytest.approx(float(r["algbw (GB/s)"]))
        assert float(r["algbw (GB/s)"]) == pytest.approx(int(r["size (B)"]) / float(r["time (us)"]) / 1e3)


def test_parse_sizes() -> None:
    assert parse_sizes("1KiB..8KiB") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1MiB..1MiB") == [2.0**20]
    assert len(parse_sizes("1KiB..8GiB")) == 24


@pytest.mark.parametrize(("args", "message"), [
    (["allreduc"], "unknown collective 'allreduc' (did you mean 'allreduce'?)"),
    (["allreduce", "--algorithm", "rign"], "unknown allreduce algorithm 'rign' (did you mean 'ring'?)"),
    (["allreduce", "--size", "1GB/s"], "--size: expected a positive bytes"),
    (["allreduce", "--sizes", "8GiB..1KiB"], "--sizes: bad size range '8GiB..1KiB'; expected LOW <= HIGH"),
    (["allreduce", "--sizes", "1KiB"], "expected LOW..HIGH"),
    (["allreduce", "--gpus", "0"], "--gpus: expected at least 1, found 0"),
    (["allreduce", "--hardware", "dgx-a10"], "unknown hardware 'dgx-a10' (did you mean 'dgx-a100'?)"),
])
def test_errors_are_one_line_exit_2(capsys, args: list[str], message: str) -> None:
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("Error: ") and message in err


def test_every_option_has_help() -> None:
    command = cli.get_command(None, "comm")
    assert command is not None and command.help
    for param in command.params:
        if param.param_type_name == "option":
            assert param.help, param.name


def test_stride_places_one_rank_per_node(capsys) -> None:
    code, out, _ = run(capsys, "allreduce", "--gpus", "4", "--stride", "8", "--format", "json")
    assert code == 0 and json.loads(out)["levels"] == ["infiniband-hdr"]
    code, out, _ = run(capsys, "allreduce", "--gpus", "16", "--algorithm", "auto:nccl", "--format", "json")
    assert code == 0 and json.loads(out)["chosen"] in ("nccl:ring/Simple", "nccl:tree/Simple")
    code, out, _ = run(capsys, "allreduce", "--gpus", "16", "--algorithm", "auto:textbook", "--format", "json")
    assert code == 0 and not json.loads(out)["chosen"].startswith("nccl:")


def test_nccl_algorithm_and_protocol_in_the_output(capsys) -> None:
    code, out, _ = run(capsys, "allreduce", "--sizes", "8B..1GiB", "--gpus", "8", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and rows[0]["algorithm"] == "nccl:tree/LL" and rows[-1]["algorithm"] == "nccl:ring/Simple"
    code, out, _ = run(capsys, "allreduce", "--size", "64MiB", "--algorithm", "nccl:ring")
    assert code == 0 and "chosen: nccl:ring/Simple (fastest of nccl:ring)" in out
    code, _, err = run(capsys, "allreduce", "--algorithm", "nccl:ring/LL64")
    assert code == 2 and err.strip() == "Error: unknown NCCL protocol 'LL64'; expected LL, LL128 or Simple"
