"""The deep check's pair probe (pycli/health/deep.py): one rank of a two-rank allreduce between
two nodes, torch.distributed over NCCL on the first GPU, else Gloo on the CPU.

    python pair_allreduce.py RANK MASTER PORT BYTES ITERS

Rank 0 listens on MASTER:PORT. After one warm-up, ITERS timed allreduces of BYTES; the bus
bandwidth comes from allreduce.py's arithmetic (nccl-tests' busbw: for two ranks, bytes /
time). Prints one JSON line, {"busbw_gbps": ..., "backend": ...}.
"""

import datetime
import json
import sys
import time

import torch
import torch.distributed as dist

from allreduce import FLOAT32_BYTES, size_record

WORLD_SIZE = 2
RENDEZVOUS_TIMEOUT_S = 60


def main() -> None:
    rank, master, port, size, iters = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{master}:{port}", rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT_S))
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    data = torch.ones(size // FLOAT32_BYTES, dtype=torch.float32, device=device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    dist.all_reduce(data)
    sync()
    times = []
    for _ in range(iters):
        began = time.perf_counter()
        dist.all_reduce(data)
        sync()
        times.append(time.perf_counter() - began)
    dist.destroy_process_group()
    record = size_record(size, WORLD_SIZE, times)
    print(json.dumps({"busbw_gbps": record["busbw_gbps"], "backend": backend}))


if __name__ == "__main__":
    main()
