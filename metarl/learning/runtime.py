"""Process-level torch settings for the local backends (torch is imported only where threads are set)."""

from __future__ import annotations

import os

THREADS_ENV = "METARL_TORCH_THREADS"


def available_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_per_job(concurrent_jobs: int, requested: int | None = None, cores: int | None = None) -> int:
    """Torch threads for each of `concurrent_jobs` trainers sharing the cores (`requested` wins, capped at the cores)."""
    cores = available_cores() if cores is None else cores
    if requested is not None:
        return max(1, min(requested, cores))
    return max(1, cores // max(1, concurrent_jobs))


def configure_torch_threads() -> int:
    """Set torch's intra-op threads to the usable core count (or ``METARL_TORCH_THREADS``); return it."""
    import torch

    requested = os.environ.get(THREADS_ENV)
    threads = threads_per_job(1, int(requested) if requested else None)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def quiet_transformers() -> None:
    """Turn off transformers' progress bars (weight loading and saving) for this process."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
