"""Flag errors name the command they belong to (docs/safety.md): one line
``disaggsim: error: <command>: ...``, exit code 2, before any work."""

from __future__ import annotations

import pytest

from disaggsim.cli import main


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        # argparse reported these from the top-level parser: "disaggsim: error:
        # unrecognized arguments: --gpu (see disaggsim --help)", whose help lists no flags
        (
            ["calibrate", "show", "--gpu", "h100-sxm"],
            "calibrate show: unrecognized arguments: --gpu (see disaggsim calibrate show --help)",
        ),
        (
            [
                "cost",
                "op",
                "gemm",
                "--gpu",
                "h100-sxm",
                "--m",
                "1",
                "--n",
                "1",
                "--k",
                "1",
                "--bogus",
                "3",
            ],
            "cost op gemm: unrecognized arguments: --bogus 3 (see disaggsim cost op gemm --help)",
        ),  # fmt: skip
        (
            ["sweep", "a.yaml", "b.yaml", "--param", "x=1"],
            "sweep: unrecognized arguments: b.yaml (see disaggsim sweep --help)",
        ),
        # bench printed "disaggsim bench: --num-requests: must be >= 1" (not the error
        # line's form), and a count over the request bound named a "<scenario>" field
        (["bench", "--num-requests", "0"], "bench: --num-requests 0: must be from 1 to 2,000,000"),
        (
            ["bench", "--num-requests", "99999999999"],
            "bench: --num-requests 99999999999: must be from 1 to 2,000,000",
        ),
        (
            ["bench", "--scale", "--gpus", "40", "--num-requests", "-3"],
            "bench: --num-requests -3: must be from 1 to 2,000,000",
        ),
    ],
)
def test_flag_errors_name_their_command(tmp_path, monkeypatch, capsys, argv, line):
    monkeypatch.chdir(tmp_path)
    rc = main(argv)
    captured = capsys.readouterr()
    assert rc == 2, captured.err
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("disaggsim: error: " + line), captured.err
    assert list(tmp_path.iterdir()) == []
