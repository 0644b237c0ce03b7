"""Training data the demo can stage to nodes without downloading anything at run time.

A user with MNIST points `--data-dir` at the standard IDX files. Without them, the demo
uses the 8x8 handwritten digits (1,797 real samples, UCI) that scikit-learn ships inside its
wheel, written here in the same IDX format so the workloads read one format only.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import importlib.util
import io
import random
import struct
from pathlib import Path

from pycli.cache import read_sha256_lines
from pycli.errors import BadInput, PycliError, read_user_text
from pycli.inventory_writer import write_text_atomically

IDX_UBYTE = 0x08
DIGITS_VERSION = 1  # bump when the conversion changes
TEST_EVERY = 5  # one sample in five is held out
SPLIT_SEED = 1234
MNIST_NAMES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def idx_bytes(shape: tuple[int, ...], values: bytes) -> bytes:
    """The IDX encoding of unsigned bytes: magic (0, 0, type, ndim), big-endian dims, data."""
    expected = 1
    for dim in shape:
        expected *= dim
    if len(values) != expected:
        raise ValueError(f"{len(values)} values do not fill shape {shape}")
    return bytes([0, 0, IDX_UBYTE, len(shape)]) + struct.pack(f">{len(shape)}I", *shape) + values


def _sklearn_digits_csv() -> Path:
    # Found without importing sklearn.datasets, which would pull in SciPy for one data file.
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise PycliError("scikit-learn is not installed; reinstall pycli (pip install -e .) or pass --data-dir")
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
    if not path.exists():
        raise PycliError(f"scikit-learn has no {path.name} where expected ({path})")
    return path


def read_digits() -> list[tuple[bytes, int]]:
    """The 8x8 digits as (64 pixel bytes scaled 0..255, label) pairs."""
    rows = []
    with gzip.open(_sklearn_digits_csv(), "rt") as handle:
        for row in csv.reader(handle):
            if not row:
                continue
            *pixels, label = (int(float(v)) for v in row)
            rows.append((bytes(min(255, p * 255 // 16) for p in pixels), label))
    return rows


def split_digits(rows: list[tuple[bytes, int]]) -> dict[str, list[tuple[bytes, int]]]:
    order = list(range(len(rows)))
    random.Random(SPLIT_SEED).shuffle(order)
    test = {i for n, i in enumerate(order) if n % TEST_EVERY == 0}
    return {
        "train": [rows[i] for i in order if i not in test],
        "test": [rows[i] for i in order if i in test],
    }


def digits_dataset(cache: Path) -> Path:
    """The digits as MNIST-named IDX files in the cache (made once), and their folder."""
    folder = cache / "datasets" / f"digits-idx-v{DIGITS_VERSION}"
    manifest = folder / "SHA256SUMS"
    if manifest.exists() and _manifest_matches(folder, manifest):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for split, samples in split_digits(read_digits()).items():
        images_name, labels_name = MNIST_NAMES[split]
        images = idx_bytes((len(samples), 8, 8), b"".join(pixels for pixels, _ in samples))
        labels = idx_bytes((len(samples),), bytes(label for _, label in samples))
        for name, data in ((images_name, images), (labels_name, labels)):
            (folder / name).write_bytes(data)
            lines.append(f"{hashlib.sha256(data).hexdigest()}  {name}")
    write_text_atomically(manifest, "\n".join(lines) + "\n", force=True)
    return folder


def _manifest_matches(folder: Path, manifest: Path) -> bool:
    try:
        sums = read_sha256_lines(read_user_text(manifest, str(manifest)), str(manifest))
    except BadInput as exc:
        raise BadInput(f"{exc}; delete {folder} to have the data made again") from None
    for name, digest in sums.items():
        path = folder / name.strip()
        if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            return False
    return True


def read_idx_header(data: bytes) -> tuple[int, ...]:
    """The shape an IDX file declares (used by tests and `pycli train` to check a data dir)."""
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != IDX_UBYTE:
        raise ValueError("not an unsigned-byte IDX file")
    ndim = data[3]
    return struct.unpack(f">{ndim}I", io.BytesIO(data[4 : 4 + 4 * ndim]).read())
