"""The deep check's compute probe (pycli/health/deep.py): a float32 matrix multiply repeated for
SECONDS on every GPU of the node, else on its CPU cores.

    python compute_probe.py SECONDS

Prints one JSON line, {"device": GFLOP/s, ...}, for every device measured.
"""

import json
import sys
import time

import torch


def rate(device: torch.device, seconds: float) -> float:
    """GFLOP/s of a square matmul on `device`: 2·n³ operations a product, as many as fit in `seconds`."""
    n = 2048 if device.type == "cuda" else 256
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(3):  # warm-up: kernels loaded, clocks up
        a @ b
    sync()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(8):
            a @ b
        sync()
        count += 8
    return 2 * n**3 * count / (time.perf_counter() - start) / 1e9


def main() -> None:
    seconds = float(sys.argv[1])
    devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())] or [torch.device("cpu")]
    print(json.dumps({str(device): rate(device, seconds) for device in devices}))


if __name__ == "__main__":
    main()
