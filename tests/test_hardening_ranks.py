"""Under `torchrun ... -m singlecard_nb --device cpu --save`, each process forms a world of one:
its rows still carry the launcher's rank, before and after destroy_process_group(), and a
comparison with nothing to compare says so instead of "all ranks agree"."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd

import singlecard_nb as scn
from singlecard_nb import job

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    from torch import nn

    dist.init_process_group("nccl")  # written for GPUs; gloo on the pinned CPU
    # one string, so that the two ranks' lines cannot interleave inside it on the shared stdout
    print(f"world {dist.get_rank()} {dist.get_world_size()}", flush=True)
    torch.manual_seed(dist.get_rank())  # DDP's first broadcast makes the ranks' weights one
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(),
                                                              nn.Linear(8, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
    dist.destroy_process_group()
    model.module(torch.randn(3, 4)).sum().backward()  # a step after the group is gone
    optimizer.step()
""")


def test_each_ranks_file_holds_its_own_launchers_rank(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "singlecard_nb", "--device", "cpu", "--params", "--save",
         str(tmp_path / "run.db"), str(script)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = sorted(p.name for p in tmp_path.glob("run*.db"))
    assert files == ["run.rank0.db", "run.rank1.db"]
    for rank in (0, 1):
        frame = scn.load(tmp_path / f"run.rank{rank}.db")
        assert set(frame["rank"]) == {rank}  # rank 1's rows were labelled 0
        assert sorted(set(frame["step"])) == [0, 1, 2]
    merged = scn.load(tmp_path / "run.db")
    assert sorted(set(merged["rank"])) == [0, 1]
    # one job of two ranks on the pinned device, as torchrun on two GPUs: DDP kept them equal
    # while the group lived; the step after it, each rank alone on its own data, differs
    assert "world 0 2" in done.stdout and "world 1 2" in done.stdout, done.stdout
    verdict = scn.compare_ranks(merged)
    assert verdict.first.step == 2 and verdict.first.io in ("param", "step_grad"), repr(verdict)


def test_a_comparison_of_ranks_that_compared_no_row_says_so(tmp_path):
    frame = pd.DataFrame({"step": [0, 0], "module": ["", ""], "type": ["Net", "Net"],
                          "call": [0, 0], "io": ["output", "output"], "index": ["", ""],
                          "shape": [(2,), (2,)], "dtype": ["float32"] * 2,
                          "device": ["cpu"] * 2, "mean": [1.0, 1.0], "std": [0.0, 0.0],
                          "min": [1.0] * 2, "max": [1.0] * 2, "absmax": [1.0] * 2,
                          "nan": [0, 0], "inf": [0, 0], "zeros": [0.0] * 2, "rank": [0, 1],
                          "training": [True, True]})
    # inputs=False: only parameter rows count, and there are none
    verdict = repr(scn.compare_ranks(frame, inputs=False))
    assert "agree" not in verdict and verdict.startswith("nothing compared across the 2 ranks")


def test_the_launchers_rank_outlives_the_world_of_one(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert job.place() == (1, 2)
    monkeypatch.setenv("RANK", "one")  # no number: not believed
    assert job.place() == (0, 1)
