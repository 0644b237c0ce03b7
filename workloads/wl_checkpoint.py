"""Checkpoints of a training run: written in one step, loaded as tensors and plain values only."""

from __future__ import annotations

import json
import os
import pickle
import random
import re
from pathlib import Path

import torch
from torch import nn

from wl_errors import WorkloadError


def save_checkpoint(path: Path, model: nn.Module, optimizer, epoch: int, args, scaler=None) -> None:
    """Write the checkpoint in one step (a crash never leaves half a file under the real name)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": epoch,
        "args": json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}),
        "rng_torch": torch.get_rng_state(),
        "rng_python": random.getstate(),
        "scaler": scaler.state_dict() if scaler is not None else None,
    }
    if torch.cuda.is_available():
        state["rng_cuda"] = torch.cuda.get_rng_state_all()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict:
    """A checkpoint written by `save_checkpoint`: tensors and plain values only.

    weights_only refuses every other object before it is built, so a --resume file that
    holds a pickle meant to run code is an input error on every rank, and nothing runs.
    """
    if not path.is_file():
        raise WorkloadError(f"checkpoint {path} does not exist on this node")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, KeyError, ValueError) as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        why = f"it holds {found.group(1)}, not only tensors and plain values" if found else "it is no torch checkpoint"
        raise WorkloadError(f"{path} is not a checkpoint this workload loads: {why}") from None
    if not isinstance(state, dict) or not {"model", "optimizer", "epoch"} <= set(state):
        raise WorkloadError(f"{path} is not a checkpoint this workload loads: it lacks model, optimizer or epoch")
    return state
