"""`benchmarks/bench.py --quick` still runs and prints a row for every model and variant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "bench.py"

MODEL_LABELS = (
    "ResNet-18-like CNN",
    "Transformer encoder 6×256",
    "2 500×(Linear16+ReLU)",
    "VGG-11-BN CNN",
    "GPT decoder 4×192",
    "HF GPT2Model",
    "HF BertModel",
)
VARIANTS = (
    "bare forward",
    "floor: x.sum() per output",
    "naive hook: 8×.item()",
    "(model)",
    "(model, every=10)",
    "torchinfo.summary",
    "torchlens.trace",
    "bare training step",
    "(model, grads=True)",
)


@pytest.mark.slow
def test_bench_quick_prints_every_model_row():
    pytest.importorskip("torchinfo")
    pytest.importorskip("torchlens")
    pytest.importorskip("transformers")
    # about a minute on an idle 2-core machine; the timeout leaves room for a busy one
    p = subprocess.run([sys.executable, str(BENCH), "--quick"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env=None)
    out = p.stdout
    assert p.returncode == 0, f"bench.py --quick failed ({p.returncode}):\n{out}\n{p.stderr}"
    assert out.startswith("Machine: "), out[:200]
    lines = out.splitlines()
    for model in MODEL_LABELS:
        rows = [ln for ln in lines if ln.startswith(model)]
        for variant in VARIANTS:
            assert any(variant in r for r in rows), f"no {variant!r} row for {model!r}:\n{out}"
        bare = next(r for r in rows if "bare forward" in r)
        assert "1.00×" in bare, bare
    for extra in ("µs added per small module call", "attach+detach on 5 000 modules",
                  "`import torch`", "`import singlecard_nb`", "aminmax", "std_mean",
                  "one-pass kernel (inspect, all statistics)", "statistics of one forward"):
        assert extra in out, f"{extra!r} missing:\n{out}"
    # every model's full-statistics row carries its target against the floor of the same run
    assert sum("(floor × 1.10)" in ln for ln in lines) == len(MODEL_LABELS), out
    assert "variant errors: 0" in out, out
    assert "ERROR" not in out, out
