#!/usr/bin/env python
"""Speed of the inspection engine against a bare pass and against peer tools.

    python benchmarks/bench.py              # full run, about 8-10 minutes on a 2-core CPU
    python benchmarks/bench.py --quick      # smoke run (about a minute), numbers indicative
    python benchmarks/bench.py --markdown   # the same tables as markdown (for benchmarks/README.md)

Variants of one model are timed round-robin: every repetition runs each variant once, in an
order rotated by one each repetition, so that drift and noise from other processes spread over
all variants alike.  Every variant runs on its own deep copy of the model (same weights), so an
inspector can stay attached across iterations without touching the bare runs.  Reported: the
median, and the ratio of that median to the median of the bare pass of the same model and kind
(forward or training step).  See benchmarks/README.md for what each row and column means.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(ROOT), str(HERE)):  # the checkout's singlecard_nb; harness, models, report
    if path not in sys.path:
        sys.path.insert(0, path)

import harness  # noqa: E402
import models as bench_models  # noqa: E402
import report  # noqa: E402
import torch  # noqa: E402
from harness import (  # noqa: E402
    IMPORTS,
    REDUCTIONS,
    attach_detach,
    import_times,
    run_model,
    statistics_alone,
    time_reductions,
)
from report import (  # noqa: E402
    FLOOR_TARGET,
    PER_CALL_TARGET_US,
    RATIO_TARGETS,
    busy,
    machine_line,
    machine_load,
    table,
    verdict,
)

KERNEL_WAIT_S = 300  # building the one-pass kernel takes about a second; a busy machine more


def base_keys(variants) -> set[str]:
    return {v.key for v in variants if v.times}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short smoke run (about a minute)")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables")
    ap.add_argument("--models", default=",".join(bench_models.MODELS),
                    help="comma-separated subset of: " + ", ".join(bench_models.MODELS))
    ap.add_argument("--unseen", action="store_true",
                    help="only the four models not tuned on (" + ",".join(bench_models.UNSEEN)
                    + "): the forward against the floor, grads against a bare step")
    ap.add_argument("--skip", default="", help="comma-separated variant keys to leave out "
                    "(bare floor naive full every10 torchinfo torchlens train train_full "
                    "train_grads)")
    ap.add_argument("--reps", type=int, default=0, help="repetitions per model (override)")
    ap.add_argument("--no-extras", action="store_true",
                    help="skip import / attach+detach / reduction measurements")
    ap.add_argument("--gc-off", action="store_true",
                    help="disable garbage collection during each timed sample (timeit-style)")
    ap.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    ap.add_argument("--single-card", action="store_true",
                    help="only the single-card table (device remapping, world-of-one DDP)")
    args = ap.parse_args(argv)
    args.skip = {s for s in args.skip.split(",") if s} - {"bare", "train"}
    models = list(bench_models.UNSEEN) if args.unseen else [m for m in args.models.split(",") if m]
    for m in models:
        if m not in bench_models.MODELS:
            ap.error(f"unknown model {m!r}; choose from {', '.join(bench_models.MODELS)}")
    missing = [m for m in models if m in bench_models.NEEDS_TRANSFORMERS
               and importlib.util.find_spec("transformers") is None]
    models = [m for m in models if m not in missing]

    harness.GC_OFF = report.GC_OFF = args.gc_off
    torch.set_num_threads(report.THREADS)
    t_start = time.perf_counter()
    if args.single_card:
        print(machine_line("single-card mode only") + f"; load {machine_load()}\n")
        print(single_card_table(args.quick, args.markdown))
        return 0

    import singlecard_nb
    from singlecard_nb.inspection.kernel import native

    engine: Callable = singlecard_nb.inspect
    engine_note = f"singlecard_nb.inspect (singlecard_nb {singlecard_nb.__version__})"
    # Steady state: the one-pass kernel is built in the background while a session's first
    # steps run with torch reductions; those are timed in the "statistics alone" table.
    native.wait(KERNEL_WAIT_S)

    md = args.markdown
    load_start = machine_load()
    print(machine_line(engine_note, native.status()))
    if args.quick:
        print("--quick: 2 repetitions, 1 warm-up; numbers are indicative only")
    print()

    rows: list[list[str]] = []
    summary: dict[str, Any] = {}
    against_floor: dict[str, dict[str, tuple[str, str]]] = {}  # model -> the two verdicts, restated
    errors = 0
    notes: list[str] = [f"{m}: skipped, needs `transformers` (the bench extra)" for m in missing]
    for name in models:
        variants, extra = run_model(name, engine, args)
        if extra.get("global_hooks"):
            notes.append(f"{name}: a variant installed {extra['global_hooks']} global module "
                         "forward hook(s) (fire for every module in the process); parked between "
                         "its samples so the other variants do not pay for them")
        notes += extra.get("steps", [])
        base = {}
        for v in variants:
            if v.key in ("bare", "train") and v.times:
                base[v.kind] = statistics.median(v.times)
        for v in variants:
            label = bench_models.LABELS[name]
            if v.error:
                errors += 1
                rows.append([label, v.label, "0", "ERROR", "", "", "", "", "", v.error[:80]])
                continue
            if not v.times:
                rows.append([label, v.label, "0", "—", "", "", "", "", "", v.note])
                continue
            med = statistics.median(v.times)
            q = statistics.quantiles(v.times, n=4) if len(v.times) >= 2 else [med, med, med]
            ratio = med / base[v.kind] if v.kind in base else None
            summary[(name, v.key)] = (med, ratio)
            target, result = "", ""
            lo = min(v.times)
            base_lo = min(next(b.times for b in variants if b.key == ("bare" if v.kind == "fwd"
                                                                      else "train")) or [lo])
            if v.key == "full" and "floor" in base_keys(variants):
                floor_times = next(f.times for f in variants if f.key == "floor")
                floor_med = statistics.median(floor_times)
                floor_ratio = floor_med / base[v.kind]
                target = f"≤ {FLOOR_TARGET * floor_ratio:.2f}× (floor × {FLOOR_TARGET:.2f})"
                result = verdict(med / floor_med, FLOOR_TARGET)
                against_floor.setdefault(name, {})["full"] = (
                    f"{med / floor_med:.2f}× ({lo / min(floor_times):.2f}×)", result)
            elif v.key in RATIO_TARGETS:
                target = f"≤ {RATIO_TARGETS[v.key]:.2f}×"
                result = verdict(ratio, RATIO_TARGETS[v.key])
                if v.key == "train_grads":
                    against_floor.setdefault(name, {})[v.key] = (
                        f"{ratio:.2f}× ({lo / base_lo:.2f}×)", result)
            rows.append([
                label, v.label, str(len(v.times)), f"{med * 1e3:.1f}",
                f"{ratio:.2f}×" if ratio is not None else "",
                f"±{(q[2] - q[0]) / 2 / med * 100:.0f}%",
                f"{lo * 1e3:.1f}", f"{lo / base_lo:.2f}×",
                target, result + (f" ({v.note})" if v.note and result else v.note),
            ])
        print(f"[{name} done at {time.perf_counter() - t_start:.0f} s]", file=sys.stderr,
              flush=True)

    print(table(["model", "variant", "n", "median ms", "ratio", "IQR/2", "min ms", "min ratio",
                 "target", "result"],
                rows, md))
    print()
    if against_floor:
        print(floor_table(against_floor, md))
        print()

    # per-call cost, attach+detach, import
    xrows: list[list[str]] = []
    if "mlp5000" in models:
        bare = summary.get(("mlp5000", "bare"))
        for key, label in (("floor", "floor: x.sum() per output"),
                           ("naive", "naive hook: 8×.item()"),
                           ("full", "inspect(model)"), ("every10", "inspect(model, every=10)")):
            if bare and (name_key := ("mlp5000", key)) in summary:
                us = (summary[name_key][0] - bare[0]) / 5000 * 1e6
                is_target = key == "full"
                xrows.append([f"µs added per small module call, {label}", f"{us:.2f} µs",
                              f"≤ {PER_CALL_TARGET_US:.0f} µs" if is_target else "",
                              verdict(us, PER_CALL_TARGET_US) if is_target else ""])
    if not args.no_extras:
        try:
            att, det = attach_detach(engine, 3 if args.quick else 10)
            a, d = statistics.median(att), statistics.median(det)
            xrows.append(["attach (inspect()+start) on 5 000 modules", f"{a * 1e3:.1f} ms", "", ""])
            xrows.append(["detach (stop) on 5 000 modules", f"{d * 1e3:.1f} ms", "", ""])
            xrows.append(["attach+detach on 5 000 modules", f"{(a + d) * 1e3:.1f} ms",
                          "≤ 25 ms", verdict((a + d) * 1e3, 25)])
        except Exception as e:  # noqa: BLE001
            errors += 1
            xrows.append(["attach+detach on 5 000 modules", "ERROR", "≤ 25 ms",
                          f"{type(e).__name__}: {e}"[:80]])
        imp = import_times(1 if args.quick else 7)
        t_torch = statistics.median(imp["import torch"]) if imp["import torch"] else None
        for key in IMPORTS:
            if not imp.get(key):
                errors += 1
                xrows.append([f"`{key}` (fresh process)", "ERROR", "",
                              str(imp.get(key + " error", ""))[:80]])
                continue
            med = statistics.median(imp[key])
            if key == "import torch" or t_torch is None:
                xrows.append([f"`{key}` (fresh process)", f"{med:.2f} s", "", ""])
            else:
                xrows.append([f"`{key}` (fresh process)", f"{med:.2f} s",
                              "≤ torch + 0.30 s", verdict(med - t_torch, 0.30)])
    print(table(["measurement", "median", "target", "result"], xrows, md))
    print()

    if not args.no_extras:
        alone = statistics_alone(models, args.quick)
        arows = [[bench_models.LABELS[name], f"{d['floor'] * 1e3:.2f}",
                  f"{d['kernel'] * 1e3:.2f} ({d['kernel'] / d['floor']:.1f}×)",
                  f"{d['torch'] * 1e3:.2f} ({d['torch'] / d['floor']:.1f}×)"]
                 for name, d in alone.items()]
        print(table(["statistics of one forward's outputs, alone: ms (× floor)", "floor: sums",
                     "inspect (one-pass kernel)", "inspect (torch reductions)"], arows, md))
        print()
        red, shapes = time_reductions(models, args.quick)
        cols = list(shapes)
        head = ["reduction: µs per call, best of 15 (× sum)"] + [
            f"{n} {w} {'×'.join(map(str, shapes[(n, w)]))}" for n, w in cols]
        rrows = []
        for op in REDUCTIONS:
            r = [op]
            for c in cols:
                us = red[c][op] * 1e6
                r.append("n/a" if us != us else f"{us:.1f} ({red[c][op] / red[c]['sum']:.1f}×)")
            rrows.append(r)
        print(table(head, rrows, md))
        print()

    if not args.no_extras:
        print(single_card_table(args.quick, md))
        print()

    load_end = machine_load()
    print(f"Machine load (1-min average; CPU pressure over 60 s): at start {load_start}; "
          f"at end {load_end}.")
    if busy(load_start) or busy(load_end):
        print("WARNING: other processes competed for the CPU during this run; absolute times "
              "and ratios are inflated by their noise — trust the min columns more, and rerun "
              "on an idle machine before quoting numbers.")
    for n in notes:
        print(("- note: " if md else "note: ") + n)
    fails = sum(1 for r in rows + xrows if r[-1].startswith("FAIL"))
    passes = sum(1 for r in rows + xrows if r[-1].startswith("PASS"))
    print(f"targets: {passes} pass, {fails} fail; variant errors: {errors}; "
          f"total {time.perf_counter() - t_start:.0f} s")
    return 1 if errors else 0


def floor_table(against_floor: dict[str, dict[str, tuple[str, str]]], markdown: bool) -> str:
    """Issue 40's line, one row a model: the forward's ratio to the floor, grads' to a bare step
    (the verdicts of the table above, restated as the ratios they are taken on)."""
    rows = []
    for name, got in against_floor.items():
        label = bench_models.LABELS[name] + (" [unseen]" if name in bench_models.UNSEEN else "")
        full, grads = got.get("full", ("—", "")), got.get("train_grads", ("—", ""))
        rows.append([label, full[0], f"≤ {FLOOR_TARGET:.2f}×", full[1],
                     grads[0], f"≤ {RATIO_TARGETS['train_grads']:.2f}×", grads[1]])
    return table(["against the floor: median (min)", "inspect(model) ÷ floor, forward", "target",
                  "result", "train + grads=True ÷ bare step", "target", "result"], rows, markdown)


def single_card_table(quick: bool, markdown: bool) -> str:
    """Issue 8: what single-card mode's device remapping and its real DDP cost (harness)."""
    columns = ("bare", "patched", "remapping", "mode", "pass-through", "DDP")
    rows = []
    for label, figures in harness.single_card_costs(quick):
        base = figures.get("bare", figures.get("pass-through"))
        rows.append([label] + [_median_and_min(figures[c], base) if c in figures else ""
                               for c in columns])
    return table(["single-card mode: median (ratio; min ratio)", "bare (mode off)",
                  "targeted patches (on)",
                  "remapping 'cuda' -> cpu", "TorchFunctionMode", "pass-through (bare)",
                  "real DDP, world of one"], rows, markdown)


def _median_and_min(figure: tuple[float, float], base: tuple[float, float]) -> str:
    return f"{figure[0]:.2f} ({figure[0] / base[0]:.2f}×; {figure[1] / base[1]:.2f}×)"


if __name__ == "__main__":
    sys.exit(main())
