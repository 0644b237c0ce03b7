"""What the training workloads share: data, model, the training loop, metrics and checkpoints.

The same loop runs under Horovod (mnist.py, started by horovodrun or mpirun) and under
torch.distributed (ddp.py, started by torchrun); `HorovodComm` and `TorchComm` are the only
places that differ. Nothing here downloads anything: data comes from IDX files on disk.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import json
import math
import os
import pickle
import random
import re
import resource
import struct
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

SPLITS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
IDX_UBYTE = 0x08
# How many ranks run on this node, as each launcher says: mpirun (and horovodrun over MPI),
# horovodrun with Gloo, torchrun.
# torch.distributed ranks meet here after tearing their process group down (TorchComm.close).
CLOSED_KEY = "pycli/closed"
CLOSE_TIMEOUT_S = 60
LOCAL_SIZE_VARIABLES = ("OMPI_COMM_WORLD_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE")


class WorkloadError(Exception):
    """A problem with the workload's input, reported as one line by `run()`."""


# --- data --------------------------------------------------------------------------------


def read_idx(path: Path) -> torch.Tensor:
    """An unsigned-byte IDX file (the MNIST format), plain or gzipped, as a uint8 tensor."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != IDX_UBYTE:
        raise WorkloadError(f"{path} is not an unsigned-byte IDX file")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    body = data[4 + 4 * ndim :]
    if len(body) != math.prod(dims):
        raise WorkloadError(f"{path} holds {len(body)} bytes of data, its header says {math.prod(dims)}")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(dims)


def _find(data_dir: Path, name: str) -> Path:
    for candidate in (data_dir / name, data_dir / f"{name}.gz"):
        if candidate.exists():
            return candidate
    raise WorkloadError(f"{data_dir} has no {name}[.gz]; give --data-dir a folder with the MNIST IDX files")


def load_split(data_dir: Path, split: str) -> TensorDataset:
    images_name, labels_name = SPLITS[split]
    images = read_idx(_find(data_dir, images_name))
    labels = read_idx(_find(data_dir, labels_name))
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise WorkloadError(f"{data_dir}: {split} images {tuple(images.shape)} do not match labels {tuple(labels.shape)}")
    x = (images.float().div(255.0).sub(0.5).div(0.5)).unsqueeze(1)
    return TensorDataset(x, labels.long())


# --- model -------------------------------------------------------------------------------


class DigitNet(nn.Module):
    """A small CNN for 1-channel digits of any size from 8x8 (sklearn digits) to 28x28 (MNIST)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 16, 128), nn.ReLU(), nn.Linear(128, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


# --- devices and precision ---------------------------------------------------------------


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


# --- the two ways to run distributed -----------------------------------------------------


class HorovodComm:
    """Horovod: horovodrun or mpirun starts the ranks; gradients averaged by DistributedOptimizer."""

    name = "horovod"

    def __init__(self) -> None:
        import horovod.torch as hvd

        self.hvd = hvd
        hvd.init()

    # Asked each time: under horovodrun --elastic they change when ranks come and go.
    @property
    def rank(self) -> int:
        return self.hvd.rank()

    @property
    def size(self) -> int:
        return self.hvd.size()

    @property
    def local_rank(self) -> int:
        return self.hvd.local_rank()

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer, args) -> tuple[nn.Module, torch.optim.Optimizer]:
        hvd = self.hvd
        compression = hvd.Compression.fp16 if getattr(args, "fp16_allreduce", False) else hvd.Compression.none
        # A new optimizer of the same class over the same parameter groups: any state the
        # old one held is not carried over, so checkpoints are loaded after wrapping.
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=compression,
            backward_passes_per_step=getattr(args, "backward_passes_per_step", 1),
        )
        return model, optimizer

    def broadcast_state(self, model: nn.Module, optimizer) -> None:
        """Every rank starts from rank 0's weights and optimizer state (also after --resume)."""
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def step(self, optimizer, scaler) -> None:
        if scaler is None:
            optimizer.step()
            return
        # The gradients must be averaged before the scaler looks at them.
        optimizer.synchronize()
        scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        scaler.update()

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    def sum(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64)
        return self.hvd.allreduce(tensor, op=self.hvd.Sum, name="pycli.sum").tolist()

    def gather(self, value):
        return self.hvd.allgather_object(value)

    def close(self) -> None:
        self.hvd.shutdown()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class TorchComm:
    """torch.distributed under torchrun: NCCL on GPUs, Gloo on CPUs; DDP averages gradients."""

    name = "ddp"

    def __init__(self, backend: str | None = None) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if "RANK" not in os.environ:
            # Started as a plain script: a world of one, on this machine.
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group(self.backend)
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = None

    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer, args) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.nn.parallel import DistributedDataParallel

        device = next(model.parameters()).device
        self.device = device
        ids = [device.index] if device.type == "cuda" else None
        # DDP broadcasts rank 0's parameters when it wraps the model; optimizer state comes
        # from the same checkpoint file on every rank.
        return DistributedDataParallel(model, device_ids=ids), optimizer

    def broadcast_state(self, model: nn.Module, optimizer) -> None:
        """DDP broadcast rank 0's weights when it wrapped the model; after --resume every rank
        loaded the same checkpoint file, so there is nothing left to send."""

    def broadcast_object(self, value):
        """Rank 0's `value` (any picklable object, tensors too) on every rank."""
        box = [value]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def step(self, optimizer, scaler) -> None:
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module

    def _collective_device(self) -> torch.device:
        return self.device if self.backend == "nccl" and self.device is not None else torch.device("cpu")

    def sum(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        self.dist.all_reduce(tensor)
        return tensor.cpu().tolist()

    def gather(self, value):
        found = [None] * self.size
        self.dist.all_gather_object(found, value)
        return found

    def close(self) -> None:
        # DDP's reducer lives in a reference cycle: free it (and the Gloo work it holds) now,
        # while the interpreter is whole; freed at exit it can abort the process (SIGABRT).
        gc.collect()
        # Every rank done with every collective before any rank tears its connections down,
        # and none exits (closing its sockets) while another still tears its group down.
        self.dist.barrier()
        store = self.dist.distributed_c10d._get_default_store()
        self.dist.destroy_process_group()
        store.add(CLOSED_KEY, 1)
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        while store.add(CLOSED_KEY, 0) < self.size and time.monotonic() < deadline:
            time.sleep(0.05)


# --- metrics and checkpoints -------------------------------------------------------------


class Metrics:
    """Rank 0 prints a line and appends a JSON record per epoch; other ranks stay quiet."""

    def __init__(self, path: Path | None, rank: int) -> None:
        self.path, self.rank = path, rank
        if path and rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)

    def read(self, until_epoch: int) -> list[dict]:
        """The records of epochs up to `until_epoch` in this node's file (none where there is none)."""
        if not self.path or not self.path.is_file():
            return []
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # half a line, written as the rank was killed
                continue
            if isinstance(record, dict) and record.get("epoch", 0) <= until_epoch:
                kept.append(record)
        return kept

    def keep_until(self, epoch: int) -> None:
        """Drop records of epochs after `epoch`: a restart from that checkpoint does them again."""
        if self.rank != 0 or not self.path or not self.path.is_file():
            return
        kept = self.read(epoch)
        if len(kept) != len(self.path.read_text().splitlines()):
            self.write_all(kept)

    def write_all(self, records: list[dict]) -> None:
        """The file holds exactly `records`, replaced in one step (the same on every node that writes it)."""
        if not self.path:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(json.dumps(record) + "\n" for record in records))
        os.replace(tmp, self.path)

    @staticmethod
    def show(record: dict) -> None:
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()), flush=True)

    def log(self, record: dict) -> None:
        if self.rank != 0:
            return
        self.show(record)
        if self.path:
            with self.path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")


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


# --- the training loop -------------------------------------------------------------------


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, required=True, help="folder with the MNIST IDX files")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="for one process; see --auto-scale-lr")
    parser.add_argument("--auto-scale-lr", action="store_true", help="multiply the LR by the number of processes")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast on CPU, fp16 + GradScaler on CUDA")
    parser.add_argument("--resume", type=Path, help="checkpoint to continue from")
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoints/last.pt"),
                        help="written after each epoch by the first rank of every node")
    parser.add_argument("--metrics", type=Path, default=Path("metrics.jsonl"), help="JSON lines, one per epoch (rank 0)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--cpu", action="store_true", help="ignore GPUs")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads per rank (0: this node's cores shared out between its ranks)")


def check_arguments(args) -> None:
    """Refuse bad input before any process group is joined (so every rank fails the same way)."""
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        raise WorkloadError("--epochs and --batch-size must be at least 1 and --lr above 0")
    if args.threads < 0:
        raise WorkloadError("--threads must be 0 (share this node's cores between its ranks) or more")
    if getattr(args, "backward_passes_per_step", 1) < 1:
        raise WorkloadError("--backward-passes-per-step must be at least 1")
    for split in SPLITS.values():
        for name in split:
            _find(args.data_dir, name)
    if args.resume and not args.resume.is_file():
        raise WorkloadError(f"checkpoint {args.resume} does not exist on this node")


class Training:
    """One run of DigitNet on the IDX data: its shard of the data, model, optimizer and metrics.

    `train` goes through the epochs once; workloads/elastic.py goes through them again from
    the last commit when ranks come and go, so the data is split by `shard` over the ranks
    there are now and the learning rate follows them (`set_lr`).
    """

    def __init__(self, comm, args, state: dict | None = None) -> None:
        """`state`: a checkpoint already loaded (workloads/elastic.py); else --resume's, if given."""
        torch.set_num_threads(threads_per_rank(args.threads))
        torch.manual_seed(args.seed)
        random.seed(args.seed)
        self.comm, self.args = comm, args
        self.device = pick_device(comm.local_rank, args.cpu)
        self.train_set, self.test_set = load_split(args.data_dir, "train"), load_split(args.data_dir, "test")
        self.accumulate = max(1, getattr(args, "backward_passes_per_step", 1))
        self.shard()

        model = DigitNet().to(self.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=self.lr(), momentum=0.9)
        self.scaler = torch.amp.GradScaler("cuda") if args.amp and self.device.type == "cuda" else None
        self.model, self.optimizer = comm.wrap(model, optimizer, args)
        self.start_epoch = 0
        if state is None and args.resume:
            state = load_checkpoint(args.resume)
        if state is not None:
            comm.unwrap(self.model).load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.start_epoch = int(state["epoch"])
            torch.set_rng_state(state["rng_torch"])
            random.setstate(state["rng_python"])
            if self.scaler is not None and state.get("scaler"):
                self.scaler.load_state_dict(state["scaler"])
            self.set_lr()  # this run's rate: --auto-scale-lr follows the ranks there are now
        self.metrics = Metrics(args.metrics, comm.rank)

    def lr(self) -> float:
        scale = self.comm.size * self.accumulate if self.args.auto_scale_lr else 1
        return self.args.lr * scale

    def set_lr(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr()

    def shard(self) -> None:
        """This rank's part of the data, for the ranks there are now."""
        comm, args = self.comm, self.args
        self.sampler = DistributedSampler(self.train_set, num_replicas=comm.size, rank=comm.rank, shuffle=True, seed=args.seed)
        self.loader = DataLoader(self.train_set, batch_size=args.batch_size, sampler=self.sampler)
        # Every rank takes the same number of optimizer steps, a whole number of accumulations.
        self.steps_per_epoch = (len(self.loader) // self.accumulate) * self.accumulate
        if self.steps_per_epoch == 0:
            raise WorkloadError(f"{len(self.train_set)} training samples are too few for {comm.size} ranks x batch {args.batch_size}")
        # Held-out data split without padding, so accuracy counts every sample exactly once.
        self.test_loader = DataLoader(Subset(self.test_set, range(comm.rank, len(self.test_set), comm.size)), batch_size=256)

    def announce(self, start_epoch: int, how: str) -> None:
        if self.comm.rank == 0:
            print(
                f"training on {self.comm.size} process(es) via {how}, device {self.device.type}, "
                f"{torch.get_num_threads()} CPU thread(s) on rank 0, "
                f"{len(self.train_set)} train / {len(self.test_set)} test samples, from epoch {start_epoch + 1}",
                flush=True,
            )

    def epoch(self, epoch: int) -> dict:
        """Train and evaluate one epoch (0-based); the metrics record of it, the same on every rank."""
        comm, args, device, model, optimizer, scaler = self.comm, self.args, self.device, self.model, self.optimizer, self.scaler
        accumulate = self.accumulate
        self.sampler.set_epoch(epoch)
        model.train()
        step_times, loss_sum, seen = [], 0.0, 0
        epoch_start = time.perf_counter()
        for step, (x, y) in zip(range(self.steps_per_epoch), self.loader):
            began = time.perf_counter()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with autocast(device, args.amp):
                loss = F.cross_entropy(model(x), y)
            (scaler.scale(loss) if scaler else loss).div(accumulate).backward()
            if (step + 1) % accumulate == 0:
                comm.step(optimizer, scaler)
                optimizer.zero_grad()  # Horovod 0.28.1 takes no set_to_none (torch 2.x clears to None anyway)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            step_times.append(time.perf_counter() - began)
            loss_sum += loss.item() * len(y)
            seen += len(y)
        epoch_time = time.perf_counter() - epoch_start

        model.eval()
        correct, total, val_loss = 0, 0, 0.0
        with torch.no_grad():
            for x, y in self.test_loader:
                x, y = x.to(device), y.to(device)
                with autocast(device, args.amp):
                    out = model(x)
                val_loss += F.cross_entropy(out.float(), y, reduction="sum").item()
                correct += (out.argmax(1) == y).sum().item()
                total += len(y)
        sums = comm.sum([loss_sum, seen, val_loss, correct, total, sum(step_times), len(step_times), epoch_time])
        t_loss, t_seen, v_loss, v_correct, v_total, time_sum, steps, epoch_time_sum = sums
        mean_step = time_sum / steps
        step_var = comm.sum([sum((t - mean_step) ** 2 for t in step_times)])[0] / max(1, steps - 1)
        memory = comm.gather(peak_memory_mb(device))
        return {
            "epoch": epoch + 1,
            "ranks": comm.size,
            "launcher": comm.name,
            "device": device.type,
            "train_loss": t_loss / t_seen,
            "val_loss": v_loss / v_total,
            "val_accuracy": v_correct / v_total,
            "step_time_s": mean_step,
            "step_time_std_s": math.sqrt(step_var),
            "samples_per_s": t_seen / (epoch_time_sum / comm.size),
            "peak_memory_mb": max(memory),
            "amp": bool(args.amp),
        }

    def finish(self, epoch: int, record: dict, every_record: list[dict] | None = None) -> None:
        """Log the epoch (rank 0) and write the checkpoint after it.

        With `every_record` (workloads/elastic.py, where rank 0 may move to another node), the
        first rank of every node writes the whole metrics file, as it does the checkpoint."""
        if every_record is None:
            self.metrics.log(record)
        else:
            if self.comm.rank == 0:
                self.metrics.show(record)
            if self.comm.local_rank == 0:
                self.metrics.write_all(every_record)
        # One copy on every node (each node's first rank writes it): a restart after a node is
        # lost goes on from the copy on whichever node is rank 0 then.
        if self.comm.local_rank == 0 and self.args.checkpoint:
            save_checkpoint(self.args.checkpoint, self.comm.unwrap(self.model), self.optimizer, epoch + 1, self.args, self.scaler)


def train(comm, args) -> dict:
    """Train DigitNet on the IDX data; return the last epoch's metrics."""
    run = Training(comm, args)
    if args.resume and run.start_epoch >= args.epochs:
        raise WorkloadError(f"{args.resume} already finished epoch {run.start_epoch}; ask for more --epochs")
    comm.broadcast_state(run.model, run.optimizer)
    run.metrics.keep_until(run.start_epoch)
    run.announce(run.start_epoch, comm.name)
    record: dict = {}
    for epoch in range(run.start_epoch, args.epochs):
        record = run.epoch(epoch)
        run.finish(epoch, record)
    return record


def run(main) -> None:
    """Run a workload's main(); its own input errors end as one line and exit code 2."""
    try:
        main()
    except WorkloadError as exc:
        print(f"{Path(sys.argv[0]).name}: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)


# --- collectives on arbitrary tensors (workloads/allreduce.py) ---------------------------


def allreduce_sum_(comm, tensor: torch.Tensor, name: str) -> torch.Tensor:
    """Sum `tensor` over every rank in place, through the job's own collective library.

    Horovod picks the data path by where the tensor lives (NCCL for CUDA tensors when built
    with it, else the controller's MPI or Gloo); torch.distributed uses its process group.
    """
    if comm.name == "horovod":
        return comm.hvd.allreduce_(tensor, op=comm.hvd.Sum, name=name)
    comm.dist.all_reduce(tensor)
    return tensor


def barrier(comm) -> None:
    """Every rank waits here for the others (so timing starts together)."""
    if comm.name == "horovod":
        comm.hvd.barrier()
    else:
        comm.dist.barrier()


def data_path(comm, device: torch.device) -> str:
    """The library that moves an allreduce's bytes: nccl, gloo or mpi."""
    if comm.name != "horovod":
        return comm.backend
    hvd = comm.hvd
    if device.type == "cuda" and hvd.nccl_built():
        return "nccl"
    return "gloo" if hvd.gloo_enabled() else "mpi"


def allgather_floats(comm, values: list[float], name: str) -> list[list[float]]:
    """Every rank's list of numbers (the same length on each), in rank order.

    A tensor allgather: unlike `gather` (allgather_object) it needs neither NumPy, which
    Horovod's object gather uses and a node may lack, nor pickling.
    """
    on_gpu = comm.name != "horovod" and comm.backend == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if comm.name == "horovod":
        gathered = comm.hvd.allgather(tensor.unsqueeze(0), name=name)
    else:
        parts = [torch.empty_like(tensor) for _ in range(comm.size)]
        comm.dist.all_gather(parts, tensor)
        gathered = torch.stack(parts)
    return gathered.cpu().tolist()
