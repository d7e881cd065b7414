"""Compiling the statistics kernel: the compiler, the flags, torch's OpenMP library, and a
build that tries each way until one compiles and loads (native.py keeps what it makes, in its
cache, and loads it)."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

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


def build_in(folder: Path, cc: str, openmp: str | None, sources: dict[str, str],
             builds: Sequence[tuple[str, list[str], str]], load: Callable[[str, Path], Any],
             keep_as: Callable[[str], Path] | None = None) -> Any:
    """What `load(kind, library)` makes of the first library that compiles and loads: each way
    of `builds` (source, extra flags, kind of library), each set of flags, in a work folder
    inside `folder`, removed at the end.

    keep_as: where a library of a kind is kept for the next process (moved into place whole);
        None: it goes with the work folder.
    """
    work = Path(tempfile.mkdtemp(prefix="build-", dir=folder))
    try:
        for name, text in sources.items():
            Path(work, name).write_text(text)
        variants = [(flags, None) for flags in FLAG_SETS]
        if openmp is not None:  # link torch's own OpenMP library, by its path, not -lgomp
            variants.insert(0, ((*FLAG_SETS[0], "-fopenmp"), openmp))
        error = ""
        for source, extra, kind in builds:
            for i, (flags, library) in enumerate(variants):
                lib_path = Path(work, f"{i}-{kind}")
                error = compile_library(cc, Path(work, source), flags, extra, library, lib_path)
                if error:
                    continue
                try:
                    loaded = load(kind, lib_path)  # stays loaded after the file goes
                except (ImportError, OSError) as e:  # e.g. headers of another Python
                    error = f"{type(e).__name__}: {e}"
                    break  # the next way of building
                if keep_as is not None:
                    os.replace(lib_path, keep_as(kind))
                return loaded
        raise RuntimeError(f"{cc} failed: {error}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
