"""Where a rank computes and how: its device, mixed precision, its peak memory and CPU threads."""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Mapping

import torch

# How many ranks run on this node, as each launcher says: mpirun (and horovodrun over MPI),
# horovodrun with Gloo, torchrun.
LOCAL_SIZE_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE")


def pick_device(local_rank: int, force_cpu: bool = False) -> torch.device:
    if not force_cpu and torch.cuda.is_available():
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def autocast(device: torch.device, enabled: bool):
    """AMP: fp16 on CUDA (with a GradScaler), bf16 on CPU (no scaler needed)."""
    if not enabled:
        return contextlib.nullcontext()
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def threads_per_rank(requested: int = 0, environ: Mapping[str, str] = os.environ, cpus: int | None = None) -> int:
    """Torch CPU threads for this rank: `requested` when above 0, else OMP_NUM_THREADS when the
    user set it, else this process's cores shared out between the ranks on this node.

    Torch's own default is every core for every rank, so ranks that share a machine fight
    over its cores.
    """
    if requested > 0:
        return requested
    chosen = environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if chosen.isdigit() and int(chosen) > 0:
        return int(chosen)
    local_ranks = next((int(environ[name]) for name in LOCAL_SIZE_VARIABLES if environ.get(name, "").isdigit()), 1)
    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
    return max(1, cpus // max(1, local_ranks))
