"""Shared test configuration: the `gpu` marker skips with a reason where NVML finds no GPU."""

from __future__ import annotations

import shutil

import pytest


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
