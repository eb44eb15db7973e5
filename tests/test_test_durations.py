"""The table that orders the test files on the workers (tests/conftest.py, "How the files
are handed to the test workers") is read from a pytest report as written, and names only
files that exist."""

from __future__ import annotations

import json
import runpy

from tests.conftest import DURATIONS, REPO, SAME_WORKER, unit_order

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


def test_units_are_handed_out_longest_first_each_whole():
    grouped = sorted(SAME_WORKER)[:2]  # two files of one unit (tests/conftest.py)
    assert SAME_WORKER[grouped[0]] == SAME_WORKER[grouped[1]]
    nodeids = [
        "tests/test_a.py::t1", f"{grouped[0]}::t1", "tests/test_b.py::t1",
        "tests/test_a.py::t2", "tests/test_new.py::t1", f"{grouped[1]}::t1",
        "tests/test_c.py::t1",
    ]  # fmt: skip
    seconds = {"tests/test_a.py": 10.0, "tests/test_b.py": 30.0, "tests/test_c.py": 1.0,
               grouped[0]: 12.0, grouped[1]: 20.0}  # fmt: skip
    got = [nodeids[i] for i in unit_order(nodeids, seconds)]
    # the group 12 + 20 = 32 s, then test_b 30, test_new at the median (12), test_a 10
    assert got == [
        f"{grouped[0]}::t1", f"{grouped[1]}::t1", "tests/test_b.py::t1",
        "tests/test_new.py::t1", "tests/test_a.py::t1", "tests/test_a.py::t2",
        "tests/test_c.py::t1",
    ]  # fmt: skip
