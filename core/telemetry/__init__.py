"""Hardware facts and samples (NVML via nvidia-ml-py, host stats via psutil)."""
