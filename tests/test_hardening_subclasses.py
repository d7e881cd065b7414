"""Tensor subclasses never take the process down: the one-read kernel is handed plain dense
tensors with memory only (a wrapper subclass's data_ptr() is 0: reading it was a segfault).
Each case runs in a child process, so that a crash fails the test instead of the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import fsdp2_on_cpu

ROOT = Path(__file__).resolve().parents[1]



def run(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    if code.startswith(KERNEL_READY):  # the case's own lines are indented in the test
        code = KERNEL_READY + textwrap.dedent(code[len(KERNEL_READY):])
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


KERNEL_READY = """
import json, warnings
import torch
from torch import nn
import singlecard_nb as scn
from singlecard_nb.inspection.kernel import native
native.wait(240)  # the kernel reads CPU tensors from now on (torch, where none can be built)
"""


@fsdp2_on_cpu
def test_fsdp2_with_grads_and_params_on_a_one_process_gloo_group_is_recorded():
    out = run(KERNEL_READY + """
    import os
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + os.getpid() % 300))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with scn.inspect(model, grads=True, params=True) as insp:
        for _ in range(2):
            model(torch.randn(4, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    frame = insp.frame()
    weight = frame[(frame.io == "param") & (frame.module == "0") & (frame["index"] == "weight")]
    local = model[0].weight.to_local().detach().double()
    print(json.dumps({"ios": sorted(set(frame.io)), "errors": insp.errors,
                      "param_mean": float(weight["mean"].iloc[-1]),
                      "real_mean": local.mean().item(), "shape": list(weight["shape"].iloc[-1])}))
    dist.destroy_process_group()
    """)
    assert out["errors"] == []
    assert {"output", "param", "param_grad", "step_grad"} <= set(out["ios"])
    assert abs(out["param_mean"] - out["real_mean"]) < 1e-6 and out["shape"] == [16, 8]


@fsdp2_on_cpu
def test_fsdp2_under_singlecard_cpu_is_recorded():
    out = run(KERNEL_READY + """
    import os
    from IPython.core.interactiveshell import InteractiveShell
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + os.getpid() % 300))
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "singlecard_nb")
    ip.run_line_magic("singlecard", "cpu")
    ip.user_ns.update(torch=torch, nn=nn, scn=scn)
    result = ip.run_cell(
        "import torch.distributed as dist\\n"
        "from torch.distributed.fsdp import fully_shard\\n"
        "dist.init_process_group('gloo')\\n"
        "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))\\n"
        "fully_shard(model)\\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\\n"
        "with scn.inspect(model, grads=True, params=True) as insp:\\n"
        "    model(torch.randn(4, 8)).sum().backward()\\n"
        "    opt.step()\\n"
        "dist.destroy_process_group()\\n")
    insp = ip.user_ns["insp"]
    frame = insp.frame()
    print(json.dumps({"error": repr(result.error_in_exec), "ios": sorted(set(frame.io)),
                      "errors": insp.errors, "finite": bool(frame["mean"].notna().all())}))
    """)
    assert out["error"] == "None" and out["errors"] == []
    assert {"param", "param_grad"} <= set(out["ios"]) and out["finite"]


def test_a_module_returning_a_masked_tensor_is_recorded_through_its_values():
    out = run(KERNEL_READY + """
    from torch.masked import masked_tensor
    warnings.simplefilter("ignore")

    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 20000)

        def forward(self, x):
            y = self.lin(x).detach()
            return masked_tensor(y, y > 0)

    model = Masked()
    with scn.inspect(model) as insp:
        out = model(torch.ones(1, 4))
    frame = insp.frame()
    row = frame[(frame.module == "") & (frame.io == "output")].iloc[0]
    data = out.get_data()
    kept = data[out.get_mask()].double()
    print(json.dumps({"min": float(row["min"]), "real_min": kept.min().item(),
                      "mean": float(row["mean"]), "real_mean": kept.mean().item(),
                      "errors": insp.errors}))
    """)
    assert out["errors"] == []
    assert out["min"] == out["real_min"] and out["min"] > 0  # only the values the mask keeps
    assert abs(out["mean"] - out["real_mean"]) < 1e-6


def test_fit_while_inspect_all_looks_is_no_model_and_the_real_one_keeps_its_name():
    out = run(KERNEL_READY + """
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))

        def forward(self, x):
            return self.body(x)

    model = Net()
    with scn.inspect_all():
        plan = scn.fit(model, torch.randn(4, 8))
        model(torch.randn(4, 8)).sum().backward()
    found = scn.inspectors()
    print(json.dumps({"found": list(found), "steps": found["Net"].steps_recorded,
                      "peak": plan.peak > 0}))
    """)
    assert out == {"found": ["Net"], "steps": 1, "peak": True}
