"""The server's software versions and hardware, recorded once at attach (facts ``environment``).

Read from the scheduler process: what a bug report needs to reproduce a run. No host name, no user,
no environment variables.
"""

from __future__ import annotations

import os
import platform
import re
from typing import Any, Dict, List, Optional

import torch


def describe() -> Dict[str, Any]:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "driver": nvidia_driver(),
            "hardware": {"platform": platform.platform(), "machine": platform.machine(),
                         "cpu": cpu_model(), "cpu_count": os.cpu_count(), "gpus": gpus()}}


def nvidia_driver(path: str = "/proc/driver/nvidia/version") -> Optional[str]:
    """The NVIDIA kernel driver's version, or None (no NVIDIA driver, or not Linux)."""
    try:
        with open(path) as f:
            found = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", f.read())
    except OSError:
        return None
    return found.group(1) if found else None


def cpu_model(path: str = "/proc/cpuinfo") -> Optional[str]:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def gpus() -> List[str]:
    """Device names of the visible CUDA devices (none without CUDA)."""
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
