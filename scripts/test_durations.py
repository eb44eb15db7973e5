"""Write tests/durations.json, the seconds each test file takes, from a pytest run's
``--durations=0`` report; tests/conftest.py hands the longest files to the test workers
first. Run from the repository root:

    .venv/bin/python -m pytest -q --durations=0 > /tmp/durations.log
    python scripts/test_durations.py /tmp/durations.log

A file's seconds are the sum of its tests' setup, call and teardown times as that report
gives them (wall time on a worker of the run). Reads the report only; runs nothing.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s+(?:setup|call|teardown)\s+(\S+?)::")
OUT = Path(__file__).resolve().parents[1] / "tests" / "durations.json"


def file_seconds(report: str) -> dict[str, float]:
    """Seconds per test file in a ``--durations`` report, summed over its tests' phases."""
    seconds: dict[str, float] = {}
    for line in report.splitlines():
        m = LINE.match(line)
        if m:
            seconds[m.group(2)] = seconds.get(m.group(2), 0.0) + float(m.group(1))
    return seconds


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/test_durations.py REPORT (pytest --durations=0 output)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        report = Path(argv[0]).read_text()
    except OSError as e:
        print(f"test_durations: cannot read {argv[0]}: {e.strerror}", file=sys.stderr)
        return 2
    seconds = file_seconds(report)
    if not seconds:
        print(f"test_durations: {argv[0]} holds no --durations lines", file=sys.stderr)
        return 2
    table = {f: round(s, 1) for f, s in sorted(seconds.items())}
    OUT.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{OUT.relative_to(OUT.parents[1])}: {len(table)} files, {sum(table.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
