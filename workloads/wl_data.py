"""The digits the workloads train on: IDX files on disk (wl_idx.py), as torch datasets.

Nothing here downloads anything: `--data-dir` names a folder with the MNIST-named files,
plain or gzipped.
"""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from wl_errors import WorkloadError
from wl_idx import MNIST_SPLITS, idx_header

SPLITS = MNIST_SPLITS


def read_idx(path: Path) -> torch.Tensor:
    """An unsigned-byte IDX file (the MNIST format), plain or gzipped, as a uint8 tensor."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    try:
        dims, start = idx_header(data)
    except ValueError as exc:
        raise WorkloadError(f"{path} is {exc}") from None
    body = data[start:]
    if len(body) != math.prod(dims):
        raise WorkloadError(f"{path} holds {len(body)} bytes of data, its header says {math.prod(dims)}")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(dims)


def find_data_file(data_dir: Path, name: str) -> Path:
    for candidate in (data_dir / name, data_dir / f"{name}.gz"):
        if candidate.exists():
            return candidate
    raise WorkloadError(f"{data_dir} has no {name}[.gz]; give --data-dir a folder with the MNIST IDX files")


def check_data_dir(data_dir: Path) -> None:
    """Every file of every split is there (before any rank joins the others)."""
    for split in SPLITS.values():
        for name in split:
            find_data_file(data_dir, name)


def load_split(data_dir: Path, split: str) -> TensorDataset:
    images_name, labels_name = SPLITS[split]
    images = read_idx(find_data_file(data_dir, images_name))
    labels = read_idx(find_data_file(data_dir, labels_name))
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise WorkloadError(f"{data_dir}: {split} images {tuple(images.shape)} do not match labels {tuple(labels.shape)}")
    x = (images.float().div(255.0).sub(0.5).div(0.5)).unsqueeze(1)
    return TensorDataset(x, labels.long())
