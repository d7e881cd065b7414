"""`benchmarks/bench.py --single-card --quick` prints the single-card cost table, every row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_single_card_table_has_a_figure_for_every_variant():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--single-card",
                           "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = {line.split("  ")[0]: line for line in done.stdout.splitlines()}
    calls = [label for label in rows if label.endswith("(µs per call)")]
    assert len(calls) == 3, done.stdout
    for label in calls + ["training step, MLP 20-64-1, batch 32 (ms)"]:
        assert rows[label].count("×)") >= 3, rows[label]  # bare, patched, mode (+ remapping)
    ddp = [line for label, line in rows.items() if "parameters), batch 64 (ms)" in label]
    assert len(ddp) == 2 and all(line.count("×)") == 2 for line in ddp), done.stdout
