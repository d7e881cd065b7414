"""Per-file wall time of a pytest run, longest first, from its JUnit XML:
    ./test.sh --junitxml=/tmp/run.xml && python scripts/file_times.py /tmp/run.xml
(the order tests/conftest.py's SLOW_FILES_FIRST keeps: see there why)."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter


def file_times(path: str) -> Counter:
    seconds: Counter = Counter()
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.test_x or tests.test_x.Class
        module = next((part for part in parts if part.startswith("test_")), parts[-1])
        seconds[f"{module}.py"] += float(case.get("time", 0))
    return seconds


if __name__ == "__main__":
    times = file_times(sys.argv[1])
    total = sum(times.values())
    for name, took in times.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 25):
        print(f"{took:8.1f} s  {100 * took / total:5.1f} %  {name}")
    print(f"{total:8.1f} s  in all ({len(times)} files)")
