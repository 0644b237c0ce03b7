"""What this machine must allow for a local cluster of systemd node containers, and what it
allows now. Every node's systemd (and its journald, udevd, logind) takes inotify instances and
watches of the host's root user, and the kernel's per-user limits are shared by all of them:
with Debian's default of 128 instances, about twenty nodes boot and the next one's systemd
exits before it logs a line. `pycli cluster up` checks the limits before it starts anything;
scripts/host-prereqs.sh raises them (HOST_SYSCTL_FILE).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pycli.core.tree import host_prereqs_command

PROC = Path("/proc")
INSTANCES = "fs.inotify.max_user_instances"
WATCHES = "fs.inotify.max_user_watches"
# What one node of the image takes, rounded up with room to spare. Measured on 2026-11-27 over
# every process of a node's cgroup (fds that are `anon_inode:inotify`, and the `inotify wd:`
# lines of their fdinfo): a node just booted held 7 instances and 25 watches (systemd 5,
# dbus-daemon 1, systemd-logind 1), one being provisioned 8 and 29 (containerd).
PER_NODE = {INSTANCES: 10, WATCHES: 200}
# What scripts/host-prereqs.sh sets (at least), in HOST_SYSCTL_FILE: room for 64 nodes and more.
RAISED = {INSTANCES: 1024, WATCHES: 524_288}
HOST_SYSCTL_FILE = "/etc/sysctl.d/60-pycli-local-cluster.conf"


def sysctl_file_text() -> str:
    """HOST_SYSCTL_FILE's content: RAISED, kept after a reboot."""
    lines = ["# Written by pycli's scripts/host-prereqs.sh: room for local clusters of many systemd",
             "# node containers (pycli/local/host_limits.py)."]
    return "\n".join([*lines, *(f"{name} = {value}" for name, value in RAISED.items())]) + "\n"


def sysctl_path(name: str) -> Path:
    return PROC / "sys" / Path(*name.split("."))


def read_limit(name: str) -> int | None:
    try:
        return int(sysctl_path(name).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def inotify_in_use(uid: int) -> dict[str, int]:
    """The inotify instances and watches that `uid`'s processes hold now (what the limits count)."""
    instances = watches = 0
    for proc in PROC.iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != uid:
                continue
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) == "anon_inode:inotify":
                    instances += 1
                    watches += sum(1 for line in (proc / "fdinfo" / fd.name).read_text().splitlines()
                                   if line.startswith("inotify wd:"))
        except OSError:
            continue  # a process that ended meanwhile, or one not ours to read
    return {INSTANCES: instances, WATCHES: watches}


@dataclass(frozen=True)
class Shortfall:
    name: str
    limit: int
    in_use: int
    needed: int  # by the nodes about to start

    def line(self, nodes: int) -> str:
        raise_to = max(RAISED[self.name], self.in_use + self.needed)
        return (f"{nodes} more nodes need about {self.needed} inotify "
                f"{'instances' if self.name == INSTANCES else 'watches'} of root's, and {self.name} is "
                f"{self.limit} with {self.in_use} in use: run `sysctl -w {self.name}={raise_to}` "
                f"({host_prereqs_command()} sets it for good)")


def shortfalls(nodes: int, limits: dict[str, int | None], in_use: dict[str, int]) -> list[Shortfall]:
    """The limits that `nodes` more nodes would pass; none where a limit cannot be read."""
    found = []
    for name, per_node in PER_NODE.items():
        limit = limits.get(name)
        needed = nodes * per_node
        if limit is not None and in_use.get(name, 0) + needed > limit:
            found.append(Shortfall(name, limit, in_use.get(name, 0), needed))
    return found


def check_room_for(nodes: int) -> list[str]:
    """One line per limit of this machine that `nodes` more nodes would pass."""
    limits = {name: read_limit(name) for name in PER_NODE}
    return [s.line(nodes) for s in shortfalls(nodes, limits, inotify_in_use(os.geteuid()))]


def usage_line() -> str:
    """The inotify limits of root's and what its processes hold, in words, with what each node takes."""
    in_use = inotify_in_use(os.geteuid())
    parts = [f"{name} is {read_limit(name)} with {in_use[name]} in use (a node takes about {per_node})"
             for name, per_node in PER_NODE.items()]
    return "; ".join(parts) + f" ({host_prereqs_command()} raises them)"


def why_stopped(log: str) -> str:
    """Why a node container stopped while booting: its own last line; where it printed none
    (systemd that could not even start), the host's inotify limits, the usual cause."""
    lines = [line.strip() for line in log.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"it printed nothing; {usage_line()}"
