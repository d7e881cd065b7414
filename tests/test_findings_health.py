"""Issue 37's healthy corpus: unchanged training in the shape of real code (tests/scripts/corpus/
healthy_*.py), run as the README's flow runs it (`%inspect all --grads --params`, `%run
script.py --steps N`), short (5 steps) and long (300). A healthy run says nothing stands out:
no finding, none above the summary's table, and the terminal's exit line says so for every
model. A finding on a healthy run is a defect."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from findings_corpus import HEALTHY, HEALTHY_STEPS, NOTHING, left_behind, run_job

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("steps", HEALTHY_STEPS)
@pytest.mark.parametrize("job", sorted(HEALTHY))
def test_a_healthy_run_says_nothing_stands_out(job, steps):
    result = run_job(HEALTHY[job], steps)
    assert left_behind() == []
    assert result.error is None, result.explanation or result.error
    assert "nan" not in result.stdout.lower(), result.stdout  # the run itself trained sanely
    assert result.models, "no model was found"
    for model in result.models:
        assert model.findings == [], f"{model.name}: {model.findings}"
        assert "findings, likeliest cause first" not in model.summary, model.summary
        assert NOTHING in model.exit_line, model.exit_line


TERMINAL_JOBS = ("healthy_nanogpt", "healthy_accelerate_loop", "healthy_ddp")


def test_the_terminal_says_nothing_stands_out_for_healthy_scripts():
    """`python -m singlecard_nb --inspect --grads --params script.py --steps 5`, as a user types
    it: each model's exit line; the harness reads the same lines in process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for job in TERMINAL_JOBS:
        done = subprocess.run(
            [sys.executable, "-m", "singlecard_nb", "--inspect", "--grads", "--params",
             str(HEALTHY[job]), "--steps", "5"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        printed = re.findall(r"^singlecard_nb: .*? steps recorded; .*$", done.stderr, re.M)
        assert printed, done.stderr
        in_process = [m.exit_line.splitlines()[0] for m in run_job(HEALTHY[job], 5).models]
        assert printed == in_process  # what run_job reads is what the terminal prints
        for line in printed:
            assert NOTHING in line, f"{job}: {done.stderr}"


def test_a_tiny_llama_under_the_real_transformers_trainer_says_nothing_stands_out():
    """transformers' own Trainer (benchmarks/scripts/hf_trainer_llama.py, not ours to shape), as
    a user types it. The Trainer passes the model `num_items_in_batch`, one number (~250),
    which the ranking once called an input far from unit scale."""
    pytest.importorskip("transformers")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "singlecard_nb", "--device", "cpu", "--inspect", "--grads",
         "--params", str(ROOT / "benchmarks" / "scripts" / "hf_trainer_llama.py"), "--steps",
         "30"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = re.findall(r"^singlecard_nb: .*? steps recorded; .*$", done.stderr, re.M)
    assert len(printed) == 1, done.stderr[-3000:]
    assert f"LlamaForCausalLM: 30 steps recorded; {NOTHING}" in printed[0], done.stderr[-3000:]


def test_every_rank_of_a_healthy_ddp_job_says_nothing_stands_out():
    """The DDP script as torchrun runs it, two ranks on the CPU: each rank's exit line, and the
    ranks' statistics of what DDP keeps equal (parameters, all-reduced gradients) agree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "singlecard_nb", "--device", "cpu", "--inspect", "--grads", "--params",
         str(HEALTHY["healthy_ddp"]), "--steps", "40"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # one exit line per rank (the two ranks share stderr: their lines may meet on one line)
    printed = re.findall(r"singlecard_nb: \S+: \d+ steps recorded; [^(]*", done.stderr)
    assert len(printed) == 2, done.stderr[-3000:]
    for line in printed:
        assert NOTHING in line, done.stderr[-3000:]
