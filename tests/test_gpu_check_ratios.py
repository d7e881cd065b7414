"""The ratio part of scripts/gpu_check.py, run here on the CPU: every variant is timed and the
report line carries each target; on a GPU the same code counts synchronisations."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import device_ratios  # noqa: E402


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_variant_is_timed_and_put_in_ratio_to_its_bare_pass():
    result = device_ratios.ratios("resnet", torch.device("cpu"), reps=1, warmup=0)
    assert set(result["median"]) == set(device_ratios.VARIANTS)
    assert all(t > 0 for t in result["median"].values())
    assert result["ratio"]["bare"] == result["ratio"]["train"] == 1.0
    assert result["ratio"]["full/floor"] == pytest.approx(
        result["median"]["full"] / result["median"]["floor"])
    # a training variant is compared with the bare training step, not the forward
    assert result["ratio"]["train_grads"] == pytest.approx(
        result["median"]["train_grads"] / result["median"]["train"])


def test_report_line_names_each_target_and_fails_on_extra_synchronisations():
    gpu_check = load_gpu_check()
    result = {"median": {"bare": 0.010, "train": 0.030},
              "ratio": {"floor": 1.02, "full": 1.20, "full/floor": 1.18, "train_full": 1.10,
                        "train_grads": 1.40, "every10": 1.01}, "syncs": 1}
    ok, line = gpu_check.describe_ratios("resnet", result)
    assert ok
    assert "floor x 1.18x (<= 1.10x: FAIL)" in line
    assert "train_full 1.10x (<= 1.15x: PASS)" in line
    assert "train_grads 1.40x (<= 1.30x: FAIL)" in line
    assert "every10 1.01x (<= 1.02x: PASS)" in line
    assert "synchronisations per inspected step: 1 (target 1)" in line
    ok, _ = gpu_check.describe_ratios("resnet", dict(result, syncs=3))
    assert not ok


def test_synchronisations_are_not_counted_on_a_cpu():
    assert device_ratios.syncs_per_step("mlp5000", torch.device("cpu")) == 0
