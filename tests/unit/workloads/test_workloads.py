"""The training workloads, run for real on this machine's CPU (torch, no Horovod needed)."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pycli.core.errors import BadInput
from pycli.jobs.datasets import MNIST_NAMES, digits_dataset, read_digits, split_digits
from tests.conftest import ROOT

WORKLOADS = ROOT / "workloads"
sys.path.insert(0, str(WORKLOADS))

from wl_data import load_split  # noqa: E402
from wl_device import threads_per_rank  # noqa: E402
from wl_model import DigitNet  # noqa: E402


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    return digits_dataset(tmp_path_factory.mktemp("cache"))


def test_digits_dataset_is_all_the_real_samples_split_without_overlap(digits):
    rows = read_digits()
    assert len(rows) == 1797 and {label for _, label in rows} == set(range(10))
    split = split_digits(rows)
    assert len(split["train"]) + len(split["test"]) == 1797
    train = load_split(digits, "train")
    test = load_split(digits, "test")
    assert train.tensors[0].shape[1:] == (1, 8, 8) and len(test) == len(split["test"])
    assert sorted(p.name for p in digits.iterdir()) == sorted(["SHA256SUMS", *MNIST_NAMES["train"], *MNIST_NAMES["test"]])


def test_digits_dataset_is_made_once(digits):
    stamp = (digits / "SHA256SUMS").stat().st_mtime_ns
    assert digits_dataset(digits.parents[1]) == digits
    assert (digits / "SHA256SUMS").stat().st_mtime_ns == stamp


@pytest.mark.parametrize("size", [8, 28])
def test_model_takes_digits_of_both_sizes(size):
    assert DigitNet()(torch.zeros(3, 1, size, size)).shape == (3, 10)


@pytest.mark.parametrize(
    ("environ", "cpus", "expected"),
    [
        ({}, 8, 8),  # started alone: every core this process may use
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 8, 2),  # mpirun, and horovodrun over MPI
        ({"HOROVOD_LOCAL_SIZE": "4"}, 8, 2),  # horovodrun with Gloo
        ({"LOCAL_WORLD_SIZE": "3"}, 8, 2),  # torchrun; the remainder is left idle
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 2, 1),  # more ranks than cores: one thread each
        ({"LOCAL_WORLD_SIZE": "0"}, 4, 4),
        ({"LOCAL_WORLD_SIZE": "4", "OMP_NUM_THREADS": "3"}, 8, 3),  # the user's choice wins
        ({"LOCAL_WORLD_SIZE": "4", "OMP_NUM_THREADS": "3,2"}, 8, 3),  # OpenMP's nested form
        ({"LOCAL_WORLD_SIZE": "4", "OMP_NUM_THREADS": "0"}, 8, 2),  # not a thread count: ignored
        ({"LOCAL_WORLD_SIZE": "many", "OMP_NUM_THREADS": ""}, 8, 8),
    ],
)
def test_threads_per_rank_shares_the_cores_between_the_ranks_of_a_node(environ, cpus, expected):
    assert threads_per_rank(0, environ, cpus) == expected


def test_threads_asked_for_win_over_everything():
    assert threads_per_rank(5, {"OMP_NUM_THREADS": "2", "LOCAL_WORLD_SIZE": "8"}, 1) == 5


def test_threads_per_rank_counts_the_cores_this_process_may_use():
    assert threads_per_rank(0, {}) == len(os.sched_getaffinity(0))


def _ddp(tmp_path, digits, *extra):
    cmd = [sys.executable, str(WORKLOADS / "ddp.py"), "--data-dir", str(digits), "--threads", "1", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)


@pytest.mark.slow_torch
def test_training_learns_and_resume_reproduces_the_uninterrupted_run(tmp_path, digits):
    full = _ddp(tmp_path, digits, "--epochs", "3", "--metrics", "full.jsonl", "--checkpoint", "full.pt")
    assert full.returncode == 0, full.stderr
    assert "1 CPU thread(s) on rank 0" in full.stdout
    part = _ddp(tmp_path, digits, "--epochs", "2", "--metrics", "part.jsonl", "--checkpoint", "part.pt")
    assert part.returncode == 0, part.stderr
    # As a rank killed after logging epoch 3 but before its checkpoint leaves it (--max-restarts
    # goes on from epoch 2's checkpoint): the stale record and half a line are dropped.
    with (tmp_path / "part.jsonl").open("a") as metrics:
        metrics.write('{"epoch": 3, "train_loss": 9.0}\n{"epoch": 4, "tra')
    other_rate = _ddp(tmp_path, digits, "--epochs", "3", "--resume", "part.pt", "--lr", "0.02", "--checkpoint", "rate.pt")
    assert other_rate.returncode == 0, other_rate.stderr
    # The rate is this run's, not the checkpoint's: --auto-scale-lr follows the ranks a restart has.
    assert torch.load(tmp_path / "rate.pt", weights_only=True)["optimizer"]["param_groups"][0]["lr"] == 0.02
    resumed = _ddp(tmp_path, digits, "--epochs", "3", "--resume", "part.pt", "--metrics", "part.jsonl", "--checkpoint", "part.pt")
    assert resumed.returncode == 0, resumed.stderr
    assert "from epoch 3" in resumed.stdout
    straight = [json.loads(line) for line in (tmp_path / "full.jsonl").read_text().splitlines()]
    pieced = [json.loads(line) for line in (tmp_path / "part.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in pieced] == [1, 2, 3]
    for a, b in zip(straight, pieced):
        assert (a["train_loss"], a["val_loss"], a["val_accuracy"]) == (b["train_loss"], b["val_loss"], b["val_accuracy"])
    assert straight[-1]["train_loss"] < straight[0]["train_loss"]
    assert straight[-1]["val_accuracy"] > 0.3  # chance is 0.1
    # Only tensors and plain types: it loads without unpickling arbitrary objects.
    state = torch.load(tmp_path / "full.pt", weights_only=True)
    assert state["epoch"] == 3 and {"model", "optimizer", "rng_torch", "rng_python"} <= set(state)
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("ranks", [1, 2, 8])
def test_the_default_batch_is_one_global_batch_shared_out_so_every_rank_count_takes_the_same_steps(digits, ranks):
    """`--batch-size` unset: 64 samples a step in all, whatever the ranks; so 8 ranks take as many
    steps an epoch of the 1,437 digits as 1 rank does (23), not 3 (64 each)."""
    from torch.utils.data import DataLoader, DistributedSampler

    from wl_loop import add_training_arguments, batch_per_rank

    parser = argparse.ArgumentParser()
    add_training_arguments(parser)
    args = parser.parse_args(["--data-dir", str(digits)])
    train = load_split(digits, "train")
    batch = batch_per_rank(args.batch_size, ranks)
    assert batch * ranks == 64
    steps = len(DataLoader(train, batch_size=batch, sampler=DistributedSampler(train, num_replicas=ranks, rank=0)))
    assert steps == 23
    # Asked for, --batch-size is each rank's, at any number of ranks.
    given = parser.parse_args(["--data-dir", str(digits), "--batch-size", "32"])
    assert batch_per_rank(given.batch_size, ranks) == 32
    # More ranks than the global batch has samples: one each.
    assert batch_per_rank(args.batch_size, 100) == 1


@pytest.mark.slow_torch
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epochs", "0"], "--epochs and --batch-size"),
        (["--threads", "-1"], "--threads must be 0"),
        (["--resume", "missing.pt"], "checkpoint missing.pt does not exist"),
    ],
)
def test_bad_workload_input_is_one_line_exit_2(tmp_path, digits, args, message):
    proc = _ddp(tmp_path, digits, *args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


class _RunsCode:
    """Unpickling this writes a file: what a hostile --resume file could do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


@pytest.mark.slow_torch
def test_resume_refuses_a_checkpoint_that_would_run_code(tmp_path, digits):
    marker = tmp_path / "pwned"
    torch.save({"model": {}, "epoch": 1, "payload": _RunsCode(marker)}, tmp_path / "evil.pt")
    assert not marker.exists()
    proc = _ddp(tmp_path, digits, "--epochs", "2", "--resume", "evil.pt")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "evil.pt is not a checkpoint this workload loads" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not marker.exists()


@pytest.mark.slow_torch
def test_missing_data_is_one_line_exit_2(tmp_path):
    proc = _ddp(tmp_path, tmp_path / "nothing")
    assert proc.returncode == 2 and "has no train-images-idx3-ubyte" in proc.stderr


@pytest.mark.slow_torch
def test_synthetic_benchmark_reports_throughput_with_its_spread(tmp_path):
    cmd = [sys.executable, str(WORKLOADS / "synthetic.py"), "--comm", "ddp", "--width", "8", "--image-size", "32",
           "--batch-size", "4", "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "3",
           "--threads", "1", "--metrics", "s.jsonl"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "img/s per rank:" in proc.stdout and "±" in proc.stdout
    assert "1 CPU thread(s) on rank 0" in proc.stdout
    record = json.loads((tmp_path / "s.jsonl").read_text())
    assert record["total_img_per_s"] > 0 and record["img_per_s_per_rank_ci95"] >= 0


@pytest.mark.parametrize(("text", "line"), [
    (b"garbage\n", 1),
    (b"0" * 64 + b"  train-images-idx3-ubyte\n" + b"abc  t10k\n", 2),
    (b"\xff\xfe", None),
])
def test_a_corrupt_sha256sums_is_one_line_naming_it(tmp_path, text, line):
    folder = digits_dataset(tmp_path)
    (folder / "SHA256SUMS").write_bytes(text)
    with pytest.raises(BadInput) as caught:
        digits_dataset(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{folder / 'SHA256SUMS'}{f':{line}' if line else ''}: ") and "\n" not in message
