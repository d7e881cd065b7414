"""Shared test configuration: the `gpu` marker skips with a reason where NVML finds no GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_fresh_python(code: str, **env: str) -> tuple[dict, str]:
    """Run `code` in a new interpreter (CUDA untouched, no CUDA_* variables inherited) with
    extra environment `env`; return the JSON it printed last, and all it printed."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    environ.update(env)
    done = subprocess.run([sys.executable, "-c", code], env=environ, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout


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


def pytest_collection_modifyitems(config, items):
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
    from singlecard_nb.inspection import native

    native.wait(120)
