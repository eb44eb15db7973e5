"""Shared test helpers: paths to the project and to the public data beside it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (derandomize): the suite passes or
# fails on the code, never on the draw. `DISAGGSIM_HYPOTHESIS=explore` draws new examples
# (and keeps failing ones in .hypothesis/) for a search beyond the suite.
settings.register_profile("suite", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("DISAGGSIM_HYPOTHESIS", "suite"))

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
# tests that read the public kernel tables (shared/data/kernels)
needs_kernel_tables = pytest.mark.skipif(
    not (SHARED_DATA / "kernels").is_dir(),
    reason=f"public kernel tables absent at {SHARED_DATA / 'kernels'}",
)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"public data folder {SHARED_DATA} is absent")
    return SHARED_DATA


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    """The current folder of a user who runs disaggsim: empty but for one file of theirs,
    ``keep.txt``, which no command may touch."""
    w = tmp_path / "work"
    w.mkdir()
    (w / "keep.txt").write_text("a user's file\n")
    monkeypatch.chdir(w)
    return w
