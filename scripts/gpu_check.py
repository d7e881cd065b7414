#!/usr/bin/env python
"""Prove pinning on a real NVIDIA GPU machine; prints a report, exits non-zero on any failure.

    python scripts/gpu_check.py              # the checks below, then the whole test suite
    python scripts/gpu_check.py --no-suite   # the checks only: ~2-4 minutes; always under 15

Each check runs in a fresh Python process, because whether CUDA has started is per process:
- the driver probe says "not started" in a fresh process and "started" right after
  `torch.cuda.is_available()`, while `torch.cuda.is_initialized()` is still False;
- a hard pin (API, `%load_ext` with SINGLECARD_NB_DEVICE, UUID prefix, auto) leaves torch with
  exactly one device whose UUID is the chosen GPU's, and a tensor lands on it;
- `cpu` hides every GPU;
- too late (driver already started): the pin is soft, selects the matching device by UUID,
  leaves the environment alone and says so;
- inspection on the GPU: benchmarks/bench.py's ratios for two models (full statistics against
  the floor of one x.sum() per output, training steps, every=10) and the device->host
  synchronisations of one inspected step (target: one);
- the accelerator path's cost per module output (benchmarks/per_call.py --device-path);
- then the tests marked `gpu` run under pytest,
- and then the whole suite (`pytest -m "not gpu"`: everything else, on a machine whose torch
  has CUDA and a GPU; not yet timed on a GPU machine, about 8 minutes on a 2-core CPU box).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from singlecard_nb.pinning import devices  # noqa: E402  (after the path is set)

results: list[tuple[str, bool, str]] = []


def fresh(code: str, timeout: float = 180, **env: str) -> dict:
    """Run `code` in a new interpreter (no CUDA started) and return the JSON it prints last."""
    environ = {k: v for k, v in os.environ.items()
               if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "SINGLECARD_NB_DEVICE",
                            "SINGLECARD_NB_MACHINE")}
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def check(name: str, fn) -> None:
    start = time.monotonic()
    try:
        ok, detail = fn()
    except Exception as e:  # a broken check is a failed check, reported with its cause
        ok, detail = False, f"{type(e).__name__}: {e}"
    results.append((name, ok, detail))
    print(f"[{'PASS' if ok else 'FAIL'}] {name} ({time.monotonic() - start:.1f}s)\n       {detail}",
          flush=True)


def same_uuid(a: str, b: str) -> bool:
    def bare(u: str) -> str:
        u = u.strip().lower()
        return u[4:] if u.startswith(("gpu-", "mig-")) else u

    return bare(a) == bare(b)


PROBE = """
    import json, sys
    from singlecard_nb.pinning import driver
    before = driver.driver_state()
    import torch
    after_import = driver.driver_state()
    available = torch.cuda.is_available()
    after = driver.driver_state()
    print(json.dumps({"before": before.started, "after_import": after_import.started,
                      "available": available, "after": after.started, "how": after.how,
                      "torch_initialised": torch.cuda.is_initialized()}))
"""

HARD_API = """
    import json, os, torch, singlecard_nb
    state = singlecard_nb.pin({target!r})
    x = torch.ones(3, device=singlecard_nb.device()) * 2
    print(json.dumps({{"mode": state.mode, "uuid": state.uuid, "count": torch.cuda.device_count(),
                      "torch_uuid": str(torch.cuda.get_device_properties(0).uuid),
                      "on": str(x.device), "sum": float(x.sum()),
                      "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}}))
"""

HARD_AT_LOAD = """
    import json, torch
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "singlecard_nb")
    import singlecard_nb
    state = singlecard_nb.current()
    print(json.dumps({"mode": state.mode, "uuid": state.uuid, "count": torch.cuda.device_count(),
                      "torch_uuid": str(torch.cuda.get_device_properties(0).uuid)}))
"""

CPU = """
    import json, torch, singlecard_nb
    state = singlecard_nb.pin("cpu")
    print(json.dumps({"mode": state.mode, "hard": state.hard,
                      "available": torch.cuda.is_available(), "count": torch.cuda.device_count()}))
"""

TOO_LATE = """
    import json, os, torch, singlecard_nb
    {start}
    before_env = os.environ.get("CUDA_VISIBLE_DEVICES")
    start_device = torch.cuda.current_device()
    state = singlecard_nb.pin({index})
    current = torch.cuda.current_device()
    uuid = str(torch.cuda.get_device_properties(current).uuid)
    status = singlecard_nb.status()
    singlecard_nb.release()
    print(json.dumps({{"mode": state.mode, "hard": state.hard, "uuid": state.uuid,
                      "device": str(state.torch_device), "current": current, "torch_uuid": uuid,
                      "count": torch.cuda.device_count(), "reason": state.reason,
                      "env_same": os.environ.get("CUDA_VISIBLE_DEVICES") == before_env,
                      "status_mode": status.mode, "status_driver": status.driver_started,
                      "restored": torch.cuda.current_device() == start_device}}))
"""

STARTED_UNDER_PIN = """
    import json, torch, singlecard_nb
    from singlecard_nb import TargetError
    first = singlecard_nb.pin({index})
    torch.zeros(1, device="cuda")  # CUDA starts under the hard pin
    again = singlecard_nb.pin({index})
    refused, other = None, {other!r}
    if other is not None:
        try:
            singlecard_nb.pin(other)
        except TargetError as e:
            refused = str(e)
    print(json.dumps({{"first": first.mode, "again": again.mode, "again_hard": again.hard,
                      "refused": refused, "count": torch.cuda.device_count()}}))
"""

GPU_MODELS = ("resnet", "gpt")  # a CNN and a decoder from benchmarks/models.py
GPU_REPS = 20

DEVICE_RATIOS = """
    import json, sys, torch, singlecard_nb
    sys.path.insert(0, "benchmarks")
    singlecard_nb.pin({index})
    import device_ratios
    device = torch.device("cuda")
    out = {{}}
    for name in {models!r}:
        result = device_ratios.ratios(name, device, reps={reps})
        result["syncs"] = device_ratios.syncs_per_step(name, device)
        out[name] = result
    print(json.dumps(out))
"""


def describe_ratios(name: str, result: dict) -> tuple[bool, str]:
    """One model's line: ratios with their targets (benchmarks/report.py), and whether the
    synchronisations per inspected step are the one promised."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from report import FLOOR_TARGET, RATIO_TARGETS

    ratio, median = result["ratio"], result["median"]

    def verdict(value: float, limit: float) -> str:
        return f"{value:.2f}x (<= {limit:.2f}x: {'PASS' if value <= limit else 'FAIL'})"

    parts = [f"bare forward {median['bare'] * 1e3:.2f} ms, floor {ratio['floor']:.2f}x, "
             f"full statistics {ratio['full']:.2f}x = floor x "
             + verdict(ratio["full/floor"], FLOOR_TARGET)]
    parts += [f"{key} " + verdict(ratio[key], limit) for key, limit in RATIO_TARGETS.items()]
    parts.append(f"bare training step {median['train'] * 1e3:.2f} ms")
    parts.append(f"device->host synchronisations per inspected step: {result['syncs']} "
                 "(target 1)")
    return result["syncs"] == 1, f"{name}: " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    whole_suite = "--no-suite" not in (sys.argv[1:] if argv is None else argv)
    began = time.monotonic()
    machine = devices.read_nvml()
    print(f"singlecard_nb GPU check, python {sys.version.split()[0]}\n{machine!r}\n", flush=True)
    if not machine.gpus:
        print(f"No GPU: {machine.reason}. Nothing to check.")
        return 2
    whole = [g for g in machine.gpus if not g.mig_enabled]
    if not whole:
        print("Every GPU is in MIG mode; checks below use the first MIG device.")
    target_gpu = whole[-1] if whole else machine.gpus[0]  # the last GPU: not the default cuda:0
    index, uuid = target_gpu.index, (target_gpu.mig[0].uuid if target_gpu.mig else target_gpu.uuid)
    other = next((g.index for g in whole if g.index != index), None)

    def probe():
        out = fresh(PROBE)
        ok = (not out["before"] and not out["after_import"] and out["available"]
              and out["after"] and not out["torch_initialised"])
        return ok, (f"fresh: started={out['before']}; after import torch: {out['after_import']}; "
                    f"after is_available(): {out['after']} ({out['how']}) while "
                    f"torch.cuda.is_initialized()={out['torch_initialised']}")

    def hard(target: str | int, label: str):
        def run():
            out = fresh(HARD_API.format(target=target))
            ok = (out["mode"] == "hard" and out["count"] == 1 and out["on"] == "cuda:0"
                  and out["sum"] == 6.0 and same_uuid(out["torch_uuid"], out["uuid"]))
            return ok, (f"{label}: mode={out['mode']}, torch.cuda.device_count()={out['count']}, "
                        f"torch uuid {out['torch_uuid']} vs pinned {out['uuid']}, "
                        f"tensor on {out['on']}")
        return run

    def at_load():
        out = fresh(HARD_AT_LOAD, SINGLECARD_NB_DEVICE=target_gpu.uuid[:12])
        ok = out["mode"] == "hard" and out["count"] == 1 and same_uuid(out["torch_uuid"], out["uuid"])
        return ok, (f"%load_ext with SINGLECARD_NB_DEVICE={target_gpu.uuid[:12]}: mode={out['mode']}, "
                    f"device_count={out['count']}, torch uuid {out['torch_uuid']}")

    def cpu():
        out = fresh(CPU)
        ok = out["mode"] == "cpu" and out["hard"] and not out["available"] and out["count"] == 0
        return ok, (f"pin('cpu'): is_available()={out['available']}, "
                    f"device_count()={out['count']}")

    def too_late(start: str, label: str):
        def run():
            out = fresh(TOO_LATE.format(start=start, index=index))
            ok = (out["mode"] == "soft" and not out["hard"] and out["env_same"]
                  and out["device"] == f"cuda:{out['current']}"
                  and same_uuid(out["torch_uuid"], out["uuid"])
                  and "stay visible" in out["reason"] and out["status_mode"] == "soft"
                  and out["status_driver"] and out["restored"])
            return ok, (f"{label}: mode={out['mode']}, selected {out['device']} of "
                        f"{out['count']} visible, uuid match="
                        f"{same_uuid(out['torch_uuid'], out['uuid'])}, env untouched="
                        f"{out['env_same']}, current device restored on release="
                        f"{out['restored']}; says: {out['reason'][:160]}...")
        return run

    def started_under_pin():
        out = fresh(STARTED_UNDER_PIN.format(index=index, other=other))
        ok = (out["first"] == "hard" and out["again"] == "hard" and out["again_hard"]
              and out["count"] == 1 and (other is None or out["refused"] is not None))
        return ok, (f"re-pin after CUDA started under a hard pin: {out['again']}; other GPU "
                    f"refused: {out['refused'] or 'n/a (one GPU)'}")

    check("driver probe sees cuInit that torch does not report", probe)
    check(f"hard pin by index {index}", hard(index, f"pin({index})"))
    check("hard pin by UUID prefix", hard(uuid[:12], f"pin({uuid[:12]!r})"))
    check("hard pin auto", hard("auto", "pin('auto')"))
    check("hard pin at %load_ext (SINGLECARD_NB_DEVICE)", at_load)
    check("cpu hides every GPU", cpu)
    check("too late after torch.cuda.is_available()",
          too_late("torch.cuda.is_available()", "after is_available()"))
    check("too late after a CUDA tensor",
          too_late("torch.zeros(1, device='cuda')", "after torch.zeros(device='cuda')"))
    check("hard pin kept when CUDA starts under it", started_under_pin)

    def inspect_on_gpu():
        out = fresh(DEVICE_RATIOS.format(index=index, models=GPU_MODELS, reps=GPU_REPS),
                    timeout=400)
        lines = [describe_ratios(name, out[name]) for name in GPU_MODELS]
        return all(ok for ok, _ in lines), "\n       ".join(line for _, line in lines)

    check("inspection on the GPU: bench ratios and synchronisations per step", inspect_on_gpu)

    def device_path():
        """benchmarks/per_call.py --device-path on the chosen card: the operations and CPU time
        of each module output inspection reads there (issue 40's per-call cost on a GPU)."""
        environ = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index)}
        done = subprocess.run([sys.executable, "benchmarks/per_call.py", "--device-path"],
                              env=environ, cwd=ROOT, capture_output=True, text=True, timeout=300)
        rows = [line for line in done.stdout.splitlines() if line.startswith("cuda ")]
        return done.returncode == 0 and len(rows) == 2, "\n       ".join(
            rows or [done.stderr.strip()[-500:]])

    check("the accelerator path: operations and µs per module output", device_path)

    def pytest(marker: str, timeout: int):
        """The tests selected by `marker`: (passed, pytest's closing line)."""
        done = subprocess.run([sys.executable, "-m", "pytest", "-m", marker, "-q", "-p",
                               "no:cacheprovider", "tests"], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout)
        last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
        return done.returncode == 0 and " passed" in last, f"pytest -m {marker!r}: {last}"

    check("pytest -m gpu", lambda: pytest("gpu", 300))
    if whole_suite:
        check("the whole suite on this GPU machine", lambda: pytest("not gpu", 3600))

    failed = [name for name, ok, _ in results if not ok]
    print(f"\n{len(results) - len(failed)}/{len(results)} checks passed in "
          f"{time.monotonic() - began:.0f}s on {target_gpu.name} (GPU {index}, {uuid})")
    for name in failed:
        print(f"  FAILED: {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
