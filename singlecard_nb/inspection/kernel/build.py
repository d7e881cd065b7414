"""Compiling the statistics kernel and keeping it: the compiler, the flags, torch's OpenMP
library, and the per-user cache that lets a machine build it once (native.py loads it)."""

from __future__ import annotations

import atexit
import hashlib
import os
import platform
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

CACHE_ENV = "SINGLECARD_NB_CACHE_DIR"
COMPILE_TIMEOUT_S = 120


def compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        path = name and shutil.which(name)
        if path:
            return path
    raise RuntimeError("no C compiler found (looked for $CC, cc, gcc, clang)")


def torch_openmp(maps: str, torch_dir: str) -> str | None:
    """The GNU OpenMP library torch itself runs on, from the text of /proc/self/maps: the
    libgomp file in torch's own folder (wheels ship a renamed copy, libgomp-<hash>.so.1), else
    the one libgomp the process has loaded. None when there is none, or several and none is
    torch's: linking another would start a second OpenMP runtime beside torch's."""
    found = sorted({line.split(None, 5)[5].strip() for line in maps.splitlines()
                    if len(line.split(None, 5)) == 6
                    and os.path.basename(line.split(None, 5)[5]).startswith("libgomp")})
    mine = [path for path in found if path.startswith(torch_dir.rstrip(os.sep) + os.sep)]
    if mine:
        return mine[0]
    return found[0] if len(found) == 1 else None


def torch_openmp_library() -> str | None:
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    return torch_openmp(maps, os.path.dirname(os.path.realpath(torch.__file__)))


def cache_dir() -> Path:
    """Where built kernels are kept, per user: $SINGLECARD_NB_CACHE_DIR, else
    $XDG_CACHE_HOME/singlecard_nb or ~/.cache/singlecard_nb."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "singlecard_nb")


def private_folder(folder: Path) -> bool:
    """Create `folder` for this user only; False when it is not safe to load code from (owned
    by someone else, or writable by others): then the kernel is built in a temporary folder."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.stat()
    except OSError:
        return False
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return False
    return not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _cpu_identity() -> str:
    """What -march=native compiles for: a kernel built on one CPU may not run on another (a
    home directory shared by the nodes of a cluster)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    keep = ("vendor_id", "model name", "flags", "Features", "CPU implementer", "CPU part")
    lines = [line for line in text.splitlines() if line.split(":")[0].strip() in keep]
    return "\n".join(dict.fromkeys(lines))  # the first CPU's; the others repeat it


def _compiler_identity(cc: str) -> str:
    """The compiler's file, its size and time: a new compiler version is a new build. Not its
    `--version`: start() reads this before a step goes on, and must never wait for a program."""
    path = os.path.realpath(cc)
    try:
        info = os.stat(path)
    except OSError:
        return path
    return f"{path} {info.st_size} {info.st_mtime_ns}"


def key(cc: str, openmp: str | None, sources: dict[str, str]) -> str:
    """A built kernel's name: everything that changes what the compiler makes of the sources."""
    digest = hashlib.sha256()
    for part in (cc, _compiler_identity(cc), str(openmp), sys.version, sys.platform,
                 sysconfig.get_config_var("EXT_SUFFIX") or "", platform.machine(),
                 _cpu_identity(), repr(FLAG_SETS), *sources.values()):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:24]


_running: set[int] = set()  # process groups of the compilers running now (one per build step)
_exiting = False  # the interpreter is ending: no compiler starts any more
_starting = threading.Lock()  # a compiler starts and is noted in _running as one step


def _stop(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:  # already gone
        pass


@atexit.register
def _stop_running_compilers() -> None:
    """The build runs in a daemon thread, which the interpreter's exit does not wait for: its
    compiler (a hung one, and its children) would outlive the process that started it."""
    global _exiting
    with _starting:
        _exiting = True
        for group in list(_running):
            _stop(group)


def run_compiler(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Run the compiler in a session of its own: on a time-out, an exception (Ctrl-C) or the
    interpreter's exit the whole group goes (cc's own children, cc1 and as, would otherwise
    keep running)."""
    with _starting:
        if _exiting:  # the daemon thread building still runs for a moment: it builds no more
            raise RuntimeError("the interpreter is exiting")
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
        _running.add(process.pid)  # its session's (and group's) id is its pid
    try:
        out, err = process.communicate(timeout=timeout)
    except BaseException:
        _stop(process.pid)
        process.communicate()
        raise
    finally:
        _running.discard(process.pid)
    return subprocess.CompletedProcess(command, process.returncode, out, err)


# Most to least specific; the first that compiles wins. Never -ffast-math: NaN must stay NaN.
FLAG_SETS = (("-march=native",), ())


def compile_library(cc: str, source: Path, flags: Sequence[str], extra: list[str],
             library: str | None, output: Path) -> str:
    """Compile `source` into `output`; the compiler's last line of error, or "" when done.
    With an OpenMP `library`, compiling and linking are two steps: `-fopenmp` at link time
    would add the system's libgomp beside torch's."""
    common = [cc, "-O3", "-fPIC", *flags, *extra]
    if library is None:
        steps = [[*common, "-shared", str(source), "-o", str(output)]]
    else:
        objects = output.with_suffix(".o")
        steps = [[*common, "-c", str(source), "-o", str(objects)],
                 [cc, "-shared", str(objects), library,
                  f"-Wl,-rpath,{os.path.dirname(library)}", "-o", str(output)]]
    for command in steps:
        try:
            done = run_compiler(command, COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # a hung compiler: no other way is tried
            raise RuntimeError(f"{os.path.basename(cc)} did not finish within "
                               f"{COMPILE_TIMEOUT_S:g} s (stopped, with its children)") from None
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1:]
            return last[0] if last else f"exit status {done.returncode}"
    return ""


def temporary_folder() -> str:
    folder = tempfile.mkdtemp(prefix="singlecard_nb-")
    atexit.register(shutil.rmtree, folder, True)  # also if the interpreter ends mid-build
    return folder


def lock_file(handle: Any) -> None:
    """Lock `handle` for this process, waiting while another process holds it."""
    try:
        import fcntl
    except ImportError:  # Windows: no cc there anyway
        return
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
