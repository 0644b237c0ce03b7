"""The training loop through lost ranks: `pycli train --elastic` (mnist under horovodrun, ddp under torchrun).

Horovod (`horovodrun --min-np M --max-np N --host-discovery-script S`): the model, the
optimizer, the epoch and the metrics records live in an `hvd.elastic.TorchState`, committed
after every epoch. When a rank is lost, the others roll back to the last commit, Horovod forms
a new ring of the ranks left (at least --min-np), the data is split again over them and the
epoch the loss broke into is trained again. The processes that are left keep running.

torchrun (`--nnodes MIN:MAX --max-restarts R --rdzv-backend c10d`): each node's agent starts
its ranks again after a failure, with the nodes that meet at the next rendezvous. New
processes know nothing, so each start goes on from rank 0's checkpoint (written after every
epoch by the first rank of every node), sent with its metrics records to every rank.

Either way at most the epoch a loss broke into is done again, and every node's first rank
keeps the whole metrics file, so the results are whole on whichever node is rank 0 at the end.
"""

from __future__ import annotations

import os

from wl_checkpoint import load_checkpoint
from wl_loop import Training, rank0_start


def train_elastic(comm, args) -> dict:
    """Train as wl_loop.train does, through ranks leaving and joining; the last epoch's metrics."""
    hvd = comm.hvd
    # Each rank reads its own copy of --resume: the state's sync in hvd.elastic.run sends rank 0's
    # to all. A collective out here would meet the ranks that join later inside their sync.
    run = Training(comm, args, load_checkpoint(args.resume) if args.resume else None)
    # The metrics records are state too: a rollback drops those of the epoch done again, and a
    # rank that joins gets them all, so every node's copy of the metrics file is whole.
    state = hvd.elastic.TorchState(model=run.model, optimizer=run.optimizer, epoch=run.start_epoch,
                                   records=run.metrics.read(run.start_epoch))

    def on_reset() -> None:  # after the rollback, before rank 0's state is sent to every rank
        run.shard()
        run.set_lr()

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def epochs(state) -> dict:
        run.announce(state.epoch, f"{comm.name} (elastic)")
        record: dict = {}
        for epoch in range(state.epoch, args.epochs):
            record = run.epoch(epoch)
            state.records = [*state.records, record]  # a new list: the committed one stays as it was
            run.finish(epoch, record, state.records)
            state.epoch = epoch + 1
            state.commit()
        return record

    return epochs(state)


def train_restartable(comm, args) -> dict:
    """Under torchrun's elastic agents: go on from rank 0's checkpoint; the last epoch's metrics."""
    source = args.checkpoint if args.checkpoint and args.checkpoint.is_file() else args.resume  # this job's own, else --resume
    state, records = rank0_start(comm, args, source)
    run = Training(comm, args, state)
    if comm.local_rank == 0:
        run.metrics.write_all(records)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    run.announce(run.start_epoch, f"{comm.name} (elastic, start {attempt + 1})")
    for epoch in range(run.start_epoch, args.epochs):
        record = run.epoch(epoch)
        records.append(record)
        run.finish(epoch, record, records)
    return records[-1] if records else {}
