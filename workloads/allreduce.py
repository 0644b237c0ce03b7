"""Allreduce bandwidth per message size, checked for correctness: nccl-tests' algbw and busbw.

    horovodrun --gloo -np 2 -H a:1,b:1 python allreduce.py               # Horovod over Gloo
    horovodrun --mpi  -np 2 -H a:1,b:1 python allreduce.py               # Horovod over MPI
    torchrun --nproc-per-node 2 allreduce.py --comm torch --backend gloo  # torch.distributed

For each size (default 4K..256M, doubling) every rank fills a float32 buffer with rank + 1 and
sums it over all n ranks; every element must then equal n·(n + 1)/2 on every rank, or the
job fails. Then --warmup untimed and --iters timed allreduces of a zero buffer (zeros stay
zeros: no overflow, no denormals). An iteration's time is the slowest rank's. As nccl-tests
defines them: algbw = bytes / time, busbw = algbw · 2(n − 1)/n, the bandwidth each link must
carry in a ring allreduce, comparable with the link's raw speed. Rank 0 prints and appends to
--metrics one JSON record per size.
"""

import argparse
import re
import socket
import statistics
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from wl_comm import HorovodComm, TorchComm, allgather_floats, allreduce_sum_, barrier, data_path  # noqa: E402
from wl_device import pick_device  # noqa: E402
from wl_errors import WorkloadError, run  # noqa: E402
from wl_metrics import Metrics  # noqa: E402

FLOAT32_BYTES = 4
_SIZE = re.compile(r"^(?P<number>[0-9]+)(?P<unit>[KMG]?)B?$", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """'4K', '256M', '1G' or a plain byte count (binary units, as nccl-tests reads -b/-e)."""
    match = _SIZE.match(text.strip())
    if not match:
        raise WorkloadError(f"size {text!r} is not a number with an optional K, M or G")
    return int(match["number"]) * _UNITS[match["unit"].upper()]


def size_ladder(spec: str) -> list[int]:
    """'MIN:MAX' (doubling from MIN up to MAX) or 'A,B,C'; each a whole number of float32s."""
    if ":" in spec:
        low_text, high_text = spec.split(":", 1)
        low, high = parse_size(low_text), parse_size(high_text)
        if low < 1 or high < low:
            raise WorkloadError(f"--sizes {spec}: need 0 < MIN <= MAX")
        sizes = []
        size = low
        while size <= high:
            sizes.append(size)
            size *= 2
    else:
        sizes = [parse_size(part) for part in spec.split(",") if part.strip()]
    if not sizes:
        raise WorkloadError(f"--sizes {spec!r} names no size")
    for size in sizes:
        if size < FLOAT32_BYTES or size % FLOAT32_BYTES:
            raise WorkloadError(f"size {size} B is not a whole number of float32 elements (4 bytes each)")
    return sizes


def bus_factor(ranks: int) -> float:
    """nccl-tests' allreduce bus factor 2(n − 1)/n: 0 for one rank, 1 for two, toward 2."""
    return 2 * (ranks - 1) / ranks


def human_size(size: int) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def ci95(values: list[float]) -> float:
    return 1.96 * statistics.stdev(values) if len(values) > 1 else 0.0


def size_record(size: int, ranks: int, iteration_times: list[float]) -> dict:
    """Bandwidths from the per-iteration times (each the slowest rank's) of one size."""
    mean_time = statistics.fmean(iteration_times)
    time_spread = ci95(iteration_times)
    algbw = size / mean_time / 1e9
    busbw = algbw * bus_factor(ranks)
    # The spread of a bandwidth follows from its time's: relative error carries over.
    relative = time_spread / mean_time
    return {
        "bytes": size,
        "time_s": mean_time,
        "time_s_ci95": time_spread,
        "algbw_gbps": algbw,
        "algbw_gbps_ci95": algbw * relative,
        "busbw_gbps": busbw,
        "busbw_gbps_ci95": busbw * relative,
    }


def wrong_elements(buffer: torch.Tensor, expected: float) -> int:
    return int((buffer != expected).sum().item())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comm", choices=["horovod", "torch"], default="horovod", help="who runs the collective")
    parser.add_argument("--backend", choices=["gloo", "nccl", "mpi"], help="torch.distributed backend (--comm torch)")
    parser.add_argument("--sizes", default="4K:256M", help="MIN:MAX doubling, or a comma list (K, M, G binary)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed allreduces per size")
    parser.add_argument("--iters", type=int, default=5, help="timed allreduces per size (at least 2, for a spread)")
    parser.add_argument("--cpu", action="store_true", help="keep buffers in host memory even with GPUs")
    parser.add_argument("--metrics", type=Path, default=Path("metrics.jsonl"))
    args = parser.parse_args()
    sizes = size_ladder(args.sizes)
    if args.warmup < 0 or args.iters < 2:
        raise WorkloadError("--warmup must be 0 or more and --iters at least 2")
    if args.comm == "horovod" and args.backend:
        raise WorkloadError("--backend is for --comm torch; horovodrun's --gloo/--mpi choose Horovod's")

    comm = HorovodComm() if args.comm == "horovod" else TorchComm(args.backend)
    # NCCL moves device memory; Gloo and MPI are measured on host buffers (as Horovod's CPU ops).
    wants_gpu = not args.cpu and (args.comm == "horovod" or comm.backend == "nccl")
    device = pick_device(comm.local_rank, force_cpu=not wants_gpu)
    path = data_path(comm, device)
    # Hosts are counted by a checksum of their names (exact in a float64), gathered as numbers.
    hosts = len({ids[0] for ids in allgather_floats(comm, [float(zlib.crc32(socket.gethostname().encode()))], "pycli.hosts")})
    log = Metrics(args.metrics, comm.rank)
    expected = comm.size * (comm.size + 1) / 2
    if comm.rank == 0:
        print(f"allreduce: {comm.size} rank(s) on {hosts} host(s) via {args.comm}/{path}, {device.type} buffers, "
              f"{len(sizes)} sizes {human_size(sizes[0])}..{human_size(sizes[-1])}, {args.iters} timed iterations each",
              flush=True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for size in sizes:
        elements = size // FLOAT32_BYTES
        name = f"pycli.allreduce.{size}"
        check = torch.full((elements,), float(comm.rank + 1), dtype=torch.float32, device=device)
        allreduce_sum_(comm, check, name)
        sync()
        wrong = [int(n[0]) for n in allgather_floats(comm, [float(wrong_elements(check, expected))], f"{name}.check")]
        if any(wrong):
            ranks = ", ".join(f"rank {r}: {n}" for r, n in enumerate(wrong) if n)
            raise SystemExit(f"allreduce of {human_size(size)} gave wrong sums ({ranks} of {elements} elements "
                             f"differ from {expected:g})")
        del check
        buffer = torch.zeros(elements, dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            allreduce_sum_(comm, buffer, name)
        sync()
        times = []
        for _ in range(args.iters):
            barrier(comm)
            began = time.perf_counter()
            allreduce_sum_(comm, buffer, name)
            sync()
            times.append(time.perf_counter() - began)
        slowest = [max(per_rank) for per_rank in zip(*allgather_floats(comm, times, f"{name}.times"), strict=True)]
        record = {"workload": "allreduce", "comm": args.comm, "backend": path, "device": device.type,
                  "ranks": comm.size, "hosts": hosts, "dtype": "float32", "iters": args.iters, "correct": True,
                  **size_record(size, comm.size, slowest)}
        log.log(record)
        del buffer
    comm.close()


if __name__ == "__main__":
    run(main)
