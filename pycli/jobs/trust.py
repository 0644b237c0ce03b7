"""Whether the launcher node can log in to the job's other nodes, as horovodrun and mpirun will.

horovodrun, and mpirun outside Slurm, start the other nodes' ranks over SSH from the launcher
node (the plan's first host), with the cluster's key and known_hosts (role ssh_trust). A node
the launcher cannot log in to failed the job only once horovodrun had started, in its words
("Host key verification failed"), and every restart failed the same way. The probe runs with
the staging check on the launcher (`probe_line`), so such a job stops before any rank starts,
in one line that names each pair and the command that repairs the trust (`Untrusted`).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from pycli.cluster.model import Host
from pycli.core.errors import PycliError
from pycli.jobs.launch import JobPlan

# How long the launcher waits for a peer's sshd: a node that does not answer is named as one.
PROBE_CONNECT_TIMEOUT_S = 5
UNTRUSTED = "untrusted"


def peers(plan: JobPlan) -> list[Host]:
    """The hosts the launcher logs in to: none under torchrun (pycli starts each node's agent),
    in the job's containers (their own sshd and key) or for mpirun in a Slurm allocation (srun
    starts its ranks)."""
    if plan.request.container is not None or plan.launcher == "torchrun" or (plan.launcher == "mpirun" and plan.slurm):
        return []
    return [host for host in plan.hosts if host != plan.rank0]


def probe_line(hosts: Sequence[Host]) -> str:
    """A shell line, for the launcher: `untrusted NAME LAST-LINE-OF-SSH` for each host it cannot log
    in to (all at once, by the address and port horovodrun uses); it always exits 0."""
    tries = " ".join(
        f"probe {shlex.quote(host.name)} {host.port} {shlex.quote(host.address)} &" for host in hosts)
    return (
        f"probe() {{ err=$(ssh -o BatchMode=yes -o ConnectTimeout={PROBE_CONNECT_TIMEOUT_S:d} -p \"$2\" \"$3\" true 2>&1 "
        f"</dev/null >/dev/null) || echo \"{UNTRUSTED} $1 $(printf '%s\\n' \"$err\" | tail -n 1)\"; }}; {tries} wait; true"
    )


def parse_probe(stdout: str) -> dict[str, str]:
    """{host name: what ssh said} of the hosts the launcher could not log in to."""
    found = {}
    for line in stdout.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == UNTRUSTED and rest:
            name, _, said = rest.partition(" ")
            found[name] = said.strip() or "ssh failed"
    return found


class Untrusted(PycliError):
    """The launcher cannot log in to some of the job's nodes."""

    def __init__(self, plan: JobPlan, failed: dict[str, str]) -> None:
        self.launcher = plan.rank0
        self.failed = {host: failed[host.name] for host in plan.hosts if host.name in failed}
        super().__init__(self.line(None))

    def line(self, inventory: Path | None) -> str:
        pairs = "; ".join(f"{host.name} ({host.address}): {said}" for host, said in self.failed.items())
        fix = f"pycli provision {inventory} --tags ssh_trust" if inventory else "pycli provision INVENTORY --tags ssh_trust"
        return (f"job not started: {self.launcher.name}, the launcher, cannot log in to {pairs}; "
                f"the nodes' SSH trust is out of date or a node is down: '{fix}' puts it back")
