"""Installed code stands alone: nothing in disaggsim/ defaults to a path of the source
checkout, and ``calibration`` (checkout-only, not installed) is reached only through
``disaggsim calibrate``, which outside a checkout stops with one line."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys

from disaggsim.cli.calibrate import OUTSIDE_CHECKOUT
from tests.conftest import REPO

PACKAGE = REPO / "disaggsim"
# the one place that looks for the checkout (on purpose, and only for `calibrate`)
CHECKOUT_LOOKUP = PACKAGE / "cli" / "calibrate.py"


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def test_no_checkout_relative_paths_in_the_package():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
                if id(node) not in docs and ("../" in text or text.startswith("calibration/")):
                    found.append(f"{where}: {text[:60]!r}")
            # a path walked up from the package's own files
            if isinstance(node, ast.Attribute) and node.attr in ("parents", "parent"):
                src = ast.unparse(node)
                if "__file__" in src and path != CHECKOUT_LOOKUP:
                    found.append(f"{where}: {src}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("calibration"):
                if path != CHECKOUT_LOOKUP:
                    found.append(f"{where}: imports {node.module}")
    assert found == []


def test_calibrate_outside_a_checkout_is_one_line(tmp_path):
    # the package alone, as an install puts it: no calibration/ beside it
    shutil.copytree(
        PACKAGE, tmp_path / "site" / "disaggsim", ignore=shutil.ignore_patterns("__pycache__")
    )
    code = (
        "import sys; sys.modules['calibration'] = None\n"  # nor anywhere else on the path
        "from disaggsim.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"}
    for argv in (["calibrate", "show", "h100-sxm"], ["calibrate", "--device", "cpu", "--out", "x"]):
        out = subprocess.run(
            [sys.executable, "-c", code, *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
        assert out.returncode == 2, out.stderr
        assert out.stderr.splitlines() == [f"disaggsim: error: {OUTSIDE_CHECKOUT}"]
        assert not (tmp_path / "x").exists()
    # the rest of the CLI works there
    out = subprocess.run(
        [sys.executable, "-c", code, "cost", "kv", "--model", "llama-3-8b", "--tokens", "16"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
