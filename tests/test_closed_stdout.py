"""Standard output closed by its reader (``disaggsim ... | head``): the command's files are
written whole, and it exits quietly with 141, the status a shell reports for a process
SIGPIPE ended (as ``yes | head``). Before, rich turned the closed pipe into exit 1 (the
status of a regression that drifted, or a validation target missed) and a plain print
was a BrokenPipeError traceback. A character the terminal's encoding lacks is printed as
an escape (it was a UnicodeEncodeError traceback)."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, SHARED_DATA, needs_kernel_tables

CHUNKED = str(REPO / "scenarios" / "ci" / "chunked.yaml")


def closed_stdout(work, *argv: str) -> tuple[int, str]:
    """``disaggsim ARGV`` whose standard output's reader has gone before it prints."""
    with subprocess.Popen(
        [sys.executable, "-m", "disaggsim", *argv],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as p:
        assert p.stdout is not None and p.stderr is not None
        p.stdout.close()  # the reader is gone: the first write fails with EPIPE
        err = p.stderr.read()
        return p.wait(timeout=300), err


@pytest.mark.parametrize(
    "argv",
    [
        ["run", CHUNKED, "--out", "r", "--no-plots", "--quiet"],  # rich's console
        ["calibrate", "show", "h100-sxm"],  # plain prints
    ],
    ids=["run", "calibrate-show"],
)
def test_a_closed_stdout_exits_quietly_with_141(work, argv):
    rc, err = closed_stdout(work, *argv)
    assert (rc, err) == (141, ""), (rc, err[-2000:])
    if argv[0] == "run":
        names = sorted(p.name for p in (work / "r").iterdir())
        assert "summary.json" in names and "requests.parquet" in names, names


def test_a_character_the_terminal_cannot_show_is_escaped(work):
    """Under ``PYTHONIOENCODING=ascii`` the sweep's last line ("2 points × 1 seed") was a
    UnicodeEncodeError traceback, exit 1, after its table was written."""
    argv = ["sweep", CHUNKED, "--param", "workload.rate_per_s=1,2", "--out", "s", "--quiet",
            "--no-plots", "--workers", "1", "--set", "sim.duration_s=10", "--set",
            "sim.warmup_s=1"]  # fmt: skip
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    p = subprocess.run([sys.executable, "-m", "disaggsim", *argv], cwd=work, env=env,
                       capture_output=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.decode("ascii").strip() == "2 runs (2 points \\xd7 1 seed) written to s/"


FULL = "/dev/full"  # every write to it fails with ENOSPC, as on a full disk
needs_full = pytest.mark.skipif(not os.path.exists(FULL), reason="no /dev/full here")


def full_stdout(work, *argv: str, stderr_full: bool = False) -> tuple[int, str]:
    """``disaggsim ARGV > /dev/full`` (with ``stderr_full``: ``2> /dev/full`` instead)."""
    with open(FULL, "w") as full:
        p = subprocess.run(
            [sys.executable, "-m", "disaggsim", *argv],
            cwd=work,
            stdout=subprocess.PIPE if stderr_full else full,
            stderr=full if stderr_full else subprocess.PIPE,
            text=True,
            timeout=300,
        )
    return p.returncode, p.stdout if stderr_full else p.stderr


@needs_full
@pytest.mark.parametrize(
    "argv, written",
    [
        # the progress bar (no --quiet): its end wrote a line break to the standard output,
        # which failed as the simulation ended: the run's result was lost, exit 2
        (["run", CHUNKED, "--out", "r", "--no-plots"], "r"),
        (["run", CHUNKED, "--out", "r", "--no-plots", "--quiet"], "r"),
        (
            [
                "sweep",
                CHUNKED,
                "--param",
                "workload.rate_per_s=1,2",
                "--out",
                "s",
                "--no-plots",
                "--workers",
                "1",
                "--set",
                "sim.duration_s=10",
                "--set",
                "sim.warmup_s=1",
            ],
            "s",
        ),
    ],  # fmt: skip
    ids=["run", "run-quiet", "sweep"],
)
def test_a_full_stdout_is_named_and_the_results_are_kept(work, argv, written):
    """``> /dev/full``: one line naming the standard output and where the results were
    written (it said only ``No space left on device``), the results whole."""
    rc, err = full_stdout(work, *argv)
    assert rc == 2, err[-2000:]
    assert err == (
        "disaggsim: error: standard output: could not write what the command prints "
        f"(No space left on device); the results were written to {written}/\n"
    ), err[-2000:]
    names = sorted(p.name for p in (work / written).iterdir())
    assert ".disaggsim-result.json" in names and len(names) >= 3, names
    assert not (work / f"{written}.partial").exists()
    assert sorted(p.name for p in work.iterdir()) == sorted(["keep.txt", written])


@needs_full
def test_a_full_stdout_of_a_command_writing_no_file_is_named(work):
    rc, err = full_stdout(work, "calibrate", "show", "h100-sxm")
    assert (rc, err) == (
        2,
        "disaggsim: error: standard output: could not write what the command prints "
        "(No space left on device)\n",
    )


@needs_full
def test_a_full_stderr_keeps_the_exit_status(work):
    """``2> /dev/full``: the error line cannot be shown, the status still says bad input
    (it was an OSError traceback's 1)."""
    rc, out = full_stdout(work, "run", "nope.yaml", stderr_full=True)
    assert (rc, out) == (2, "")


H200_RAW = str(REPO / "calibration" / "runs" / "h200-2026-11-29")


@needs_full
def test_a_full_stdout_after_a_fitted_profile_says_where_it_is(work):
    rc, err = full_stdout(
        work, "calibrate", "fit", H200_RAW, "--gpu", "h200-sxm", "--out", "p.json"
    )
    assert (rc, err) == (
        2,
        "disaggsim: error: standard output: could not write what the command prints "
        "(No space left on device); the results were written to p.json\n",
    )
    assert (work / "p.json").is_file()


@needs_full
@needs_kernel_tables
@pytest.mark.slow
def test_a_full_stdout_does_not_lose_the_validation_doc(work):
    """``calibrate validate --write-doc`` printed its report before writing the doc: with
    the standard output refused, the 40 s of work were lost (exit 2, no doc)."""
    rc, err = full_stdout(
        work, "calibrate", "validate", "--gpu", "a100-80gb", "--data",
        str(SHARED_DATA), "--write-doc", "v.md",
    )  # fmt: skip
    assert rc == 2, err[-2000:]
    assert err.endswith("the results were written to v.md\n"), err[-2000:]
    assert (work / "v.md").read_text().startswith("# Validation: cost model vs measurements")


def _every_command() -> list[list[str]]:
    """``[]``, ``["run"]``, ``["cost", "op", "gemm"]``, ...: every parser of the command
    line, read from the parser itself (a command added later is covered too)."""
    import argparse

    from disaggsim.cli import build_parser

    found: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        found.append(prefix)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*prefix, name])

    walk(build_parser(), [])
    return found


class _RefusingStdout(io.StringIO):
    """A standard output every write to which fails as on a full disk."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_help_that_cannot_be_written_is_said_for_every_command(monkeypatch, capsys):
    """``disaggsim ... --help > /dev/full`` exited 0 (argparse drops a write the system
    refuses), for the top level and every command; ``--version`` too."""
    from disaggsim.cli import main

    commands = _every_command()
    assert len(commands) >= 15, commands  # the top level, 8 commands and their subcommands
    for argv in [*(c + ["--help"] for c in commands), ["--version"]]:
        monkeypatch.setattr(sys, "stdout", _RefusingStdout())
        rc = main(argv)
        err = capsys.readouterr().err
        assert (rc, err) == (
            2,
            "disaggsim: error: standard output: could not write what the command prints "
            "(No space left on device)\n",
        ), argv


@needs_full
@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["--version"]])
def test_help_to_a_full_disk_exits_2(work, argv):
    rc, err = full_stdout(work, *argv)
    assert (rc, err) == (
        2,
        "disaggsim: error: standard output: could not write what the command prints "
        "(No space left on device)\n",
    )


def test_help_to_a_closed_pipe_exits_quietly_with_141(work):
    rc, err = closed_stdout(work, "run", "--help")
    assert (rc, err) == (141, "")
