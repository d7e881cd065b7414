"""`benchmarks/bench.py --quick` runs end to end and prints every table with its ratio columns;
the other benchmarks' own machinery (step_cost's timers, per_call's device path, the step clock
of real_scripts) works.

A smoke test, in seconds: the script's own code (harness, report, every variant and extra
table) runs unchanged on two tiny stand-in models, so it checks that the benchmark works, not
what it measures. The real figures come from `python benchmarks/bench.py` (benchmarks/README.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"

# The script with its models swapped for tiny ones under the same keys (the extras look models
# up by key: "mlp5000" for the per-call and attach rows, "resnet" for the reduction table).
TINY_RUN = textwrap.dedent("""
    import sys
    sys.path[:0] = [{bench!r}, {root!r}]
    import torch
    from torch import nn

    import models

    def tiny_cnn():
        model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10))
        return model, torch.randn(2, 3, 8, 8)

    def tiny_mlp():
        return nn.Sequential(*[m for _ in range(10) for m in (nn.Linear(16, 16), nn.ReLU())]), \\
            torch.randn(4, 16)

    models.MODELS = {{"resnet": tiny_cnn, "mlp5000": tiny_mlp}}
    models.mlp5000 = tiny_mlp
    models.LABELS = {{"resnet": "tiny CNN", "mlp5000": "tiny MLP"}}
    import bench
    # Each repetition starts with an untimed gc.collect(), which walks every object torch and
    # the peer tools made at import (0.35 s each, 9 s of this run): frozen, they are not walked.
    # What the smoke test checks, that every table prints, does not depend on it.
    import gc, torch._dynamo, torchinfo, torchlens  # noqa: E401
    gc.freeze()
    sys.exit(bench.main(["--quick", "--reps", "2", "--models", "resnet,mlp5000"]))
""")

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
RATIO_COLUMNS = ("median ms", "ratio", "IQR/2", "min ms", "min ratio", "target", "result")


@pytest.mark.slow
def test_bench_quick_prints_every_table_with_ratios():
    pytest.importorskip("torchinfo")
    pytest.importorskip("torchlens")
    code = TINY_RUN.format(bench=str(BENCH), root=str(ROOT))
    # about 20 s on a busy 2-core machine (fresh-process import timings are most of it)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    out = p.stdout
    assert p.returncode == 0, f"bench.py --quick failed ({p.returncode}):\n{out}\n{p.stderr}"
    assert out.startswith("Machine: "), out[:200]
    lines = out.splitlines()
    header = next(ln for ln in lines if ln.startswith("model ") and "variant" in ln)
    for column in RATIO_COLUMNS:
        assert column in header, header
    for model in ("tiny CNN", "tiny MLP"):
        rows = [ln for ln in lines if ln.startswith(model)]
        for variant in VARIANTS:
            if variant == "torchlens.trace" and model == "tiny MLP":
                continue  # --quick runs torchlens on the resnet slot only
            assert any(variant in r for r in rows), f"no {variant!r} row for {model!r}:\n{out}"
        bare = next(r for r in rows if "bare forward" in r)
        assert bare.count("1.00×") == 2, bare  # ratio and min ratio of the baseline itself
        full = next(r for r in rows if r.split("  ")[0] == model and "inspect(model)  " in r)
        assert "(floor × 1.10)" in full and ("PASS" in full or "FAIL" in full), full
    # issue 40's line restated per model: the forward's ratio to the floor, grads' to a bare step
    against = lines.index(next(ln for ln in lines if ln.startswith("against the floor")))
    for model in ("tiny CNN", "tiny MLP"):
        row = next(ln for ln in lines[against:] if ln.startswith(model))
        assert row.count("×") == 6 and row.count("PASS") + row.count("FAIL") == 2, row
    for extra in ("µs added per small module call", "attach+detach on 5 000 modules",
                  "`import torch`", "`import singlecard_nb`", "aminmax", "std_mean",
                  "one-pass kernel (inspect, all statistics)", "statistics of one forward",
                  "single-card mode: median (ratio; min ratio)", "real DDP, world of one"):
        assert extra in out, f"{extra!r} missing:\n{out}"
    assert "variant errors: 0" in out, out
    assert "ERROR" not in out, out


def test_step_cost_inside_times_both_places_and_leaves_them_as_they_were():
    """`step_cost.py --inside` prints the pre-hook's and the loss's time for both inspected
    variants, and the methods it times are torch's and ours again afterwards (a second run in
    the same process would otherwise time its own timers)."""
    code = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(BENCH)!r}, {str(ROOT)!r}]
        sys.argv = ["step_cost.py", "--inside", "--steps", "25"]
        from singlecard_nb.inspection.recording import calls, recorder
        before = (calls.CallTracker.on_root_pre, recorder.Recorder.record_loss)
        import step_cost
        step_cost.main()
        after = (calls.CallTracker.on_root_pre, recorder.Recorder.record_loss)
        print("restored", before == after)
    """)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, f"step_cost.py --inside failed:\n{p.stdout}\n{p.stderr}"
    lines = p.stdout.splitlines()
    for variant in ("--inspect ", "--inspect --grads --params"):
        row = next(ln for ln in lines if ln.startswith(variant))
        pre, loss = (float(row.split(place)[1].split("µs")[0]) for place in
                     ("on_root_pre", "record_loss"))
        assert pre > 0 and loss > 0, row  # both places ran on every timed step
    assert "restored True" in lines, p.stdout


def test_per_call_device_path_counts_the_operations_of_an_accelerators_output():
    """`per_call.py --device-path` prints, per module output on an accelerator's path, the
    operations that launch a kernel (counted on "meta", without a GPU) and the overhead's CPU
    time; a count back at the 15 a large output took before would show in its row."""
    p = subprocess.run([sys.executable, str(BENCH / "per_call.py"), "--device-path"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"per_call.py --device-path failed:\n{p.stdout}\n{p.stderr}"
    rows = {line.split()[0] + " " + line.split()[1]: line.split()[-2:]
            for line in p.stdout.splitlines() if line.startswith(("meta ", "cpu "))}
    assert set(rows) == {"meta large", "meta small", "cpu 16"}, p.stdout
    assert float(rows["meta large"][0]) < 9, p.stdout
    assert float(rows["cpu 16"][1]) > 0, p.stdout


@pytest.mark.parametrize("launch", [[], ["-m", "singlecard_nb", "--device", "cpu", "--inspect"]],
                         ids=["plain", "terminal form"])
def test_step_clock_notes_every_optimizer_step_of_an_unchanged_script(tmp_path, launch):
    """`real_scripts.py`'s clock: every optimizer step of the script, run as python (or the
    terminal form) runs it, is noted in order, and the end comes after the last step, past
    the terminal form's findings; a clock that missed steps or stopped early would show."""
    times = tmp_path / "times.json"
    script = ROOT / "tests" / "scripts" / "corpus" / "healthy_accelerate_loop.py"
    p = subprocess.run([sys.executable, str(BENCH / "step_clock.py"), str(times), *launch,
                        str(script), "--steps", "12"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    noted = json.loads(times.read_text())
    assert len(noted["wall"]) == len(noted["cpu"]) == 12, noted
    assert noted["wall"] == sorted(noted["wall"]) and noted["end_wall"] > noted["wall"][-1]
    assert "step 11: loss" in p.stdout  # the script ran whole, its own output as it prints it
    if launch:
        assert "12 steps recorded" in p.stderr, p.stderr
