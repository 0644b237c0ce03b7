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
import random
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from pycli.cluster.inventory_writer import write_text_atomically
from pycli.core.cache import read_sha256_lines
from pycli.core.errors import BadInput, PycliError, read_user_text
from pycli.core.paths import WORKLOADS_DIR


def _workload_module(name: str) -> ModuleType:
    """A module of workloads/ that needs no torch, loaded from its file: the folder is no
    package (it travels to the nodes as plain scripts), and what the nodes read it defines."""
    path = WORKLOADS_DIR / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"pycli_workloads_{name}", path)
    if not path.is_file() or spec is None or spec.loader is None:
        raise PycliError(f"{path} is missing: pycli must run from a full checkout (pip install -e .)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The IDX format has one home, beside the reader the nodes run (workloads/wl_idx.py).
_idx = _workload_module("wl_idx")
MNIST_NAMES: dict[str, tuple[str, str]] = _idx.MNIST_SPLITS
idx_bytes = _idx.idx_bytes

DIGITS_VERSION = 1  # bump when the conversion changes
TEST_EVERY = 5  # one sample in five is held out
SPLIT_SEED = 1234
DIGIT_SIDE = 8  # scikit-learn's digits are 8x8 pixels


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
        for name, data in write_idx_split(folder, split, samples, DIGIT_SIDE).items():
            lines.append(f"{hashlib.sha256(data).hexdigest()}  {name}")
    write_text_atomically(manifest, "\n".join(lines) + "\n", force=True)
    return folder


def write_idx_split(folder: Path, split: str, samples: Sequence[tuple[bytes, int]], side: int) -> dict[str, bytes]:
    """One split of (side x side pixel bytes, label) samples as its two MNIST-named IDX files
    in `folder`; what each file holds, by name."""
    images_name, labels_name = MNIST_NAMES[split]
    written = {
        images_name: idx_bytes((len(samples), side, side), b"".join(pixels for pixels, _ in samples)),
        labels_name: idx_bytes((len(samples),), bytes(label for _, label in samples)),
    }
    for name, data in written.items():
        (folder / name).write_bytes(data)
    return written


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
    """The shape an IDX file declares; ValueError when `data` is no unsigned-byte IDX file."""
    shape: tuple[int, ...] = _idx.idx_header(data)[0]  # wl_idx is loaded from its file: untyped here
    return shape
