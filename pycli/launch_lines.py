"""The one place that builds launcher command lines: horovodrun, mpirun and torchrun."""

from __future__ import annotations

# horovodrun's controllers (--gloo, --mpi): how its ranks find each other and coordinate.
# Not the collective library that moves the tensors (`pycli bench --backends`).
HOROVOD_CONTROLLERS = ("gloo", "mpi")
