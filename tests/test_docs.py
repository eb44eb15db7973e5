"""The README and docs/*.md say what runs: every fenced block names its language, every
Python block runs as a plain script (``python norun`` marks the few that cannot), the
README example also runs in Jupyter, and every ``disaggsim`` command in a shell block
parses with the real argument parser and names scenario files that exist."""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from disaggsim.cli import build_parser
from tests.conftest import REPO, SHARED_DATA

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LANGUAGES = {"python", "bash", "sh", "console", "yaml", "json", "text"}
SHELL = {"bash", "sh", "console"}
FENCE = re.compile(r"^```(.*)$")
# a line that runs disaggsim: optional VAR=value prefixes, a path, or python -m disaggsim
COMMAND = re.compile(r"^([A-Z_]+=\S+\s+)*(\S*/)?(disaggsim|python3? -m disaggsim)(\s|$)")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence
    info: tuple[str, ...]  # the fence's info string, split
    body: str

    @property
    def id(self) -> str:
        return f"{self.path.name}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    lines = path.read_text().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j] != "```":
            j += 1
        assert j < len(lines), f"{path.name}:{i + 1}: unclosed fence"
        out.append(Block(path, i + 1, tuple(m.group(1).split()), "\n".join(lines[i + 1 : j])))
        i = j + 1
    return out


BLOCKS = [b for p in DOCS for b in fenced_blocks(p)]
PYTHON = [b for b in BLOCKS if b.info[:1] == ("python",)]
RUNNABLE = [b for b in PYTHON if "norun" not in b.info]
README_EXAMPLE = next(b for b in RUNNABLE if b.path.name == "README.md")


def test_every_fence_names_its_language():
    unnamed = [b.id for b in BLOCKS if not b.info or b.info[0] not in LANGUAGES]
    assert unnamed == [], f"fences without one of {sorted(LANGUAGES)}: {unnamed}"


def test_few_python_blocks_are_marked_not_runnable():
    assert len(RUNNABLE) >= 3 and len(PYTHON) - len(RUNNABLE) <= 2


def _env() -> dict[str, str]:
    env = dict(os.environ, MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
def test_python_block_runs_as_a_script(block, tmp_path):
    if "../shared" in block.body and not SHARED_DATA.is_dir():
        pytest.skip(f"public data folder {SHARED_DATA} is absent")
    script = tmp_path / "example.py"  # a plain script: no main guard added
    script.write_text(block.body + "\n")
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, f"{block.id}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"


def test_the_readme_example_prints_its_sweep(tmp_path):
    assert "if __name__" not in README_EXAMPLE.body
    assert "from disaggsim import load_scenario, simulate, sweep" in README_EXAMPLE.body


@pytest.mark.slow
def test_the_readme_example_runs_in_jupyter():
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nb.cells = [nbformat.v4.new_code_cell(README_EXAMPLE.body)]
    old = dict(os.environ)
    os.environ.update(_env())  # the kernel is a fresh process: this checkout first
    try:
        client = NotebookClient(
            nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
        )
        client.execute()  # raises CellExecutionError on an error
    finally:
        os.environ.clear()
        os.environ.update(old)
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert "slo_attainment" in text and "30" in text


def _commands(block: Block) -> list[list[str]]:
    """argv (after ``disaggsim``) of every ``disaggsim`` command in a shell block."""
    text = re.sub(r"\\\n\s*", " ", block.body)  # join continued lines
    out = []
    for line in text.split("\n"):
        line = line.strip()
        if block.info[0] == "console":
            if not line.startswith("$ "):
                continue  # output
            line = line[2:]
        for part in re.split(r"&&|;|\|", line):
            if not COMMAND.match(part.strip()):
                continue  # not a disaggsim command (python -c "..." blocks, pip, ...)
            words = shlex.split(part, comments=True)
            while words and re.match(r"^[A-Z_]+=", words[0]):
                words = words[1:]  # VAR=value prefixes
            if words[:3] in (["python", "-m", "disaggsim"], [sys.executable, "-m", "disaggsim"]):
                words = ["disaggsim", *words[3:]]
            if words and Path(words[0]).name == "disaggsim":
                out.append(words[1:])
    return out


COMMANDS = [(b, argv) for b in BLOCKS if b.info[:1] and b.info[0] in SHELL for argv in _commands(b)]


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 20
    assert {argv[0] for _, argv in COMMANDS} >= {"run", "sweep", "compare", "plan", "cost"}


@pytest.mark.parametrize(
    "block,argv", COMMANDS, ids=[f"{b.id}:{' '.join(a[:2])}" for b, a in COMMANDS]
)
def test_command_parses_and_names_existing_scenarios(block, argv, capsys):
    try:
        build_parser().parse_args(argv)
    except SystemExit as e:
        err = capsys.readouterr().err.strip().splitlines()
        pytest.fail(f"{block.id}: disaggsim {' '.join(argv)}: exit {e.code}: {err[-1:]}")
    for arg in argv:
        if re.fullmatch(r"scenarios/[a-z0-9_/*.-]+\.yaml", arg):
            assert glob.glob(str(REPO / arg)), f"{block.id}: {arg} does not exist"
