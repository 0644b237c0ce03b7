"""The training loop of the digit workloads, its arguments, and one run of it (`Training`).

The same loop runs under Horovod (mnist.py, started by horovodrun or mpirun) and under
torch.distributed (ddp.py, started by torchrun); the `comm` it is given (wl_comm.py) is
the only thing that differs. workloads/elastic.py goes through it again when ranks come and go.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, Subset

from wl_checkpoint import load_checkpoint, save_checkpoint
from wl_data import check_data_dir, load_split
from wl_device import autocast, peak_memory_mb, pick_device, threads_per_rank
from wl_errors import WorkloadError
from wl_metrics import Metrics
from wl_model import DigitNet

# Samples a step in all when --batch-size is not given: shared out between the ranks, so a job
# takes as many steps an epoch, at the same --lr, on 8 ranks as on 1 (the digits set's 1,437
# training samples are 23 steps of 64; at 64 per rank, 8 ranks took 3 and learned far less).
GLOBAL_BATCH = 64


def batch_per_rank(batch_size: int | None, ranks: int) -> int:
    """Each rank's batch: --batch-size as given, else GLOBAL_BATCH shared out (at least 1 each)."""
    return batch_size if batch_size is not None else max(1, GLOBAL_BATCH // ranks)


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=Path, required=True, help="folder with the MNIST IDX files")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"per rank (default: {GLOBAL_BATCH} a step in all, shared out between the ranks)")
    parser.add_argument("--lr", type=float, default=0.05, help="for one process; see --auto-scale-lr")
    parser.add_argument("--auto-scale-lr", action="store_true",
                        help="multiply the LR by the number of processes (meant with a --batch-size given per rank)")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast on CPU, fp16 + GradScaler on CUDA")
    parser.add_argument("--resume", type=Path, help="checkpoint to continue from (read on rank 0, sent to every rank)")
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoints/last.pt"),
                        help="written after each epoch by the first rank of every node")
    parser.add_argument("--metrics", type=Path, default=Path("metrics.jsonl"), help="JSON lines, one per epoch (rank 0)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--cpu", action="store_true", help="ignore GPUs")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads per rank (0: this node's cores shared out between its ranks)")


def check_arguments(args) -> None:
    """Refuse bad input before any process group is joined (so every rank fails the same way)."""
    if args.epochs < 1 or (args.batch_size is not None and args.batch_size < 1) or args.lr <= 0:
        raise WorkloadError("--epochs and --batch-size must be at least 1 and --lr above 0")
    if args.threads < 0:
        raise WorkloadError("--threads must be 0 (share this node's cores between its ranks) or more")
    if getattr(args, "backward_passes_per_step", 1) < 1:
        raise WorkloadError("--backward-passes-per-step must be at least 1")
    check_data_dir(args.data_dir)


def rank0_start(comm, args, source: Path | None) -> tuple[dict | None, list[dict]]:
    """The checkpoint at `source` on rank 0's node and the metrics records up to its epoch, on every rank.

    Every node keeps its own copy of the checkpoint, and a failure during a save can leave the
    copies at different epochs: only rank 0 reads one and sends it to all, so every rank goes on
    from the same weights and epoch. Rank 0's error stops every rank in one line, none waits."""
    def read() -> tuple[dict | None, list[dict]] | str:
        try:
            state = load_checkpoint(source) if source else None
        except WorkloadError as exc:
            return str(exc)
        return state, Metrics(args.metrics, 0).read(int(state["epoch"]) if state else 0)

    start = comm.broadcast_object(read() if comm.rank == 0 else None)
    if isinstance(start, str):
        raise WorkloadError(start)
    return start


class Training:
    """One run of DigitNet on the IDX data: its shard of the data, model, optimizer and metrics.

    `train` goes through the epochs once; workloads/elastic.py goes through them again from
    the last commit when ranks come and go, so the data is split by `shard` over the ranks
    there are now and the learning rate follows them (`set_lr`).
    """

    def __init__(self, comm, args, state: dict | None) -> None:
        """`state`: the checkpoint to go on from (`rank0_start` gives every rank rank 0's); None: from the start."""
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
        self.batch = batch_per_rank(args.batch_size, comm.size)  # the default follows the ranks there are now
        self.sampler = DistributedSampler(self.train_set, num_replicas=comm.size, rank=comm.rank, shuffle=True, seed=args.seed)
        self.loader = DataLoader(self.train_set, batch_size=self.batch, sampler=self.sampler)
        # Every rank takes the same number of optimizer steps, a whole number of accumulations.
        self.steps_per_epoch = (len(self.loader) // self.accumulate) * self.accumulate
        if self.steps_per_epoch == 0:
            raise WorkloadError(
                f"{len(self.train_set)} training samples are too few for {comm.size} ranks x batch {self.batch}")
        # Held-out data split without padding, so accuracy counts every sample exactly once.
        self.test_loader = DataLoader(Subset(self.test_set, range(comm.rank, len(self.test_set), comm.size)), batch_size=256)

    def announce(self, start_epoch: int, how: str) -> None:
        if self.comm.rank == 0:
            print(
                f"training on {self.comm.size} process(es) via {how}, device {self.device.type}, "
                f"{torch.get_num_threads()} CPU thread(s) on rank 0, "
                f"batch {self.batch} per rank ({self.batch * self.comm.size * self.accumulate} in all), "
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
        for step, (x, y) in zip(range(self.steps_per_epoch), self.loader, strict=False):
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
    state, _ = rank0_start(comm, args, args.resume)
    run = Training(comm, args, state)
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
