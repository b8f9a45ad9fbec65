"""Step timing on an asynchronous device: a forward returns before a GPU finishes it, so each timed split ends with
a sync (on the CPU there is nothing to wait for)."""

from __future__ import annotations

import time

import torch


def synced_clock(device: torch.device) -> float:
    """perf_counter after the device has finished the work queued so far."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
