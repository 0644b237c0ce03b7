"""The drained list: nodes fenced off from jobs until a person takes them back.

`pycli drain NODE --reason TEXT` records a node of one inventory, with why and when, in
`$PYCLI_STATE/drained/<inventory name>-<digest of its path>.json`; `pycli undrain NODE` takes
it back. `train`, `bench` and `hostfile` leave drained nodes out and say so in one line;
`provision` still provisions them (that is how a node is repaired), and `check` and
`inventory show` list them. `check --deep --fence` puts the nodes its gates name there too.

Every change reads, changes and writes the list back under an exclusive lock (flock on a file
beside it), so a `pycli drain` beside a `check --fence` never loses the other's entries.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

from pycli.cluster_model import Cluster, Drained
from pycli.errors import BadInput
from pycli.paths import state_dir

# A reason is one line that a person reads back in every command that leaves the node out.
MAX_REASON = 200


def drained_file(inventory: Path) -> Path:
    """Where one inventory's drained list lives: named after the inventory and its absolute path,
    so two inventories of the same name never share a list."""
    path = inventory.resolve()
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    return state_dir() / "drained" / f"{path.stem or path.name}-{digest}.json"


def read_drained(inventory: Path) -> tuple[Drained, ...]:
    """The drained list of `inventory` (empty when it has none); a damaged file is one line."""
    path = drained_file(inventory)
    if not path.is_file():
        return ()
    try:
        data = json.loads(path.read_text())
        return tuple(Drained(node=str(e["node"]), reason=str(e["reason"]), since=str(e["since"])) for e in data["drained"])
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        raise BadInput(f"{path} is not a drained list pycli wrote; remove it to undrain every node of {inventory}") from None


def _write(inventory: Path, entries: Sequence[Drained]) -> None:
    path = drained_file(inventory)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"inventory": str(inventory.resolve()), "drained": [asdict(e) for e in entries]}, indent=2) + "\n")
    os.replace(tmp, path)


@contextmanager
def _changing(inventory: Path) -> Iterator[list[Drained]]:
    """The drained list to change in place, written back on leaving; one change at a time."""
    path = drained_file(inventory)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = list(read_drained(inventory))
        yield entries
        _write(inventory, entries)


def with_drained(cluster: Cluster) -> Cluster:
    """`cluster` with its inventory's drained list (of the hosts it still has)."""
    names = {host.name for host in cluster.hosts}
    return replace(cluster, drained=tuple(e for e in read_drained(cluster.inventory_path) if e.node in names))


def _known(cluster: Cluster, nodes: Sequence[str]) -> None:
    if not nodes:
        raise BadInput("name the node(s), as the inventory names them")
    names = [host.name for host in cluster.hosts]
    unknown = [node for node in nodes if node not in names]
    if unknown:
        raise BadInput(f"{', '.join(unknown)}: not a host of {cluster.inventory_path} (its hosts: {', '.join(names)})")


def stamp(now: datetime | None = None) -> str:
    """A drained entry's time: UTC, ISO 8601 to the second."""
    return (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _put(entries: list[Drained], node: str, reason: str, since: str) -> Drained:
    """Put one node on `entries` (a node already there gets the new reason, keeps its time)."""
    for index, entry in enumerate(entries):
        if entry.node == node:
            entries[index] = Drained(node, reason, entry.since)
            return entries[index]
    entries.append(Drained(node, reason, since))
    return entries[-1]


def drain(cluster: Cluster, nodes: Sequence[str], reason: str, now: datetime | None = None) -> list[Drained]:
    """Put `nodes` on the drained list with a person's reason: one line of at most MAX_REASON characters."""
    _known(cluster, nodes)
    reason = " ".join(reason.split())
    if not reason or len(reason) > MAX_REASON:
        raise BadInput(f"--reason: say in one line of at most {MAX_REASON} characters why the node is drained")
    with _changing(cluster.inventory_path) as entries:
        return [_put(entries, node, reason, stamp(now)) for node in nodes]


FENCE_PREFIX = "pycli check --deep: "
_FENCE_MORE = "… (all of it in check.json)"


def fence_reason(why: str) -> str:
    """What the drained list keeps of a gate's reason: one line, shortened to MAX_REASON."""
    reason = FENCE_PREFIX + " ".join(why.split())
    return reason if len(reason) <= MAX_REASON else reason[:MAX_REASON - len(_FENCE_MORE)].rstrip() + _FENCE_MORE


def fence(cluster: Cluster, suspects: Mapping[str, str], now: datetime | None = None) -> list[Drained]:
    """`check --deep --fence`: every node the gates named goes on the list in one change, each with
    its gate's reason shortened (the check's report keeps all of it); it never stops half-way."""
    _known(cluster, list(suspects))
    with _changing(cluster.inventory_path) as entries:
        return [_put(entries, node, fence_reason(why), stamp(now)) for node, why in suspects.items()]


def undrain(cluster: Cluster, nodes: Sequence[str]) -> tuple[list[str], list[str]]:
    """Take `nodes` off the drained list: (taken back, were not drained)."""
    _known(cluster, nodes)
    with _changing(cluster.inventory_path) as entries:
        drained = {e.node for e in entries}
        entries[:] = [e for e in entries if e.node not in nodes]
    return [n for n in nodes if n in drained], [n for n in nodes if n not in drained]


def leaving_out_line(cluster: Cluster) -> str | None:
    """The one line a command that runs jobs says when it leaves drained nodes out."""
    if not cluster.drained:
        return None
    them = "it" if len(cluster.drained) == 1 else "them"
    return (f"leaving out drained {', '.join(e.describe() for e in cluster.drained)}; "
            f"'pycli undrain {' '.join(e.node for e in cluster.drained)}' takes {them} back")


def for_jobs(cluster: Cluster, say: Callable[[str], None]) -> Cluster:
    """The cluster a job, a benchmark or a hostfile uses: drained nodes left out, and said."""
    if (line := leaving_out_line(cluster)) is not None:
        say(line)
    return cluster.for_jobs()
