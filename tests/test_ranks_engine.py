"""The ranks run on torch elastic's engine (`start_processes`, torchrun's), and what it takes for
good is given back: the notebook's signal handlers (Ctrl-C stays KeyboardInterrupt in the next
cell), its environment (each rank has exactly the plan's), its stdin; torch's stop is said in
our words, step by step. Real rank processes; nothing is left running after any of them.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
from test_ranks import _nothing_left

from singlecard_nb.ranks import launch
from singlecard_nb.ranks.run import RankJob

TAKEN = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _run(tmp_path, text: str, environ=None, **kwargs) -> tuple[list[launch.Rank], list]:
    script = tmp_path / "job.py"
    script.write_text(text)
    folder = tmp_path / "run"
    folder.mkdir()
    ranks = launch.plan(2, "cpu", str(folder), [str(script)], environ=environ)
    lines: list[tuple[int, str, str]] = []
    RankJob(ranks, str(folder), echo=lambda *line: lines.append(line), **kwargs).run()
    return ranks, lines


def _interrupted_once_started(tmp_path, script, **kwargs) -> tuple[list, list, list]:
    """Run `script` as 2 ranks and press Ctrl-C once both printed 'started'; the ranks, their
    (rank, line)s and what the stop said."""
    folder = tmp_path / "run"
    folder.mkdir()
    ranks = launch.plan(2, "cpu", str(folder), [str(script)])
    said, lines = [], []

    def echo(rank, line, stream):
        lines.append((rank, line))
        if line == "started" and sum(text == "started" for _, text in lines) == 2:
            raise KeyboardInterrupt  # Ctrl-C, as the notebook's main thread gets it

    with pytest.raises(KeyboardInterrupt):
        RankJob(ranks, str(folder), echo=echo, say=said.append, **kwargs).run()
    return ranks, lines, said


def test_the_notebooks_signal_handlers_are_given_back_so_ctrl_c_stays_keyboard_interrupt(
        tmp_path):
    def mine(signum, frame):  # the notebook's own handlers (a kernel sets some)
        raise AssertionError("not called here")

    before = {signum: signal.getsignal(signum) for signum in TAKEN}
    try:
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(signum, mine)
        ranks, lines = _run(tmp_path, "print('ran', flush=True)\n")
        assert sorted(rank for rank, line, _ in lines if line == "ran") == [0, 1]
        # torch elastic's start took all four for its SignalException: each is the notebook's
        assert {s: signal.getsignal(s) for s in TAKEN} == {
            signal.SIGTERM: mine, signal.SIGINT: before[signal.SIGINT],
            signal.SIGHUP: mine, signal.SIGQUIT: mine}
        with pytest.raises(KeyboardInterrupt):  # the next cell's Ctrl-C
            signal.raise_signal(signal.SIGINT)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    _nothing_left([ranks])


def test_each_rank_has_exactly_the_plans_environment_and_no_terminal(tmp_path, monkeypatch):
    # The notebook has variables the plan leaves out: its own pin's, a torchrun variable of
    # its own (single-card mode sets some); torch elastic would start from os.environ
    monkeypatch.setenv("SINGLECARD_NB_NOTEBOOK_ONLY", "the notebook's")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "the notebook's")
    environ = {k: v for k, v in os.environ.items() if k != "SINGLECARD_NB_NOTEBOOK_ONLY"}
    read, write = os.pipe()  # the notebook's stdin: a terminal, say
    saved = os.dup(0)
    os.dup2(read, 0)
    try:
        ranks, lines = _run(tmp_path, (
            "import json, os\n"
            "start = dict(v.split('=', 1) for v in open('/proc/self/environ').read()"
            ".split('\\0') if '=' in v)\n"
            "print(json.dumps({'environ': start, 'stdin': os.readlink('/proc/self/fd/0')}),"
            " flush=True)\n"), environ=environ)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read, write):
            os.close(fd)
    seen = {rank: json.loads(line) for rank, line, _ in lines if line.startswith("{")}
    assert sorted(seen) == [0, 1], lines
    for spec in ranks:
        started = seen[spec.rank]["environ"]
        error_file = started.pop("TORCHELASTIC_ERROR_FILE")  # torch's, for its `record`
        assert error_file.startswith(str(tmp_path / "run" / "logs"))
        assert started == dict(spec.environ)  # nothing the plan left out came back
        assert seen[spec.rank]["stdin"] == os.devnull
    # and the notebook's own environment is as it was
    assert os.environ["SINGLECARD_NB_NOTEBOOK_ONLY"] == "the notebook's"
    assert type(os.environ).__name__ == "_Environ"
    _nothing_left([ranks])


def test_a_rank_that_ignores_sigterm_is_sigkilled_after_the_grace_each_step_said(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import os, signal, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "try:\n    print('started', flush=True)\n    time.sleep(600)\n"
        "finally:\n    print('cleaned up', flush=True)\n")
    ranks, lines, said = _interrupted_once_started(tmp_path, script, grace=5.0)
    assert said == ["singlecard_nb: stopping ranks 0, 1: SIGTERM, then SIGKILL for any still "
                    "running in 5 s.",
                    "singlecard_nb: rank 1 still running after 5 s: SIGKILL."], said
    assert [rank for rank, line in lines if line == "cleaned up"] == [0], lines
    _nothing_left([ranks])


def test_ctrl_c_stops_ranks_with_dataloader_workers_without_a_traceback(tmp_path):
    # minGPT-ddp's shape: a DataLoader with workers, which die with the rank's session at the
    # SIGTERM; DataLoader's SIGCHLD handler would raise "DataLoader worker (pid ...) is killed
    # by signal: Terminated" over the rank's exit, a RuntimeError traceback in every rank
    script = tmp_path / "job.py"
    script.write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "loader = DataLoader(TensorDataset(torch.arange(100000.0)), batch_size=10,"
        " num_workers=2)\n"
        "try:\n    for epoch in range(1000):\n        for step, (x,) in enumerate(loader):\n"
        "            if epoch == step == 0:\n                print('started', flush=True)\n"
        "            torch.sin(x).sum()\n"
        "finally:\n    print('cleaned up', flush=True)\n")
    ranks, lines, said = _interrupted_once_started(tmp_path, script)
    assert len(said) == 1, said  # all ended at SIGTERM
    assert sorted(rank for rank, line in lines if line == "cleaned up") == [0, 1], lines
    # (a worker killed while it hands a batch over can still make multiprocessing's
    # resource_sharer thread print a traceback now and then: a race of the group's SIGTERM)
    assert not [line for _, line in lines
                if "killed by signal" in line or "race condition" in line], lines
    _nothing_left([ranks])


def test_a_notice_every_rank_says_is_shown_once_for_the_job(tmp_path):
    ranks, lines = _run(tmp_path, (
        "import torch\n"
        "x = torch.ones(2).cuda()  # remapped to the CPU: a notice in every rank\n"
        "print('done', x.device, flush=True)\n"))
    notices = [(rank, line) for rank, line, _ in lines if "singlecard_nb: tensor.cuda()" in line]
    assert len(notices) == 1, lines
    # the source line Python prints under a warning goes with it; everything else stays
    assert sum("x = torch.ones(2).cuda()" in line for _, line, _ in lines) == 1, lines
    assert sorted(rank for rank, line, _ in lines if line == "done cpu") == [0, 1]
    _nothing_left([ranks])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-n", "0"]))
