"""Shared test configuration: the `gpu` marker skips with a reason where NVML finds no GPU."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
# The statistics kernel is built once per test run into a cache of its own (inherited by the
# kernels and interpreters tests start), never into the user's ~/.cache; the process that made
# it (pytest's controller, whose workers inherit it) removes it when it ends.
if "SINGLECARD_NB_CACHE_DIR" not in os.environ:
    kernel_cache = tempfile.mkdtemp(prefix="singlecard_nb-cache-")
    os.environ["SINGLECARD_NB_CACHE_DIR"] = kernel_cache
    atexit.register(shutil.rmtree, kernel_cache, True)


def run_fresh_python(code: str, **env: str) -> tuple[dict, str]:
    """Run `code` in a new interpreter (CUDA untouched, no CUDA_* variables inherited) with
    extra environment `env`; return the JSON it printed last, and all it printed."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", code], env=environ, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout


# Tests that depend on how torch was built run three ways: the torch installed here, and stand-ins
# for a torch built without and with CUDA. torch counts no GPUs, as on this GPU-less machine.
torch_builds = pytest.mark.parametrize(
    "cuda_built", [None, False, True], ids=["this-torch", "torch-without-cuda", "torch-with-cuda"])


def as_torch_build(monkeypatch, cuda_built: bool | None) -> bool:
    """Make torch answer as a build with (True) or without (False) CUDA, or as it is (None),
    counting no GPUs, without starting CUDA; returns whether it is a CUDA build."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    if cuda_built is None:
        return torch.backends.cuda.is_built()
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: cuda_built)
    return cuda_built


def failure(fn, *args, **kwargs) -> BaseException:
    """The exception `fn(*args, **kwargs)` raises (the test fails if it raises none)."""
    try:
        fn(*args, **kwargs)
    except Exception as e:
        return e
    pytest.fail(f"{fn} raised nothing")


def linear_shape_error(batch: int, got: int, in_features: int, out_features: int) -> str:
    """torch's own message for an `nn.Linear(in_features, out_features)` given `got` features:
    its wording changes between releases (2.15 says "addmm: mat1 and mat2 ..."), so tests ask
    the installed torch instead of spelling one release's words."""
    import torch

    layer = torch.nn.Linear(in_features, out_features)
    try:
        layer(torch.zeros(batch, got))
    except RuntimeError as e:
        return str(e)
    raise AssertionError("a Linear given the wrong width raised nothing")


def magic_error(shell, line: str):
    """Run a cell in `shell`; return the UsageError it gave the user, or None. Anything else it
    raised (a traceback for the user) fails the test."""
    from IPython.core.error import UsageError

    result = shell.run_cell(line)
    if result.error_in_exec is not None and not isinstance(result.error_in_exec, UsageError):
        raise result.error_in_exec
    return result.error_in_exec


def hook_tables(model) -> dict:
    """Every hook table torch keeps: the global ones, each module's and each parameter's."""
    from torch.nn.modules import module as module_globals

    tables = {name: dict(value) for name, value in vars(module_globals).items()
              if name.startswith("_global_") and isinstance(value, dict)}
    for path, m in model.named_modules():
        for name, value in vars(m).items():
            if "hooks" in name and isinstance(value, dict):
                tables[f"{path}:{name}"] = dict(value)
        for name, p in m.named_parameters(recurse=False):
            tables[f"{path}.{name}:grad"] = dict(p._backward_hooks or {})
            tables[f"{path}.{name}:acc"] = dict(getattr(p, "_post_accumulate_grad_hooks", None) or {})
    return tables


def notebook_runner():
    """scripts/run_notebook.py as a module (what `./lab.sh --headless` runs)."""
    import importlib.util

    if "run_notebook" in sys.modules:
        return sys.modules["run_notebook"]
    spec = importlib.util.spec_from_file_location("run_notebook", ROOT / "scripts" / "run_notebook.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_notebook"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def a_new_users_shell():
    """Each test that asks for IPython's shell (`InteractiveShell.instance()`) gets a new one,
    in the state a user's fresh kernel is in: nothing loaded, no magic resolved yet (IPython
    9.17+ registers %run and the other built-ins lazily), whatever earlier tests did to theirs.
    """
    _forget_the_shell()
    yield
    _forget_the_shell()


def _forget_the_shell() -> None:
    from IPython.core.interactiveshell import InteractiveShell

    if InteractiveShell.initialized():
        saver = getattr(InteractiveShell.instance().history_manager, "save_thread", None)
        if saver is not None:
            saver.stop()  # one history thread per shell would pile up otherwise
    InteractiveShell.clear_instance()


@pytest.fixture
def shown(monkeypatch) -> list:
    """What `%singlecard` passed to IPython's display() (a module may define its own `shown`)."""
    from singlecard_nb.notebook import magics

    objects: list = []
    monkeypatch.setattr(magics, "display", objects.append)
    return objects


def _has_gpu() -> bool:
    # Ask NVML, never torch.cuda: a test session must not start CUDA by itself.
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


# torch 2.6's own fully_shard cannot run a CPU forward, with or without this package: its
# all-gather asks its stream for record_event, which 2.6's torch.cpu.Stream lacks
fsdp2_on_cpu = pytest.mark.skipif(
    not hasattr(torch.cpu.Stream, "record_event"),
    reason=f"torch {torch.__version__}'s fully_shard does not run on CPU (torch.cpu.Stream "
           "has no record_event)")


REPORTED = ("torch", "ipython", "ipykernel", "pandas", "matplotlib", "numpy", "ipywidgets")


def pytest_report_header(config) -> str:
    """The releases this run tests (a lane's venv resolves them; the header says which)."""
    from importlib import metadata

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    import torch  # its build: "+cpu", or the CUDA version it was built for

    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
    return (f"singlecard_nb tests on Python {sys.version.split()[0]}: torch {torch.__version__} "
            f"({build}), " + ", ".join(f"{name} {version(name)}" for name in REPORTED[1:]))


# The files that take longest, longest first (per-file wall time of `./test.sh --junitxml`,
# summed by scripts/file_times.py). ./test.sh and the lanes run a file per worker in
# collection order (--dist loadfile --no-loadscope-reorder): started first, the long files
# end together with the short ones that fill in behind them, instead of one of them running
# alone at the end while the other worker idles.
SLOW_FILES_FIRST = (  # measured 2026-12-02: 2 623 s of test time, two suites at once on 2 cores
    "test_notebooks.py", "test_ranks.py", "test_browser.py", "test_bench_smoke.py",
    "test_compare_ranks.py", "test_inspection_stats.py", "test_packaging.py",
    "test_hardening_give_back.py", "test_hardening_subclasses.py", "test_kernel_build.py",
    "test_kernel_adversarial.py", "test_compare_notebook.py", "test_libraries.py",
    "test_inspect_all_scripts.py", "test_sharding_scripts.py", "test_lazy_magics.py",
)


def pytest_collection_modifyitems(config, items):
    first = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: the rest as found
    if not _has_gpu():
        skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU: NVML reports none on this machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)
    if shutil.which("chromium") is None:
        skip_browser = pytest.mark.skip(reason="needs Debian's chromium at /usr/bin/chromium")
        for item in items:
            if "browser" in item.keywords:
                item.add_marker(skip_browser)


@pytest.fixture(scope="session", autouse=True)
def statistics_kernel_built():
    """Take statistics the way a user's session does after its first second: with the one-read
    kernel, built once here, so no test's figures depend on whether a background build happened
    to finish. Tests of the torch reductions pass `kernels={}`; build behaviour is tested in
    fresh processes (test_inspection_stats.py)."""
    from singlecard_nb.inspection.kernel import native

    native.wait(120)
