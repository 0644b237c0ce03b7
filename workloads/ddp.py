"""The same digit training with torch DistributedDataParallel: start it with torchrun.

    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \
        ddp.py --data-dir DATA --epochs 3

Same model, data, metrics and checkpoints as mnist.py (Horovod), so the two can be compared.
With --elastic (torchrun --nnodes MIN:MAX --max-restarts N) every start of the ranks goes on
from the newest checkpoint (workloads/elastic.py).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from elastic import train_restartable  # noqa: E402
from wl_comm import TorchComm  # noqa: E402
from wl_errors import run  # noqa: E402
from wl_loop import add_training_arguments, check_arguments, train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_arguments(parser)
    parser.add_argument("--backend", choices=["gloo", "nccl"], help="default: nccl with GPUs, else gloo")
    parser.add_argument("--elastic", action="store_true",
                        help="each start goes on from the newest checkpoint (torchrun's agents start the ranks again)")
    args = parser.parse_args()
    check_arguments(args)
    comm = TorchComm(args.backend)
    (train_restartable if args.elastic else train)(comm, args)
    comm.close()


if __name__ == "__main__":
    run(main)
