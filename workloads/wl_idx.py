"""The IDX format of the training data (MNIST's): written by pycli/jobs/datasets.py on the
controller, read by wl_data.py on the nodes. Plain Python, no torch, so the controller
imports this one file for the format's every detail.

An IDX file of unsigned bytes: two zero bytes, the type code 0x08, the number of
dimensions; each dimension as a big-endian 32-bit count; then the values, row-major.
"""

from __future__ import annotations

import math
import struct

MAGIC_ZEROS = b"\0\0"
IDX_UBYTE = 0x08
MAGIC_BYTES = 4  # zero, zero, type, number of dimensions
DIM_FORMAT = ">I"  # each dimension: a big-endian unsigned 32-bit count
DIM_BYTES = struct.calcsize(DIM_FORMAT)
# The files a data folder holds, by MNIST's own names; `--data-dir` points at such a folder.
MNIST_SPLITS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def idx_bytes(shape: tuple[int, ...], values: bytes) -> bytes:
    """The IDX encoding of unsigned bytes: magic (0, 0, type, ndim), big-endian dims, data."""
    if len(values) != math.prod(shape):
        raise ValueError(f"{len(values)} values do not fill shape {shape}")
    dims = b"".join(struct.pack(DIM_FORMAT, dim) for dim in shape)
    return MAGIC_ZEROS + bytes([IDX_UBYTE, len(shape)]) + dims + values


def idx_header(data: bytes) -> tuple[tuple[int, ...], int]:
    """The shape an unsigned-byte IDX file declares and the offset its values start at;
    ValueError when `data` is not such a file."""
    if len(data) < MAGIC_BYTES or data[:2] != MAGIC_ZEROS or data[2] != IDX_UBYTE:
        raise ValueError("not an unsigned-byte IDX file")
    ndim = data[3]
    start = MAGIC_BYTES + DIM_BYTES * ndim
    if len(data) < start:
        raise ValueError(f"not an unsigned-byte IDX file (its header stops before its {ndim} dimensions)")
    dims = tuple(struct.unpack_from(DIM_FORMAT, data, MAGIC_BYTES + DIM_BYTES * axis)[0] for axis in range(ndim))
    return dims, start
