"""The one-pass statistics kernel for CPU tensors (`onepass.c`): loaded from a per-user cache, or
built in the background (compiling it is `build.py`), and loaded here either way.

Taking min, max, sum, sum of squares and the zero count with torch costs about five reads of
a tensor plus temporaries; `onepass.c` reads it once (measured in benchmarks/README.md). It is
compiled with the system C compiler (`$CC`, else cc, gcc or clang) as a Python extension module
(`onepass_module.c`) where Python's headers are installed, else as a plain library loaded with
ctypes, and checked against torch on a known tensor. It is built once per machine and user, into
a private cache (`cache_dir()`), named by everything that changes the build: the sources, the
compiler, the flags, the Python, the CPU (`-march=native`) and torch's OpenMP library; a lock
keeps the ranks of a job from building it together. The build runs in a daemon thread, started
by the first CPU tensor to reduce (`start()`), so no step ever waits for it: `kernels()` stays
empty until it is ready, and the caller reduces with torch meanwhile.
When the build fails (no compiler, say), a warning says so once and torch is used from then
on. `SINGLECARD_NB_NATIVE=0` turns the kernel off.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import importlib.util
import math
import os
import platform
import shutil
import stat
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from ...dtypes import dtype_name
from ...notices import Notices
from . import build

ENV = "SINGLECARD_NB_NATIVE"

# kernel(data_ptr, n, exact, address): writes reductions.RAW (8 doubles) of the n values that fill
# one dense block of memory from data_ptr at `address`, which stays valid (and is not shared)
# during the call. The caller keeps the tensor alive during the call.
Kernel = Callable[[int, int, bool, int], None]
# difference(a_ptr, b_ptr, n, exact, address) -> bool: the row the kernel writes for a - b (a
# parameter's update Δw since its copy) without torch making a - b; False: not done (no memory).
Difference = Callable[[int, int, int, bool, int], bool]
Built = tuple[dict[torch.dtype, Kernel], dict[torch.dtype, Difference]]

_lock = threading.Lock()
_started = False
_ready = threading.Event()  # set when the build has ended, well or not
_kernels: dict[torch.dtype, Kernel] = {}
_differences: dict[torch.dtype, Difference] = {}  # float32's, from the same build
_failure: str | None = None  # the warning to give once when the build failed
_notices = Notices(category=RuntimeWarning)


def kernels() -> dict[torch.dtype, Kernel]:
    """The kernels by dtype once built; empty while building, before `start()`, or when they
    cannot be built (said once, as a warning, by the first call that finds out)."""
    if _ready.is_set() and _failure is not None:
        _notices.say("build", _failure, stacklevel=3)
    return _kernels


def differences() -> dict[torch.dtype, Difference]:
    """The difference kernels by dtype (float32's), filled in place with `kernels()`."""
    return _differences


def started() -> bool:
    return _started


def start() -> None:
    """Load the cached kernel, or start building it in the background (idempotent);
    `SINGLECARD_NB_NATIVE=0` skips it."""
    global _started
    with _lock:
        if _started:
            return
        _started = True
        if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
            _ready.set()  # off by request: torch reductions, nothing to say
            return
        # Built before (by an earlier kernel, another rank): loading takes ~20 ms, so every
        # process of a job takes its first step's statistics the same way, with the kernel.
        try:
            cached = _build(only_cached=True)
        except Exception:  # no compiler, say: the background build finds out and says so
            cached = None
        if cached:
            _take(cached)
            _ready.set()
            return
        threading.Thread(target=_build_in_background, name="singlecard_nb-native",
                         daemon=True).start()


def wait(timeout: float | None = None) -> bool:
    """Start the build if needed and wait for it; True when kernels are available."""
    start()
    _ready.wait(timeout)
    return bool(_kernels)


def status() -> str:
    """One line: whether reductions use the kernel, and why not."""
    if not _started:
        return "one-pass kernel not built yet: it starts building with the first CPU tensor"
    if not _ready.is_set():
        return "building the one-pass kernel (torch reductions until it is ready)"
    if _kernels:
        return "one-pass kernel for " + ", ".join(sorted(dtype_name(d) for d in _kernels))
    return _failure or f"one-pass kernel off ({ENV}=0): torch reductions"


def _build_in_background() -> None:
    global _failure
    try:
        _take(_build() or ({}, {}))
    except Exception as e:  # said once, in the reducing thread: never raised into a step
        _failure = (
            f"singlecard_nb: the one-pass statistics kernel could not be built "
            f"({type(e).__name__}: {e}); "
            "statistics of CPU tensors are taken with torch reductions instead (correct, "
            "about 2-5x slower). Install a C compiler (gcc or clang, or set CC) to speed them "
            f"up, or set {ENV}=0 to silence this.")
    finally:
        _ready.set()


def _take(built: Built) -> None:
    kernels, differences = built
    _differences.update(differences)  # first: a caller that finds a kernel finds its difference
    _kernels.update(kernels)


def _build(only_cached: bool = False) -> Built | None:
    """Load the kernels built for this machine, or build them (once per machine and user:
    a lock keeps concurrent builders, the ranks of a torchrun job, from building together).

    only_cached: load what is cached, or return None at once (no build, no waiting on a lock).
    """
    cc = build.compiler()
    openmp = build.torch_openmp_library()
    package = resources.files(__package__)
    sources = {name: package.joinpath(name).read_text() for name in ("onepass.c",
                                                                     "onepass_module.c")}
    folder = cache_dir()
    if not private_folder(folder):
        if only_cached:
            return None
        return build.build_in(Path(temporary_folder()), cc, openmp, sources, _builds(), _load)
    name = key(cc, openmp, sources)
    if only_cached:
        # Without the lock: a built library is moved into place whole, so it can be read while
        # another rank holds the lock to load it too; waiting for that rank (or skipping the
        # cache) would take this rank's first steps with torch, and the ranks' statistics of
        # one all-reduced gradient would differ in the last bits.
        return _load_cached(folder, name, remove_broken=False)
    with open(folder / f"{name}.lock", "a") as lock:
        lock_file(lock)  # released when the file closes
        return (_load_cached(folder, name, remove_broken=True)
                or build.build_in(folder, cc, openmp, sources, _builds(), _load,
                                  keep_as=lambda kind: folder / f"onepass-{name}-{kind}"))


# --- the cache: one build per machine and user ------------------------------------------------
CACHE_ENV = "SINGLECARD_NB_CACHE_DIR"


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
                 _cpu_identity(), repr(build.FLAG_SETS), *sources.values()):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:24]


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


# --- loading: the kinds of library, each checked against torch --------------------------------
def _load_cached(folder: Path, name: str, remove_broken: bool) -> Built | None:
    """The kernels built before under `name`, checked; None if none loads. `remove_broken`
    (only under the lock): a broken or stale library is deleted, to be built again."""
    for _source, _extra, kind in _builds():
        built = folder / f"onepass-{name}-{kind}"
        if not built.is_file():
            continue
        try:
            return _load(kind, built)
        except (ImportError, OSError, RuntimeError):
            if remove_broken:
                built.unlink(missing_ok=True)
    return None


def _builds() -> list[tuple[str, list[str], str]]:
    """(source, extra flags, kind of library) in order of preference. The extension module
    first: a call costs ~0.1 us against ~0.5 us through ctypes, which matters for the many
    small tensors of a model's step. Without Python's headers (Debian's python3 without
    python3-dev), the same kernels load through ctypes."""
    builds = [("onepass.c", [], "ctypes.so")]
    headers = _python_headers()
    if headers is not None:
        builds.insert(0, ("onepass_module.c", [f"-I{headers}", *_EXTENSION_FLAGS], "module.so"))
    return builds


# macOS links an extension's Python symbols when it is loaded, as Linux does by default.
_EXTENSION_FLAGS = ["-undefined", "dynamic_lookup"] if sys.platform == "darwin" else []
_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _python_headers() -> str | None:
    """The folder with this Python's Python.h, or None: then the ctypes build is used. Not on
    Windows (no cc there anyway) nor on a free-threaded Python, where importing an extension
    that does not declare itself thread-safe would turn the GIL back on for the whole process."""
    if sys.platform == "win32" or sysconfig.get_config_var("Py_GIL_DISABLED"):
        return None
    include = sysconfig.get_paths().get("include")
    return include if include and Path(include, "Python.h").is_file() else None


def _load_module(path: Path) -> Built:
    spec = importlib.util.spec_from_file_location("_onepass", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path.name} as a module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernels = {dtype: getattr(module, dtype_name(dtype)) for dtype in _DTYPES
               if hasattr(module, dtype_name(dtype))}
    return kernels, {torch.float32: module.float32_difference}


def _load_library(path: Path) -> Built:
    # Loaded twice (the same library): through CDLL, calls release the GIL, so other Python
    # threads run during a long read; through PyDLL they keep it, which saves ~0.4 us per call
    # on the small tensors that take a microsecond.
    lib = ctypes.CDLL(str(path))
    keeping_gil = ctypes.PyDLL(str(path))
    kernels = {}
    for dtype in _DTYPES:
        if dtype is torch.float16 and not lib.onepass_has_float16():
            continue
        name = f"onepass_{dtype_name(dtype)}"
        fns = (getattr(keeping_gil, name), getattr(lib, name))
        for fn in fns:
            fn.restype = None
            fn.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p)
        kernels[dtype] = _bind(*fns)
    name = "onepass_float32_difference"
    fns = (getattr(keeping_gil, name), getattr(lib, name))
    for fn in fns:
        fn.restype = ctypes.c_int
        fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int,
                       ctypes.c_void_p)
    return kernels, {torch.float32: _bind_difference(*fns)}


_LOADERS = {"module.so": _load_module, "ctypes.so": _load_library}  # by kind of library


def _load(kind: str, path: Path) -> Built:
    """The kernels of the library at `path`, of `kind`, checked against torch."""
    built = _LOADERS[kind](path)
    _self_test(*built)
    return built

GIL_RELEASE_NUMEL = 1 << 16  # from this size (~10 us of reading) other threads may run


def _bind(small, large) -> Kernel:
    def run(data_ptr: int, n: int, exact: bool, address: int) -> None:
        (small if n < GIL_RELEASE_NUMEL else large)(data_ptr, n, exact, address)

    return run


def _bind_difference(small, large) -> Difference:
    def run(a_ptr: int, b_ptr: int, n: int, exact: bool, address: int) -> bool:
        return bool((small if n < GIL_RELEASE_NUMEL else large)(a_ptr, b_ptr, n, exact, address))

    return run


def _self_test(kernels: dict[torch.dtype, Kernel],
               differences: dict[torch.dtype, Difference]) -> None:
    """Compare with torch on values with zeros, ties and a tail that fills no full block; each
    difference kernel with its kernel on torch's subtraction, to the bit."""
    x = torch.cat([torch.arange(-2000, 3001, dtype=torch.float64) / 8, torch.zeros(7)])
    out = (ctypes.c_double * 8)()
    for dtype, run in kernels.items():
        t = x.to(dtype)
        d = t.double()
        mean = d.mean().item()
        expected = (d.min().item(), d.max().item(), mean, 0.0, ((d - mean) ** 2).sum().item(),
                    0.0, 0.0, float((d != 0).sum()))
        run(t.data_ptr(), t.numel(), False, ctypes.addressof(out))
        if not all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-9) for a, b in zip(out, expected)):
            raise RuntimeError(f"self-test failed for {dtype}: {list(out)} instead of {expected}")
    for dtype, difference in differences.items():
        a, b = (x * 1.1).to(dtype), (x.flip(0) / 3).to(dtype)
        by_torch, update = (ctypes.c_double * 8)(), a - b  # alive during the call
        kernels[dtype](update.data_ptr(), a.numel(), False, ctypes.addressof(by_torch))
        done = difference(a.data_ptr(), b.data_ptr(), a.numel(), False, ctypes.addressof(out))
        if not done or bytes(out) != bytes(by_torch):
            raise RuntimeError(f"self-test failed for the {dtype} difference: {list(out)} "
                               f"instead of {list(by_torch)}")
