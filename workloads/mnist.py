"""MNIST-style digit classification with Horovod: start it with horovodrun or mpirun.

    horovodrun -np 4 -H a:2,b:2 python mnist.py --data-dir DATA --epochs 3 --auto-scale-lr

Every rank reads the same IDX files and trains on its DistributedSampler shard; gradients
are averaged by Horovod's DistributedOptimizer (optionally fp16-compressed), rank 0 logs,
writes metrics and checkpoints; --resume continues from a checkpoint; --elastic goes on
with the ranks left when some are lost (workloads/elastic.py).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from elastic import train_elastic  # noqa: E402
from wl_comm import HorovodComm  # noqa: E402
from wl_errors import run  # noqa: E402
from wl_loop import add_training_arguments, check_arguments, train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_training_arguments(parser)
    parser.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to fp16 for the allreduce")
    parser.add_argument("--backward-passes-per-step", type=int, default=1,
                        help="local gradient accumulation before each allreduce")
    parser.add_argument("--elastic", action="store_true",
                        help="go on when ranks are lost (start it with horovodrun --min-np/--max-np/--host-discovery-script)")
    args = parser.parse_args()
    check_arguments(args)
    comm = HorovodComm()
    (train_elastic if args.elastic else train)(comm, args)
    comm.close()


if __name__ == "__main__":
    run(main)
