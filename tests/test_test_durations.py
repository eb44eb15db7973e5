"""The table that orders the test files on the workers (tests/conftest.py, "How the files
are handed to the test workers") is read from a pytest report as written, and names only
files that exist."""

from __future__ import annotations

import json
import runpy

from tests.conftest import DURATIONS, REPO, SAME_WORKER

REPORT = """\
============================= slowest durations ==============================
275.72s call     tests/test_a.py::test_refit
12.50s setup    tests/test_b.py::test_x[case-1::2]
0.40s teardown tests/test_b.py::test_x[case-1::2]
3.10s call     tests/test_b.py::Group::test_y
(1000 durations < 0.005s hidden.  Use -vv to show these durations.)
2 passed in 291.70s (0:04:51)
"""


def test_a_report_is_summed_per_file():
    script = runpy.run_path(str(REPO / "scripts" / "test_durations.py"))
    got = script["file_seconds"](REPORT)
    assert got.keys() == {"tests/test_a.py", "tests/test_b.py"}
    assert abs(got["tests/test_a.py"] - 275.72) < 1e-9
    assert abs(got["tests/test_b.py"] - (12.5 + 0.4 + 3.1)) < 1e-9


def test_the_table_and_the_groups_name_existing_test_files():
    table = json.loads(DURATIONS.read_text())
    missing = [f for f in [*table, *SAME_WORKER] if not (REPO / f).is_file()]
    assert not missing, f"rerun scripts/test_durations.py (files gone: {missing})"
    assert all(s >= 0 for s in table.values())
