"""What the benchmark prints: the machine line, its load, tables and verdicts on targets."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
from pathlib import Path

import torch

THREADS = 2
GC_OFF = False  # set by bench.py --gc-off; printed in the machine line


def machine_line(engine_note: str, stats_note: str = "") -> str:
    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    vers = []
    for mod in ("torchinfo", "torchlens", "transformers"):
        try:
            from importlib.metadata import version

            vers.append(f"{mod} {version(mod)}")
        except Exception:  # noqa: BLE001
            vers.append(f"{mod} missing")
    return (f"Machine: {cpu}, {os.cpu_count()} cores, torch.set_num_threads({THREADS}); "
            f"torch {torch.__version__}, Python {platform.python_version()}, {', '.join(vers)}; "
            f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}; engine: {engine_note}"
            + (f"; statistics: {stats_note}" if stats_note else "")
            + ("; GC off during samples" if GC_OFF else ""))


def machine_load() -> str:
    """Load average and CPU pressure (share of time some task waited for a CPU, last 60 s)."""
    parts = []
    with contextlib.suppress(OSError, IndexError, ValueError):
        parts.append("load " + Path("/proc/loadavg").read_text().split()[1])
    with contextlib.suppress(OSError, IndexError, ValueError):
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        parts.append("cpu pressure " + some.split("avg60=")[1].split()[0] + "%")
    return ", ".join(parts) or "unknown"


def busy(load: str) -> bool:
    with contextlib.suppress(IndexError, ValueError):
        return float(load.split("cpu pressure ")[1].rstrip("%")) > 10
    with contextlib.suppress(IndexError, ValueError):
        return float(load.split("load ")[1].split(",")[0]) > (os.cpu_count() or 1) * 0.75
    return False


def table(headers: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(headers) + " |",
                 "|" + "|".join("---" if i < 2 else "---:" for i in range(len(headers))) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    w = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
         for i, h in enumerate(headers)]
    fmt = lambda r: "  ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i])  # noqa: E731
                              for i, c in enumerate(r)).rstrip()
    return "\n".join([fmt(headers), fmt(["-" * x for x in w])] + [fmt(r) for r in rows])


def verdict(value: float | None, limit: float) -> str:
    if value is None:
        return "n/a"
    return "PASS" if value <= limit else "FAIL"


# Targets of issue 13, on every model: full statistics in a forward at most FLOOR_TARGET times
# the floor (one x.sum() per output, same run); ratios to the bare pass of the same kind below.
FLOOR_TARGET = 1.10
RATIO_TARGETS = {"train_full": 1.15, "train_grads": 1.30, "every10": 1.02}
PER_CALL_TARGET_US = 8.0  # µs added per small module call (mlp5000), full statistics
