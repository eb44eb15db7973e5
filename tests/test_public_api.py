"""The package's public API is exactly what ``disaggsim.__all__`` says (httpx's
test_exported_members idea: submodules aside, every public name is exported and every
exported name is defined in disaggsim), and ``disaggsim --version`` reports it."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from types import ModuleType

import disaggsim
from disaggsim.cli import main

EXPECTED = [
    "CompareResult",
    "DaskExecutor",
    "GoodputResult",
    "LoadedScenario",
    "ProcessExecutor",
    "Scenario",
    "SerialExecutor",
    "SimulationResult",
    "Summary",
    "UserError",
    "__version__",
    "compare",
    "goodput",
    "load_scenario",
    "simulate",
    "sweep",
    "write_results",
]


def test_all_is_sorted_and_exactly_the_public_names():
    assert disaggsim.__all__ == EXPECTED
    assert disaggsim.__all__ == sorted(disaggsim.__all__)
    public = {
        name
        for name, value in vars(disaggsim).items()
        if not name.startswith("_") and not isinstance(value, ModuleType)
    }
    assert public | {"__version__"} == set(disaggsim.__all__)


def test_exported_objects_come_from_the_package():
    for name in disaggsim.__all__:
        obj = getattr(disaggsim, name)
        if name != "__version__":
            assert obj.__module__.startswith("disaggsim."), name


def test_the_documented_import_works_in_a_fresh_interpreter():
    code = (
        "from disaggsim import load_scenario, simulate, sweep\n"
        "import disaggsim\n"
        "ns = {}\n"
        "exec('from disaggsim import *', ns)\n"
        "print(sorted(k for k in ns if k != '__builtins__'))\n"
        "print(callable(sweep), sweep is disaggsim.sweep)\n"
        "from disaggsim.sweep import goodput, SerialExecutor\n"  # the package still imports
        "print(goodput is disaggsim.goodput)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines[0] == str(sorted(EXPECTED))
    assert lines[1:] == ["True True", "True"]


def test_version(capsys):
    assert disaggsim.__version__ == version("disaggsim")
    try:
        main(["--version"])
    except SystemExit as e:
        assert e.code == 0
    assert capsys.readouterr().out.strip() == f"disaggsim {version('disaggsim')}"
