"""The pinning wing: reading GPUs (NVML or a described machine), the CUDA driver probe, the pin
itself and its status display. Imports nothing from the other wings."""
