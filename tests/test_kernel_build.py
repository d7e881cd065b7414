"""The kernel is built once per machine and user, safely: a private cache, one builder at a
time, a compiler that hangs is stopped with all its children, torch's own OpenMP library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from singlecard_nb.inspection.kernel import build, native

ROOT = Path(__file__).resolve().parent.parent
BUILD = ("import json, sys\n"
         "from singlecard_nb.inspection.kernel import native\n"
         "ok = native.wait(240)\n"
         "print(json.dumps({'ok': ok, 'status': native.status()}))\n")


def _logging_compiler(tmp_path: Path) -> tuple[Path, Path]:
    """A cc that notes each call in a log, then runs the real one."""
    log = tmp_path / "cc.log"
    cc = tmp_path / "logging-cc"
    cc.write_text(f"#!/bin/sh\necho \"$$ $*\" >> {log}\nexec cc \"$@\"\n")
    cc.chmod(0o755)
    return cc, log


def _start(cache: Path, cc: Path) -> subprocess.Popen:
    env = {**os.environ, "SINGLECARD_NB_CACHE_DIR": str(cache), "CC": str(cc)}
    return subprocess.Popen([sys.executable, "-c", BUILD], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _result(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_second_process_loads_the_kernel_without_compiling(tmp_path):
    cc, log = _logging_compiler(tmp_path)
    cache = tmp_path / "cache"
    first = _result(_start(cache, cc))
    assert first["ok"], first
    calls = log.read_text().count("-o ")
    assert calls >= 1
    assert (cache.stat().st_mode & 0o777) == 0o700  # the user's own: nobody else's code loads
    second = _result(_start(cache, cc))
    assert second["ok"] and "one-pass kernel for" in second["status"]
    assert log.read_text().count("-o ") == calls  # no compiler ran the second time


@pytest.mark.slow
def test_ranks_starting_together_build_once(tmp_path):
    cc, log = _logging_compiler(tmp_path)
    cache = tmp_path / "cache"
    processes = [_start(cache, cc) for _ in range(3)]  # three ranks of a job
    assert all(_result(p)["ok"] for p in processes)
    builders = {line.split()[0] for line in log.read_text().splitlines()}
    linked = [line for line in log.read_text().splitlines() if "-shared" in line]
    assert len(linked) == 1, linked  # one build, shared by all three
    assert len(builders) >= 1


@pytest.mark.slow
def test_a_rank_starting_while_another_holds_the_lock_takes_its_first_step_with_the_kernel(
        tmp_path):
    # Ranks start together; one holds the cache's lock while it loads the kernel. Another
    # that skipped the cache then took its first steps with torch, and the statistics of one
    # all-reduced gradient differed across the ranks in the last bits (compare_ranks, rtol=0).
    cc, _ = _logging_compiler(tmp_path)
    cache = tmp_path / "cache"
    assert _result(_start(cache, cc))["ok"]
    first_step = ("import json\n"
                  "from singlecard_nb.inspection.kernel import native\n"
                  "native.start()\n"
                  "print(json.dumps({'kernel': bool(native.kernels()), "
                  "'status': native.status()}))\n")
    locks = [open(path, "a") for path in cache.glob("*.lock")]
    try:
        for handle in locks:
            native.lock_file(handle)  # another rank, loading
        env = {**os.environ, "SINGLECARD_NB_CACHE_DIR": str(cache), "CC": str(cc)}
        done = subprocess.run([sys.executable, "-c", first_step], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    finally:
        for handle in locks:
            handle.close()
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert locks and result["kernel"], result


@pytest.mark.slow
def test_a_cache_others_can_write_is_not_trusted(tmp_path):
    cc, log = _logging_compiler(tmp_path)
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    result = _result(_start(cache, cc))
    assert result["ok"]  # built in a temporary folder instead
    assert not list(cache.glob("onepass-*"))


def test_a_compiler_that_hangs_is_stopped_with_its_children(tmp_path):
    pids = tmp_path / "pids"
    hanging = tmp_path / "hanging-cc"
    # like cc, which runs cc1 and as as children: the child must go too
    hanging.write_text(f"#!/bin/sh\nsleep 300 &\necho $! >> {pids}\nsleep 300\n")
    hanging.chmod(0o755)
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        build.run_compiler([str(hanging)], timeout=1)
    assert time.monotonic() - began < 30
    child = int(pids.read_text().split()[0])
    for _ in range(50):
        if not Path(f"/proc/{child}").exists() or "Z" in _state(child):
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists() or "Z" in _state(child), "cc's child still runs"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[0]
    except OSError:
        return "Z"


MAPS = """\
7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0
7f02-7f03 r-xp 00000000 08:01 2 /venv/lib/torch/lib/libgomp-a34b3233.so.1
7f04-7f05 r-xp 00000000 08:01 3 /venv/lib/torch/lib/libtorch_cpu.so
7f06-7f07 rw-p 00000000 00:00 0 [heap]
"""


def test_the_openmp_library_is_torchs_own_even_when_renamed():
    assert build.torch_openmp(MAPS, "/venv/lib/torch") == "/venv/lib/torch/lib/libgomp-a34b3233.so.1"


def test_without_torchs_own_libgomp_one_loaded_libgomp_is_used_and_two_are_not():
    system_only = MAPS.splitlines()[0] + "\n"
    assert build.torch_openmp(system_only, "/venv/lib/torch").endswith("libgomp.so.1.0.0")
    two_elsewhere = system_only + "7f08-7f09 r-xp 0 08:01 4 /opt/other/libgomp.so.1\n"
    assert build.torch_openmp(two_elsewhere, "/venv/lib/torch") is None
    assert build.torch_openmp("7f06-7f07 rw-p 00000000 00:00 0 [heap]\n", "/t") is None


def test_the_built_kernel_runs_beside_torchs_openmp_library_and_no_other():
    if not native.wait(240):
        pytest.skip(f"no kernel here: {native.status()}")
    library = build.torch_openmp_library()
    if library is None:
        pytest.skip("torch here does not run on GNU OpenMP")
    # What matters is the process: one OpenMP runtime, torch's. (ldd run on the file alone
    # cannot say: torch 2.6's wheel ships it renamed, libgomp-<hash>.so.1 with the soname
    # libgomp.so.1, which the loader matches in a process that loaded torch first.)
    with open("/proc/self/maps") as maps:
        mapped = [line.split()[-1] for line in maps if len(line.split()) > 5]
    assert any("/onepass-" in path for path in mapped)  # the kernel is loaded...
    gomp = {os.path.realpath(path) for path in mapped if "gomp" in os.path.basename(path)}
    assert gomp == {os.path.realpath(library)}, gomp  # ...beside torch's libgomp and no other


def _hanging_compiler(tmp_path: Path) -> tuple[Path, Path]:
    """A cc that starts a child (as cc runs cc1 and as) and hangs; both note their pids."""
    pids = tmp_path / "pids"
    hanging = tmp_path / "hanging-cc"
    hanging.write_text(f"#!/bin/sh\necho $$ >> {pids}\nsleep 300 &\necho $! >> {pids}\n"
                       "sleep 300\n")
    hanging.chmod(0o755)
    return hanging, pids


def _run_with_compiler(compiler: Path, tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    """`script` in a fresh Python whose kernel builds with `compiler`, into a cache of its own."""
    env = {**os.environ, "SINGLECARD_NB_CACHE_DIR": str(tmp_path / "cache"), "CC": str(compiler)}
    return subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, text=True,
                          capture_output=True, timeout=120)


def _gone(pids: Path) -> list[int]:
    """The noted pids still running after a few seconds' grace."""
    alive = [int(p) for p in pids.read_text().split()]
    for _ in range(50):
        alive = [p for p in alive if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]
        if not alive:
            break
        time.sleep(0.1)
    return alive


def test_a_hanging_compiler_gives_up_within_the_timeout_with_one_plain_notice(tmp_path):
    hanging, pids = _hanging_compiler(tmp_path)
    script = ("import json, time, torch\n"
              "from singlecard_nb.inspection.kernel import build, native, stats\n"
              "build.COMPILE_TIMEOUT_S = 2\n"
              "began = time.monotonic()\n"
              "ok = native.wait(60)\n"
              "print(json.dumps({'ok': ok, 'took': time.monotonic() - began,\n"
              "                  'status': native.status()}))\n")
    run = _run_with_compiler(hanging, tmp_path, script)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert not out["ok"] and out["took"] < 30  # one timeout, not one per way of building
    assert "did not finish within 2 s" in out["status"], out["status"]
    assert "torch reductions" in out["status"] and "Command" not in out["status"]
    assert pids.read_text().count("\n") == 2  # one compiler started, and its child
    assert _gone(pids) == [], "the compiler or its child still runs"


def test_a_hanging_compiler_and_its_children_end_with_the_process_that_started_it(tmp_path):
    hanging, pids = _hanging_compiler(tmp_path)
    script = ("import time\n"
              "from pathlib import Path\n"
              "from singlecard_nb.inspection.kernel import native\n"
              "native.start()  # the build runs in a daemon thread\n"
              f"while Path({str(pids)!r}).read_text().count('\\n') < 2 if Path({str(pids)!r})"
              ".exists() else True:\n"
              "    time.sleep(0.05)\n"
              "print('compiler running')\n")
    run = _run_with_compiler(hanging, tmp_path, script)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "compiler running" in run.stdout
    assert _gone(pids) == [], "the compiler or its child outlived the process"
