#!/usr/bin/env python
"""Prove pinning on a real NVIDIA GPU machine; prints a report, exits non-zero on any failure.

    python scripts/gpu_check.py            # ~1-3 minutes; always under 10

Each check runs in a fresh Python process, because whether CUDA has started is per process:
- the driver probe says "not started" in a fresh process and "started" right after
  `torch.cuda.is_available()`, while `torch.cuda.is_initialized()` is still False;
- a hard pin (API, `%load_ext` with SINGLECARD_NB_DEVICE, UUID prefix, auto) leaves torch with
  exactly one device whose UUID is the chosen GPU's, and a tensor lands on it;
- `cpu` hides every GPU;
- too late (driver already started): the pin is soft, selects the matching device by UUID,
  leaves the environment alone and says so;
- then the tests marked `gpu` run under pytest.
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


def fresh(code: str, **env: str) -> dict:
    """Run `code` in a new interpreter (no CUDA started) and return the JSON it prints last."""
    environ = {k: v for k, v in os.environ.items()
               if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "SINGLECARD_NB_DEVICE",
                            "SINGLECARD_NB_MACHINE")}
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ, cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
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

INSPECT_ON_GPU = """
    import json, statistics, time, warnings, torch, singlecard_nb
    from torch import nn
    singlecard_nb.pin({index})
    layer = nn.TransformerEncoderLayer(256, 4, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False).cuda()
    x = torch.randn(16, 128, 256, device="cuda")
    insp = singlecard_nb.inspect(model)
    insp.stop()

    def timed(inspected):
        if inspected:
            insp.start()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(5):
            model(x)
        insp.flush()
        torch.cuda.synchronize()
        insp.stop()
        return (time.perf_counter() - start) / 5

    bare, full = [], []
    for _ in range(8):  # interleaved against drift
        bare.append(timed(False))
        full.append(timed(True))
    insp.start()
    model(x)  # step 0
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        model(x)  # step 1 records, and moves step 0 to the host
        torch.cuda.set_sync_debug_mode("default")
    insp.stop()
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    print(json.dumps({{"bare_ms": statistics.median(bare) * 1e3,
                      "full_ms": statistics.median(full) * 1e3, "syncs": syncs,
                      "rows": len(insp.frame())}}))
"""


def main() -> int:
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
        out = fresh(INSPECT_ON_GPU.format(index=index))
        ratio = out["full_ms"] / out["bare_ms"]
        return out["syncs"] == 1, (
            f"transformer (6 layers, d256, seq 128, batch 16) forward: bare {out['bare_ms']:.2f} ms, "
            f"full statistics {out['full_ms']:.2f} ms, ratio {ratio:.2f}x; device->host "
            f"synchronisations per inspected step: {out['syncs']} (target 1)")

    check("inspection on the GPU: ratio and synchronisations per step", inspect_on_gpu)

    def gpu_tests():
        done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p",
                               "no:cacheprovider", "tests"], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
        return done.returncode == 0 and " passed" in last, f"pytest -m gpu: {last}"

    check("pytest -m gpu", gpu_tests)

    failed = [name for name, ok, _ in results if not ok]
    print(f"\n{len(results) - len(failed)}/{len(results)} checks passed in "
          f"{time.monotonic() - began:.0f}s on {target_gpu.name} (GPU {index}, {uuid})")
    for name in failed:
        print(f"  FAILED: {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
