"""The two ways ranks talk: Horovod (`HorovodComm`) and torch.distributed (`TorchComm`).

The training loop (wl_loop.py) runs the same under either; these classes are the only places
that differ. The functions at the end run collectives on any tensor through either one
(workloads/allreduce.py).
"""

from __future__ import annotations

import gc
import os
import time

import torch
from torch import nn

# torch.distributed ranks meet here after tearing their process group down (TorchComm.close).
CLOSED_KEY = "pycli/closed"
CLOSE_TIMEOUT_S = 60


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

    def broadcast_object(self, value):
        """Rank 0's `value` (any picklable object, tensors too) on every rank."""
        # Named: Horovod matches collectives by name, and its default is the type of the value,
        # which differs between rank 0 and the ranks that pass None.
        return self.hvd.broadcast_object(value, root_rank=0, name="pycli.object")

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
        # DDP broadcasts rank 0's parameters when it wraps the model; a checkpoint loaded after
        # that is rank 0's on every rank (wl_loop.rank0_start).
        return DistributedDataParallel(model, device_ids=ids), optimizer

    def broadcast_state(self, model: nn.Module, optimizer) -> None:
        """DDP broadcast rank 0's weights when it wrapped the model; after --resume every rank
        loaded the checkpoint rank 0 sent (wl_loop.rank0_start), so there is nothing left to send."""

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
