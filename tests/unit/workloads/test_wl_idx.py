"""The IDX data format between the controller, which writes it (pycli/jobs/datasets.py), and the
nodes, which read it (workloads/wl_data.py): one definition (workloads/wl_idx.py), held to
MNIST's own bytes so that neither side can drift from it, nor from the files users bring."""

import gzip
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pycli.jobs.datasets import MNIST_NAMES, idx_bytes, read_idx_header, write_idx_split
from tests.conftest import ROOT

WORKLOADS = ROOT / "workloads"
sys.path.insert(0, str(WORKLOADS))

from wl_data import load_split, read_idx  # noqa: E402
from wl_errors import WorkloadError  # noqa: E402

# MNIST's layout, written out by hand: zero, zero, 0x08 (unsigned bytes), the number of
# dimensions, each dimension as a big-endian 32-bit count, then the values row-major.
LABELS_7_2 = bytes.fromhex("00000801" "00000002") + bytes([7, 2])
IMAGES_2x2x3 = bytes.fromhex("00000803" "00000002" "00000002" "00000003") + bytes(range(12))


def _samples(count: int, side: int) -> list[tuple[bytes, int]]:
    return [(bytes((7 * n + i) % 256 for i in range(side * side)), n % 10) for n in range(count)]


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_split_the_controller_writes_is_what_the_nodes_read(tmp_path, gzipped):
    samples = _samples(5, 4)
    written = write_idx_split(tmp_path, "train", samples, 4)
    assert sorted(written) == sorted(MNIST_NAMES["train"])
    if gzipped:  # users' MNIST files often come so
        for name in written:
            (tmp_path / f"{name}.gz").write_bytes(gzip.compress((tmp_path / name).read_bytes()))
            (tmp_path / name).unlink()
    images_name, labels_name = MNIST_NAMES["train"]
    images = read_idx(tmp_path / (images_name + (".gz" if gzipped else "")))
    labels = read_idx(tmp_path / (labels_name + (".gz" if gzipped else "")))
    assert images.dtype == labels.dtype == torch.uint8
    assert tuple(images.shape) == (5, 4, 4) and tuple(labels.shape) == (5,)
    assert [bytes(image.flatten().tolist()) for image in images] == [pixels for pixels, _ in samples]
    assert labels.tolist() == [label for _, label in samples]

    x, y = load_split(tmp_path, "train").tensors
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert tuple(x.shape) == (5, 1, 4, 4) and y.tolist() == labels.tolist()
    assert x[0, 0, 0, 0].item() == -1.0 and x.min() >= -1 and x.max() <= 1  # bytes 0..255 to -1..1


def test_the_controller_writes_mnist_bytes_exactly():
    assert idx_bytes((2,), bytes([7, 2])) == LABELS_7_2
    assert idx_bytes((2, 2, 3), bytes(range(12))) == IMAGES_2x2x3
    with pytest.raises(ValueError, match="do not fill shape"):
        idx_bytes((2, 2), bytes(3))


def test_the_nodes_read_mnist_bytes_exactly(tmp_path):
    (tmp_path / "labels").write_bytes(LABELS_7_2)
    (tmp_path / "images").write_bytes(IMAGES_2x2x3)
    assert read_idx(tmp_path / "labels").tolist() == [7, 2]
    images = read_idx(tmp_path / "images")
    assert tuple(images.shape) == (2, 2, 3) and images[1, 0].tolist() == [6, 7, 8]
    assert read_idx_header(IMAGES_2x2x3) == (2, 2, 3) and read_idx_header(LABELS_7_2) == (2,)


@pytest.mark.parametrize("data", [
    bytes.fromhex("00000901" "00000002") + bytes(2),  # signed bytes (0x09): not what pycli reads
    bytes.fromhex("01000801" "00000002") + bytes(2),  # the first two bytes are not zero
    bytes.fromhex("000008"),  # shorter than the magic number
    bytes.fromhex("00000803" "00000002" "0000"),  # the header stops inside its dimensions
], ids=["signed", "magic", "short", "cut-header"])
def test_both_sides_refuse_anything_else_in_one_line(tmp_path, data):
    with pytest.raises(ValueError, match="^not an unsigned-byte IDX file"):
        read_idx_header(data)
    (tmp_path / "bad").write_bytes(data)
    with pytest.raises(WorkloadError, match=f"^{tmp_path / 'bad'} is not an unsigned-byte IDX file"):
        read_idx(tmp_path / "bad")


def test_data_shorter_than_its_header_says_is_a_clear_error(tmp_path):
    path = tmp_path / "bad"
    path.write_bytes(idx_bytes((2, 2), bytes(4))[:-1])
    with pytest.raises(WorkloadError, match="holds 3 bytes of data, its header says 4"):
        read_idx(path)


def test_the_controller_and_the_nodes_take_the_format_from_one_file_without_torch():
    assert Path(inspect.getsourcefile(idx_bytes)) == WORKLOADS / "wl_idx.py"
    import wl_data

    assert Path(inspect.getsourcefile(wl_data.idx_header)) == WORKLOADS / "wl_idx.py"
    proc = subprocess.run([sys.executable, "-c", "import sys, pycli.jobs.datasets; print('torch' in sys.modules)"],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr
