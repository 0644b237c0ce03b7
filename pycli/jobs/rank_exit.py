"""Which rank ended a job first, on which host, and how: read from what its launcher printed.

horovodrun, mpirun and torchrun each say it in their own words, and only there: the
launcher's own exit code tells just that something failed. The reader follows a job's output
line by line (the console's lines, with pycli's `[host] ` prefix or without it) and keeps the
first failure it sees.
"""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from pycli.cluster.model import Host
from pycli.cluster.nodes import SSH_FAILED

# horovodrun --gloo, per rank as it fails: "Process 1 exit with status code 137."
_HOROVOD_GLOO = re.compile(r"\bProcess (\d+) exit with status code (-?\d+)\.")
# mpirun (also under horovodrun --mpi), a rank killed by a signal:
# "mpirun noticed that process rank 1 with PID 4242 on node 10.0.0.2 exited on signal 9 (Killed)."
_MPI_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
# mpirun, a rank that exited non-zero: "Process name: [[4711,1],1]" then "Exit code:    3".
_MPI_NAME = re.compile(r"Process name:\s+\[\[\d+,\d+\],(\d+)\]")
_MPI_CODE = re.compile(r"^\s*Exit code:\s+(-?\d+)")
# torchrun's summary: "Root Cause (first observed failure):", then "host : node2",
# "rank : 1 (local_rank: 0)", "exitcode : -9 (pid: 4242)".
_TORCH_ROOT = re.compile(r"Root Cause \(first observed failure\)")
_TORCH_FIELD = re.compile(r"^\s*(host|rank|exitcode)\s*:\s*(\S+)")
_PREFIX = re.compile(r"^\[[^\]\s]+\] ")  # pycli's "[node1] " before each line of a per-node launcher


def rank_hosts(hosts: Sequence[Host]) -> list[str]:
    """The host of each rank of a job on `hosts` (as hostfiles.fill_slots left them), placed as
    horovodrun and mpirun (`-map-by slot`) place them: each host's slots in turn."""
    return [host.name for host in hosts for _ in range(host.slots)]


@dataclass(frozen=True)
class RankExit:
    rank: int
    host: str
    code: int  # the exit status as the launcher saw it: negative (Python) or 128+N (a shell) for a signal

    @property
    def signal(self) -> int | None:
        if self.code < 0:
            number = -self.code
        elif 128 < self.code < 128 + 65:
            number = self.code - 128
        else:
            return None
        return number if 0 < number < 65 else None

    def describe(self) -> str:
        where = f"rank {self.rank} on {self.host}"
        if self.code == SSH_FAILED:  # a rank started over ssh: ssh says 255 for a signal and for a lost node alike
            return f"{where} ended with exit {SSH_FAILED} (ssh's: the rank was killed by a signal, or the node stopped answering)"
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            # A shell's 128+N is shown as it was seen; a launcher that names the signal needs no number.
            return f"{where} was killed by {name}" + (f" (exit {self.code})" if self.code > 0 else "")
        return f"{where} exited {self.code}"


class RankExitReader:
    """Feed it a job's output lines; `first` is the first rank failure its launcher reported."""

    def __init__(self, hosts: Sequence[Host]) -> None:
        self.by_rank = rank_hosts(hosts)
        self.names = {name: host.name for host in hosts for name in (host.name, host.address)}
        self.first: RankExit | None = None
        self._mpi_rank: int | None = None
        self._torch: dict[str, str] | None = None

    def _host(self, rank: int, said: str | None = None) -> str:
        if said is not None:  # torchrun says the node's own name, maybe with its domain
            return self.names.get(said) or self.names.get(said.split(".")[0]) or said
        return self.by_rank[rank] if 0 <= rank < len(self.by_rank) else "an unknown host"

    def _found(self, rank: int, code: int, said: str | None = None) -> None:
        if self.first is None:
            self.first = RankExit(rank, self._host(rank, said), code)

    def feed(self, line: str) -> None:
        if self.first is not None:
            return
        line = _PREFIX.sub("", line.rstrip("\n"))
        if match := _HOROVOD_GLOO.search(line):
            self._found(int(match[1]), int(match[2]))
        elif match := _MPI_SIGNAL.search(line):
            self._found(int(match[1]), -int(match[3]), match[2])
        elif match := _MPI_NAME.search(line):
            self._mpi_rank = int(match[1])
        elif self._mpi_rank is not None and (match := _MPI_CODE.search(line)):
            self._found(self._mpi_rank, int(match[1]))
        elif _TORCH_ROOT.search(line):
            self._torch = {}
        elif self._torch is not None and (match := _TORCH_FIELD.search(line)):
            self._torch[match[1]] = match[2]
            if {"host", "rank", "exitcode"} <= self._torch.keys():
                fields, self._torch = self._torch, None
                with contextlib.suppress(ValueError):
                    self._found(int(fields["rank"]), int(fields["exitcode"]), fields["host"])
