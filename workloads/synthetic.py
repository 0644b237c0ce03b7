"""Synthetic throughput benchmark: a ResNet-style model on random images, no data on disk.

    horovodrun -np 2 -H a:1,b:1 python synthetic.py            # Horovod (default)
    torchrun --nproc-per-node 2 synthetic.py --comm ddp         # DDP

Warm-up batches first, then --num-iters timed iterations of --num-batches-per-iter steps.
Prints img/s per rank and in total as mean ± 1.96·σ over the iterations (a 95% interval),
and appends one JSON record to --metrics (rank 0).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from wl_comm import HorovodComm, TorchComm  # noqa: E402
from wl_device import autocast, peak_memory_mb, pick_device, threads_per_rank  # noqa: E402
from wl_errors import WorkloadError, run  # noqa: E402
from wl_metrics import Metrics  # noqa: E402


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """ResNet-18's shape (four stages of two basic blocks) at a width set by --width."""

    def __init__(self, width: int = 32, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers, cin = [], width
        for stage, cout in enumerate((width, width * 2, width * 4, width * 8)):
            stride = 1 if stage == 0 else 2
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comm", choices=["horovod", "ddp"], default="horovod", help="who averages the gradients")
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=32, help="channels of the first stage (64 is ResNet-18)")
    parser.add_argument("--num-warmup-batches", type=int, default=3)
    parser.add_argument("--num-batches-per-iter", type=int, default=5)
    parser.add_argument("--num-iters", type=int, default=5)
    parser.add_argument("--fp16-allreduce", action="store_true")
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads per rank (0: this node's cores shared out between its ranks)")
    parser.add_argument("--metrics", type=Path, default=Path("metrics.jsonl"))
    args = parser.parse_args()
    if min(args.batch_size, args.image_size, args.num_batches_per_iter, args.num_iters) < 1 or args.num_iters < 2:
        raise WorkloadError("sizes and counts must be positive, and --num-iters at least 2 (for a spread)")
    if args.threads < 0:
        raise WorkloadError("--threads must be 0 (share this node's cores between its ranks) or more")
    args.backward_passes_per_step = 1
    torch.set_num_threads(threads_per_rank(args.threads))

    comm = HorovodComm() if args.comm == "horovod" else TorchComm()
    device = pick_device(comm.local_rank, args.cpu)
    torch.manual_seed(0)
    model = SmallResNet(args.width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * comm.size)
    model, optimizer = comm.wrap(model, optimizer, args)
    comm.broadcast_state(model, optimizer)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    target = torch.randint(0, 1000, (args.batch_size,), device=device)
    log = Metrics(args.metrics, comm.rank)

    def step() -> None:
        optimizer.zero_grad()  # Horovod 0.28.1 takes no set_to_none (torch 2.x clears to None anyway)
        with autocast(device, args.amp):
            loss = F.cross_entropy(model(data), target)
        loss.backward()
        comm.step(optimizer, None)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if comm.rank == 0:
        print(f"synthetic: SmallResNet(width={args.width}) {args.image_size}px, batch {args.batch_size} per rank, "
              f"{comm.size} rank(s) via {comm.name}, device {device.type}, {torch.get_num_threads()} CPU thread(s) on rank 0",
              flush=True)
    for _ in range(args.num_warmup_batches):
        step()
    rates, step_times = [], []
    for i in range(args.num_iters):
        began = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            step()
        elapsed = time.perf_counter() - began
        step_times.append(elapsed / args.num_batches_per_iter)
        rates.append(args.batch_size * args.num_batches_per_iter / elapsed)
        if comm.rank == 0:
            print(f"iter {i + 1}: {rates[-1]:.1f} img/s per rank", flush=True)
    # Each rank's mean rate, then mean and spread over ranks x iterations.
    all_rates = [r for rank_rates in comm.gather(rates) for r in rank_rates]
    mean, spread = statistics.fmean(all_rates), 1.96 * statistics.stdev(all_rates)
    memory = max(comm.gather(peak_memory_mb(device)))
    if comm.rank == 0:
        print(f"img/s per rank: {mean:.1f} ± {spread:.1f}", flush=True)
        print(f"total img/s on {comm.size} rank(s): {comm.size * mean:.1f} ± {comm.size * spread:.1f}", flush=True)
    log.log({
        "workload": "synthetic",
        "ranks": comm.size,
        "launcher": comm.name,
        "device": device.type,
        "img_per_s_per_rank": mean,
        "img_per_s_per_rank_ci95": spread,
        "total_img_per_s": comm.size * mean,
        "step_time_s": statistics.fmean(step_times),
        "peak_memory_mb": memory,
    })
    comm.close()


if __name__ == "__main__":
    run(main)
