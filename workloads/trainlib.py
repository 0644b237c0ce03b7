"""The names the workloads once took from one module, now each from its own part:

    wl_idx.py         the IDX format (shared with pycli/datasets.py; no torch)
    wl_data.py        IDX files as torch datasets
    wl_model.py       DigitNet
    wl_device.py      device, mixed precision, peak memory, CPU threads per rank
    wl_comm.py        Horovod and torch.distributed, and collectives through either
    wl_metrics.py     the metrics file
    wl_checkpoint.py  checkpoints
    wl_loop.py        arguments, one run of the training loop (`Training`), `train`
    wl_errors.py      WorkloadError and how a workload ends on one

Kept so that workloads/allreduce.py and scripts written against `trainlib` go on working;
new code imports from the parts. The workloads folder travels to the nodes whole, so every
part goes with it.
"""

from wl_checkpoint import load_checkpoint, save_checkpoint
from wl_comm import HorovodComm, TorchComm, allgather_floats, allreduce_sum_, barrier, data_path
from wl_data import SPLITS, load_split, read_idx
from wl_device import autocast, peak_memory_mb, pick_device, threads_per_rank
from wl_errors import WorkloadError, run
from wl_loop import Training, add_training_arguments, check_arguments, train
from wl_metrics import Metrics
from wl_model import DigitNet

__all__ = [
    "SPLITS", "DigitNet", "HorovodComm", "Metrics", "TorchComm", "Training", "WorkloadError", "add_training_arguments",
    "allgather_floats", "allreduce_sum_", "autocast", "barrier", "check_arguments", "data_path", "load_checkpoint",
    "load_split", "peak_memory_mb", "pick_device", "read_idx", "run", "save_checkpoint", "threads_per_rank", "train",
]
