"""A GPU-count guard in the shape of pytorch/examples' distributed scripts (a test script)."""

import sys

import torch


def verify_min_gpu_count(min_gpus: int = 2) -> bool:
    has_gpu = torch.accelerator.is_available()
    gpu_count = torch.accelerator.device_count()
    return has_gpu and gpu_count >= min_gpus


if not verify_min_gpu_count(min_gpus=2):
    print("Unable to locate sufficient 2 gpus to run this example. Exiting.")
    sys.exit()
acc = torch.accelerator.current_accelerator()
print(f"past the guard on {torch.device(f'{acc}:0')}")
