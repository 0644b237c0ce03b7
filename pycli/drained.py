"""The drained list: nodes fenced off from jobs until a person takes them back.

`pycli drain NODE --reason TEXT` records a node of one inventory, with why and when, in
`$PYCLI_STATE/drained/<inventory name>-<digest of its path>.json`; `pycli undrain NODE` takes
it back. `train`, `bench` and `hostfile` leave drained nodes out and say so in one line;
`provision` still provisions them (that is how a node is repaired), and `check` and
`inventory show` list them.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
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


def drain(cluster: Cluster, nodes: Sequence[str], reason: str, now: datetime | None = None) -> list[Drained]:
    """Put `nodes` on the drained list (a node already there gets the new reason, keeps its time)."""
    _known(cluster, nodes)
    reason = " ".join(reason.split())
    if not reason or len(reason) > MAX_REASON:
        raise BadInput(f"--reason: say in one line of at most {MAX_REASON} characters why the node is drained")
    since = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    entries = {e.node: e for e in read_drained(cluster.inventory_path)}
    for node in nodes:
        entries[node] = Drained(node, reason, entries[node].since if node in entries else since)
    _write(cluster.inventory_path, list(entries.values()))
    return [entries[node] for node in nodes]


def undrain(cluster: Cluster, nodes: Sequence[str]) -> tuple[list[str], list[str]]:
    """Take `nodes` off the drained list: (taken back, were not drained)."""
    _known(cluster, nodes)
    entries = read_drained(cluster.inventory_path)
    drained = {e.node for e in entries}
    _write(cluster.inventory_path, [e for e in entries if e.node not in nodes])
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
