"""Ctrl-C in a real Jupyter kernel while `--ranks N` runs: the kernel's interrupt (SIGINT, as
JupyterLab's stop button sends it). Every rank is stopped, the cell ends with KeyboardInterrupt,
and the kernel goes on. (A second Ctrl-C while they are stopped: test_ranks.py.)"""

from __future__ import annotations

import os
import queue
import re
import time
from pathlib import Path

import pytest
from conftest import notebook_runner

ROOT = Path(__file__).resolve().parent.parent

SLEEPER = "import os, time\nprint('started', os.getpid(), flush=True)\ntime.sleep(600)\n"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _read_cell(client, msg_id: str, seen: list[str], until, timeout: float) -> None:
    """Add the cell's stream text to `seen` until `until(message)` is true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = client.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            seen.append(msg["content"]["text"])
        if until(msg):
            return
    raise AssertionError("waited in vain; the cell printed: " + "".join(seen))


def _started(seen: list[str]) -> list[int]:
    return [int(pid) for pid in re.findall(r"started (\d+)", "".join(seen))]


@pytest.mark.slow
def test_ctrl_c_in_a_kernel_stops_every_rank_and_the_kernel_goes_on(tmp_path):
    from jupyter_client.manager import start_new_kernel

    (tmp_path / "sleeper.py").write_text(SLEEPER)
    saved = dict(os.environ)
    os.environ.update(notebook_runner().kernel_environment(str(tmp_path / "spec")))
    try:
        manager, client = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        client.execute_interactive("%load_ext singlecard_nb\n%singlecard cpu --ranks 2",
                                   timeout=120)
        msg_id = client.execute("%run sleeper.py")
        seen: list[str] = []
        _read_cell(client, msg_id, seen, lambda msg: len(_started(seen)) == 2, timeout=120)
        pids = _started(seen)
        assert all(_alive(pid) for pid in pids)
        manager.interrupt_kernel()
        _read_cell(client, msg_id, seen, lambda msg: msg["msg_type"] == "status"
                   and msg["content"]["execution_state"] == "idle", timeout=60)
        reply = client.get_shell_msg(timeout=10)["content"]
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
        assert not any(_alive(pid) for pid in pids), "a rank outlived Ctrl-C"
        after = client.execute_interactive("print('still here')", timeout=30)
        assert after["content"]["status"] == "ok"
    finally:
        manager.shutdown_kernel(now=True)
