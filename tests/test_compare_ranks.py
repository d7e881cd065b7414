"""A real two-process DDP job (torchrun, gloo on the CPU) recorded on every rank.

notebooks/scripts/ddp_compare.py trains a small DDP model with scn.inspect(params=True) on each
rank, gathers every rank's rows (insp.frame(ranks="all")), runs scn.compare_ranks(insp) inside
the job and saves one file per rank. Here: the job is clean, or one rank is planted out of step;
then the saved job is loaded and compared with the same script run in single-card mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import singlecard_nb as scn

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "notebooks" / "scripts" / "ddp_compare.py"

pytestmark = pytest.mark.slow


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDA_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = "1"
    return env


def torchrun(out: Path, *args: str) -> list[str]:
    """The command that runs the script as a real 2-process job."""
    # --standalone: the rendezvous takes a free port itself, so parallel runs never collide
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node=2", str(SCRIPT), "--out", str(out), *args]


def single_card(out: Path, *args: str) -> list[str]:
    """The same script in a fresh process under single-card mode (what %run does in a notebook)."""
    code = ("import runpy, sys; import singlecard_nb as scn; scn.pin('cpu'); "
            f"sys.argv = [{str(SCRIPT)!r}, '--out', {str(out)!r}, *{list(args)!r}]; "
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    return [sys.executable, "-c", code]


def run_together(commands: dict[str, list[str]]) -> dict[str, dict]:
    """Run the commands at once (most of each is starting Python and torch, which two cores
    share well); rank 0's summary of each."""
    started = {name: subprocess.Popen(command, env=_environment(), cwd=ROOT, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for name, command in commands.items()}
    results = {}
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=240)
        assert process.returncode == 0, f"{name}: " + stdout[-3000:] + stderr[-3000:]
        results[name] = _result(stdout)
    return results


def _result(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, stdout  # only rank 0 prints
    return json.loads(lines[0][len("RESULT "):])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("ddp")
    results = run_together({"clean": torchrun(base / "clean"),
                            "param": torchrun(base / "param", "--desync", "param"),
                            "single": single_card(base / "single"),
                            # every rank reads the same batches: the forward pass is compared too
                            "dropout": torchrun(base / "dropout", "--desync", "dropout",
                                                "--same-data", "--dropout", "0.2")})
    return {name: (base / name, result) for name, result in results.items()}


def test_frame_ranks_all_gathers_both_ranks_inside_the_job(runs):
    out, result = runs["clean"]
    assert result["world_size"] == 2
    assert result["gathered_ranks"] == [0, 1]
    assert result["gathered_rows"] == 2 * result["own_rows"] > 0
    # a clean DDP job: parameters and step gradients agree on every rank, bit for bit
    assert result["differing_ranks"] == [] and result["first"] is None
    assert any("inputs differ at 6 of 6 steps" in n for n in result["notes"])


def test_compare_ranks_in_the_job_finds_a_parameter_updated_outside_ddp(runs):
    _, result = runs["param"]
    assert result["differing_ranks"] == [1]
    # rank 1 scaled module.0's weight after step 2's optimiser step: step 3 is the first step
    # whose parameters differ (the all-reduced gradient is still the same on both)
    assert result["first"] == {"step": 3, "module": "module.0", "io": "param",
                               "index": "weight", "stat": result["first"]["stat"], "rank": 1}


def test_saved_job_loads_with_both_ranks_and_finds_the_same_desync(runs):
    out, result = runs["param"]
    assert sorted(p.name for p in out.iterdir()) == ["rank0.db", "rank1.db"]
    job = scn.load(out)
    assert sorted(job["rank"].unique()) == [0, 1]
    first = scn.compare_ranks(job).first
    assert (first.rank, first.step, first.module, first.io) == (1, 3, "module.0", "param")


def test_param_grad_is_each_ranks_own_and_step_grad_the_all_reduced_one(runs):
    job = scn.load(runs["clean"][0])
    rank0, rank1 = job[job["rank"] == 0], job[job["rank"] == 1]
    local = scn.compare(rank0[rank0["io"] == "param_grad"], rank1[rank1["io"] == "param_grad"])
    reduced = scn.compare(rank0[rank0["io"] == "step_grad"], rank1[rank1["io"] == "step_grad"],
                          rtol=0, atol=0)
    assert local.first is not None  # before the all-reduce: each rank's own data
    assert reduced.first is None and reduced.counts["compared"] == 24


def test_the_job_computes_what_one_card_computes_with_the_global_batch(runs):
    single_out, single = runs["single"]
    assert single["world_size"] == 1 and single["gathered_ranks"] == [0]
    cmp = scn.compare(runs["clean"][0], single_out)
    assert cmp.first is None
    compared = cmp.frame().query("status == 'compared'")
    assert set(compared["io"]) == {"param", "step_grad", "update"}
    assert set(compared["rank_a"]) == {0, 1}  # each rank of the job against the one card
    notes = "\n".join(cmp.notes)
    assert "a holds ranks [0, 1] and b [0]" in notes
    assert "param_grad tensors not compared" in notes
    assert "shape differs in" in notes and "(16, 20) vs (32, 20)" in notes
    # and the planted desync is a divergence from the single card too
    assert scn.compare(runs["param"][0], single_out).first.rank in (0, 1)


def test_a_dropout_seed_that_differs_shows_at_the_dropout(runs):
    _, result = runs["dropout"]
    assert result["differing_ranks"] == [1]
    assert result["first"]["step"] == 0 and result["first"]["module"] == "module.2"
    assert result["first"]["io"] == "output" and result["notes"] == []
