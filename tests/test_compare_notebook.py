"""notebooks/compare_runs.ipynb runs headless in a real kernel: both stories, with their answers."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import notebook_runner

ROOT = Path(__file__).resolve().parent.parent
MACHINE = Path(__file__).with_name("browser_machine.json")

pytestmark = pytest.mark.slow


def test_compare_runs_notebook_shows_both_stories():
    report = notebook_runner().execute(ROOT / "notebooks" / "compare_runs.ipynb", machine=str(MACHINE),
                               timeout=300)
    assert report.errors == [], str(report)
    assert report.output_kinds["image/png"] >= 1, str(report)
    html = "".join(o["data"]["text/html"] for cell in report.nb.cells
                   for o in cell.get("outputs", []) if "text/html" in o.get("data", {}))
    text = "".join(o.get("text", "") for cell in report.nb.cells for o in cell.get("outputs", []))
    # runs: fp32 against bf16, the precision-sensitive layer named first
    assert "first divergence: step 0, &#x27;2&#x27; (Cancel) output" in html
    # ranks: a clean 2-rank torchrun job, a planted desync, and the job against one card
    assert text.count('"gathered_ranks": [0, 1]') == 2
    assert "all 2 ranks agree with rank 0" in html
    assert ("rank 0 and rank 1 differ (two ranks: no majority says which one is wrong); "
            "first divergence: step 3, "
            "&#x27;module.0&#x27; (Linear) param weight") in html
    assert "a holds ranks [0, 1] and b [0]" in html and "agree within rtol=0.001" in html
