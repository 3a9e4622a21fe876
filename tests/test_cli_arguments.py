"""The command line refuses arguments out of range before anything runs (pipeline/ops/arg_types.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["backtest", "--format", "simulator", "--train-every", "0"], "--train-every: 0 must be at least 1"),
        (["simulate", "--out", "x.jsonl", "--impressions", "-5"], "--impressions: -5 must be at least 1"),
        (["backtest", "--attribution-window", "-5"], "--attribution-window: -5 must be a number above 0"),
        (["produce", "--rate", "nan"], "--rate: nan must be a number above 0"),
        (["serve", "--port", "70000"], "--port: 70000 is not a port (1-65535)"),
        (
            ["deploy", "install", "--prefix", "p", "--user", "u", "--serve-ports", "8081,x"],
            "'x' is not a port number",
        ),
        (
            ["deploy", "install", "--prefix", "p", "--user", "u", "--serve-ports", "8081,8081"],
            "names a port twice",
        ),
    ],
)
def test_out_of_range_arguments_are_refused_before_anything_runs(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse's int took them: --train-every 0 ran with the config's blocks, a negative
    attribution window labelled every click late, port 99999 went into the units."""
    from pipeline.ops.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_an_output_path_that_cannot_be_written_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to end a finished replay in a traceback (the report written last), or start one."""
    from pipeline.ops.cli import main

    taken = tmp_path / "a-file"
    taken.write_text("")
    for argv, said in (
        (["backtest", "--format", "simulator", "--impressions", "50", "--out", str(taken)], "File exists"),
        (["demo", "--impressions", "50", "--out", str(taken)], "File exists"),
        (["simulate", "--impressions", "5", "--out", str(tmp_path)], "a folder, not a file"),
        (["simulate", "--impressions", "5", "--out", str(taken / "x.jsonl")], "File exists"),  # its folder
    ):
        assert main(argv) == 2
        assert f"ctr {argv[0]}: --out " in (err := capsys.readouterr().err) and said in err, err
    assert main(["simulate", "--impressions", "5", "--out", str(tmp_path / "new" / "x.jsonl")]) == 0
    assert (tmp_path / "new" / "x.jsonl").stat().st_size > 0  # a missing folder is made
    assert main(["replay", "--out", str(taken)]) == 2  # the old command still only says where to go
