"""The same digit training with torch DistributedDataParallel: start it with torchrun.

    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \
        ddp.py --data-dir DATA --epochs 3

Same model, data, metrics and checkpoints as mnist.py (Horovod), so the two can be compared.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainlib import TorchComm, add_training_arguments, check_arguments, run, train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_arguments(parser)
    parser.add_argument("--backend", choices=["gloo", "nccl"], help="default: nccl with GPUs, else gloo")
    args = parser.parse_args()
    check_arguments(args)
    comm = TorchComm(args.backend)
    train(comm, args)
    comm.close()


if __name__ == "__main__":
    run(main)
