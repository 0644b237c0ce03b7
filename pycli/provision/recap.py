"""What a provisioning run left on each host, kept in its run folder for `pycli provision --retry`.

A host is `ok` only when it went through every play of the run: site.yml ends with a play
whose one task (END_TASK) each node reaches only that way. A host that neither failed nor
became unreachable but never got there (the playbook stopped early, the run was cancelled) is
`incomplete`, never `ok`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from pycli.cluster.model import Cluster
from pycli.core.errors import BadInput
from pycli.core.json_documents import RECAP, load_json_object, require_known_version, versioned

# The name of the last task of playbooks/site.yml (play "End of the run").
END_TASK = "Mark this node as through every play"
RECAP_FILE = RECAP.file_name

OK, FAILED, UNREACHABLE, INCOMPLETE = "ok", "FAILED", "UNREACHABLE", "incomplete"


def host_state(*, unreachable: bool, failed: bool, through: bool | None) -> str:
    """One host's outcome. `through` is None for a playbook without the end-of-run task."""
    if unreachable:
        return UNREACHABLE
    if failed:
        return FAILED
    return INCOMPLETE if through is False else OK


def write_recap(run_dir: Path, cluster: Cluster, states: Mapping[str, str]) -> Path:
    path = run_dir / RECAP_FILE
    record = versioned(RECAP, {"inventory": str(cluster.inventory_path.resolve()), "cluster": cluster.name,
                               "hosts": dict(states)})
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def _recaps(runs: Path) -> list[Path]:
    if not runs.is_dir():
        return []
    found = [p for p in runs.glob(f"*-provision*/{RECAP_FILE}") if p.is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def last_unfinished(cluster: Cluster, runs: Path) -> tuple[Path, list[str]]:
    """The newest provisioning run of this inventory under `runs` (of this cluster, where the
    inventory names it: the file may have moved since), and its hosts that did not end `ok` (in
    inventory order, only those still in the inventory).

    The newest recap of this inventory written by a pycli of another recap version is refused
    (BadInput), not passed over for an older one: it would retry hosts that run already did."""
    wanted = str(cluster.inventory_path.resolve())
    for path in _recaps(runs):
        try:
            record = load_json_object(path)
        except (OSError, ValueError):
            continue  # a damaged file: nobody's record
        if record.get("inventory") != wanted and not (cluster.name and record.get("cluster") == cluster.name):
            continue
        require_known_version(RECAP, record, path)
        states = record.get("hosts")
        if not isinstance(states, dict):
            continue  # no per-host record: not a recap pycli wrote
        names = [host.name for host in cluster.hosts]
        return path.parent, [name for name in names if states.get(name, OK) != OK]
    raise BadInput(
        f"--retry: no earlier 'pycli provision' of {cluster.inventory_path} under {runs} "
        "(set PYCLI_RUNS to where that run's folder is)"
    )
