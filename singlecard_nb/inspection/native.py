"""The one-pass statistics kernel for CPU tensors (`onepass.c`), built in the background.

Taking min, max, sum, sum of squares and the zero count with torch costs about five reads of
a tensor plus temporaries; `onepass.c` reads it once (measured in benchmarks/README.md). It is
compiled with the system C compiler (`$CC`, else cc, gcc or clang) into a temporary folder,
as a Python extension module (`onepass_module.c`) where Python's headers are installed, else as
a plain library loaded with ctypes; it is checked against torch on a known tensor, and the
folder is deleted. The
build runs in a daemon thread, started by the first CPU tensor to reduce (`start()`), so no
step ever waits for it: `kernels()` stays empty until it is ready, and the caller reduces with
torch meanwhile.
When the build fails (no compiler, say), a warning says so once and torch is used from then
on. `SINGLECARD_NB_NATIVE=0` turns the kernel off.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import torch

ENV = "SINGLECARD_NB_NATIVE"
COMPILE_TIMEOUT_S = 120

# kernel(data_ptr, n, exact, address): writes stats.RAW (8 doubles) of the n values that fill
# one dense block of memory from data_ptr at `address`, which stays valid (and is not shared)
# during the call. The caller keeps the tensor alive during the call.
Kernel = Callable[[int, int, bool, int], None]

_lock = threading.Lock()
_started = False
_ready = threading.Event()  # set when the build has ended, well or not
_kernels: dict[torch.dtype, Kernel] = {}
_failure: str | None = None  # the warning to give once when the build failed
_said = False


def kernels() -> dict[torch.dtype, Kernel]:
    """The kernels by dtype once built; empty while building, before `start()`, or when they
    cannot be built (said once, as a warning, by the first call that finds out)."""
    if _ready.is_set() and _failure is not None and not _said:
        _say_failure()
    return _kernels


def started() -> bool:
    return _started


def start() -> None:
    """Start building in the background (idempotent); `SINGLECARD_NB_NATIVE=0` skips it."""
    global _started
    with _lock:
        if _started:
            return
        _started = True
        if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
            _ready.set()  # off by request: torch reductions, nothing to say
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
        return "one-pass kernel for " + ", ".join(sorted(str(d)[6:] for d in _kernels))
    return _failure or f"one-pass kernel off ({ENV}=0): torch reductions"


def _say_failure() -> None:
    global _said
    _said = True
    try:
        warnings.warn(_failure, RuntimeWarning, stacklevel=4)
    except RuntimeWarning:  # warnings turned into errors: this runs inside the user's forward
        pass


def _build_in_background() -> None:
    global _failure
    try:
        _kernels.update(_build())
    except Exception as e:  # said once, in the reducing thread: never raised into a step
        _failure = (
            f"singlecard_nb: the one-pass statistics kernel could not be built "
            f"({type(e).__name__}: {e}); "
            "statistics of CPU tensors are taken with torch reductions instead (correct, "
            "about 2-5x slower). Install a C compiler (gcc or clang, or set CC) to speed them "
            f"up, or set {ENV}=0 to silence this.")
    finally:
        _ready.set()


def _compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise RuntimeError("no C compiler found (looked for $CC, cc, gcc, clang)")


def _shares_torch_openmp() -> bool:
    """Whether torch runs on GNU OpenMP: then `-fopenmp` reuses its thread pool (the loader
    matches libgomp.so.1 by name) instead of starting a second one that would compete."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    return "libgomp" in maps and "parallel backend: OpenMP" in torch.__config__.parallel_info()


def _build() -> dict[torch.dtype, Kernel]:
    cc = _compiler()
    # Most to least specific; the first that compiles wins. Never -ffast-math: NaN must stay NaN.
    flag_sets = [["-march=native"], []]
    if _shares_torch_openmp():
        flag_sets.insert(0, ["-march=native", "-fopenmp"])
    # The extension module first: a call costs ~0.1 us against ~0.5 us through ctypes, which
    # matters for the many small tensors of a model's step. Without Python's headers (Debian's
    # python3 without python3-dev), the same kernels load through ctypes.
    builds = [("onepass.c", [], _load_library)]
    headers = _python_headers()
    if headers is not None:
        builds.insert(0, ("onepass_module.c", [f"-I{headers}", *_EXTENSION_FLAGS], _load_module))
    folder = tempfile.mkdtemp(prefix="singlecard_nb-")
    atexit.register(shutil.rmtree, folder, True)  # also if the interpreter ends mid-build
    try:
        package = resources.files(__package__)
        for name in ("onepass.c", "onepass_module.c"):
            Path(folder, name).write_text(package.joinpath(name).read_text())
        error = ""
        for source, extra, load in builds:
            for i, flags in enumerate(flag_sets):
                lib_path = Path(folder, f"{Path(source).stem}{i}.so")
                done = subprocess.run([cc, "-O3", "-shared", "-fPIC", *flags, *extra,
                                       str(Path(folder, source)), "-o", str(lib_path)],
                                      capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
                if done.returncode != 0:
                    last = done.stderr.strip().splitlines()[-1:]
                    error = last[0] if last else f"exit status {done.returncode}"
                    continue
                try:
                    kernels = load(lib_path)  # stays loaded after the file is deleted
                except (ImportError, OSError) as e:  # e.g. headers of another Python
                    error = f"{type(e).__name__}: {e}"
                    break  # the next way of building
                _self_test(kernels)
                return kernels
        raise RuntimeError(f"{cc} failed: {error}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # a loaded library may stay (Windows)


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


def _load_module(path: Path) -> dict[torch.dtype, Kernel]:
    spec = importlib.util.spec_from_file_location("_onepass", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path.name} as a module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {dtype: getattr(module, str(dtype)[6:]) for dtype in _DTYPES
            if hasattr(module, str(dtype)[6:])}


def _load_library(path: Path) -> dict[torch.dtype, Kernel]:
    # Loaded twice (the same library): through CDLL, calls release the GIL, so other Python
    # threads run during a long read; through PyDLL they keep it, which saves ~0.4 us per call
    # on the small tensors that take a microsecond.
    lib = ctypes.CDLL(str(path))
    keeping_gil = ctypes.PyDLL(str(path))
    kernels = {}
    for dtype in _DTYPES:
        if dtype is torch.float16 and not lib.onepass_has_float16():
            continue
        name = f"onepass_{str(dtype)[6:]}"
        fns = (getattr(keeping_gil, name), getattr(lib, name))
        for fn in fns:
            fn.restype = None
            fn.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p)
        kernels[dtype] = _bind(*fns)
    return kernels


GIL_RELEASE_NUMEL = 1 << 16  # from this size (~10 us of reading) other threads may run


def _bind(small, large) -> Kernel:
    def run(data_ptr: int, n: int, exact: bool, address: int) -> None:
        (small if n < GIL_RELEASE_NUMEL else large)(data_ptr, n, exact, address)

    return run


def _self_test(kernels: dict[torch.dtype, Kernel]) -> None:
    """Compare with torch on values with zeros, ties and a tail that fills no full block."""
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
