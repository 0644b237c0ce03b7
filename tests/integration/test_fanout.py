"""Artifacts passed on from node to node on the session's 3-node cluster (role artifact_cache):
the controller sends each artifact once, counted both in the provisioning's own events and in
the bytes this host sent to the nodes; every node ends with the same sha256; a damaged copy,
on a peer or on the node itself, is detected and fetched again; nodes no peer can serve get it
from the controller."""

import hashlib
import importlib.util
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import run_pycli
from tests.integration.conftest import CLUSTER3, frozen, node_shell

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
NODES = ("node1", "node2", "node3")
ENTRY_SCRIPT = ROOT / "roles" / "artifact_cache" / "files" / "cache_entry.sh"
PULL_SCRIPT = ROOT / "roles" / "artifact_cache" / "files" / "fanout-pull.sh"
DEST = "/var/cache/pycli/test-fanout/blob"
SIZE = 24_000_000


def _scale():
    """benchmarks/scale.py, for its counter of the bytes this host sends to a cluster's nodes."""
    spec = importlib.util.spec_from_file_location("scale_benchmark", ROOT / "benchmarks" / "scale.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _container(node: str):
    import docker

    return docker.from_env().containers.get(f"pycli-{CLUSTER3}-{node}")


def _run(node: str, command: str) -> tuple[int, str]:
    return node_shell(node, command, cluster=CLUSTER3)


def _sha256(node: str, path: str) -> str:
    code, out = _run(node, f"sha256sum {path} 2>/dev/null | cut -d' ' -f1")
    return out.strip()


def _events(run_folder: Path, task_prefix: str) -> dict[str, list[str]]:
    """The hosts on which a task whose name starts with task_prefix changed, by task name."""
    hosts = defaultdict(list)
    for event_file in run_folder.glob("artifacts/*/job_events/*.json"):
        event = json.loads(event_file.read_text())
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_ok" and data.get("task", "").startswith(task_prefix) and data["res"].get("changed"):
            hosts[data["task"]].append(data["host"])
    return hosts


def _only_run(runs: Path) -> Path:
    folders = sorted(runs.glob("*-provision"))
    assert len(folders) == 1, folders
    return folders[0]


def test_provisioning_sent_every_artifact_from_the_controller_once(three_nodes):
    """The fixture's own provisioning (cold nodes: Open MPI, the wheelhouse and the Horovod
    wheel go to every node that did not build them): one controller copy each, the rest pulled."""
    run = _only_run(three_nodes.parent / "runs")
    from_controller = _events(run, "Copy from the controller cache")
    pulled = _events(run, "Pull from a peer: ")
    names = sorted(task.split(": ", 1)[1] for task in from_controller)
    assert [name.split(" ")[0] for name in names] == ["Open", "the", "the"], from_controller  # Open MPI, Horovod wheel, wheelhouse
    assert all(len(hosts) == 1 for hosts in from_controller.values()), from_controller
    for name in names:
        receivers = from_controller[f"Copy from the controller cache: {name}"] + [
            host for task, hosts in pulled.items() if task.split(": ", 1)[1].rsplit(", round ", 1)[0] == name for host in hosts]
        assert len(receivers) == len(set(receivers)) and len(receivers) >= 2, (name, receivers)
    listing = ("cd /var/cache/pycli && find artifacts wheelhouse -type f \\( -path 'artifacts/*' -o -name '*.tar' \\)"
               " | sort | xargs sha256sum")
    sums = {node: _run(node, listing)[1] for node in NODES}
    assert len(set(sums.values())) == 1 and sums["node1"].count("\n") == 3, sums


@pytest.fixture
def blob(three_nodes, tmp_path):
    """A 24 MB entry of a controller cache of its own; the nodes' copies are removed after the test.
    Random bytes: a transfer that compresses (Mitogen's does) sends a repeated pattern in 2 MB,
    which would tell nothing of how many copies went out."""
    partial = tmp_path / "blob.partial"
    partial.write_bytes(os.urandom(SIZE))
    entry = tmp_path / "cache" / "artifacts" / "blob"
    entry.parent.mkdir(parents=True)
    import subprocess

    subprocess.run([str(ENTRY_SCRIPT), "publish", str(partial), str(entry)], check=True, capture_output=True)
    yield entry, hashlib.sha256(entry.read_bytes()).hexdigest()
    for node in NODES:
        _run(node, f"rm -rf {Path(DEST).parent}")


def _send(inventory: Path, entry: Path, runs: Path, dest: str = DEST) -> tuple[Path, float]:
    """playbooks/fanout.yml through pycli provision; the run folder and the MB this host sent to the nodes."""
    scale = _scale()
    bridge = scale.cluster_bridge(CLUSTER3)
    scale.own_counter("-I", bridge)
    try:
        before = scale.own_bytes_sent()
        proc = run_pycli("provision", str(inventory), "--playbook", "playbooks/fanout.yml",
                         "-e", f"fanout_entry={entry}", "-e", f"fanout_dest={dest}", env={"PYCLI_RUNS": str(runs)})
        sent = (scale.own_bytes_sent() - before) / 1e6
    finally:
        scale.own_counter("-D", bridge)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return max(runs.glob("*-provision")), sent


def test_the_controller_sends_a_file_once_and_a_node_with_a_good_copy_gets_nothing(three_nodes, blob, tmp_path):
    entry, want = blob
    run, sent = _send(three_nodes, entry, tmp_path / "first")
    assert sum(map(len, _events(run, "Copy from the controller cache").values())) == 1
    assert sorted(h for hosts in _events(run, "Pull from a peer").values() for h in hosts) == ["node2", "node3"]
    assert all(_sha256(node, DEST) == want for node in NODES)
    # One copy of 24 MB and Ansible's own traffic; a copy from the controller to each node would be 72 MB.
    assert SIZE / 1e6 <= sent < 1.5 * SIZE / 1e6, f"{sent:.1f} MB sent to the nodes"

    run, sent = _send(three_nodes, entry, tmp_path / "again")
    assert not _events(run, "Copy from the controller cache") and not _events(run, "Pull from a peer")
    assert sent < 0.25 * SIZE / 1e6, f"{sent:.1f} MB sent when every node had the file"

    code, _ = _run("node3", f"printf damaged | dd of={DEST} bs=1 seek=1000 conv=notrunc 2>/dev/null")
    assert code == 0 and _sha256("node3", DEST) != want
    run, sent = _send(three_nodes, entry, tmp_path / "damaged")
    assert not _events(run, "Copy from the controller cache")
    assert [h for hosts in _events(run, "Pull from a peer").values() for h in hosts] == ["node3"]
    assert _sha256("node3", DEST) == want and sent < 0.25 * SIZE / 1e6


def test_a_folder_that_is_there_keeps_its_owner_and_mode(three_nodes, blob, tmp_path):
    """fanout_dest in /tmp (sticky, world-writable) and in a user's own folder: the file arrives,
    and neither folder is made root's 0755."""
    entry, want = blob
    folders = {"/tmp": "1777 root:root", "/srv/pycli-user-data": "750 nobody:nogroup"}
    for node in NODES:
        _run(node, "mkdir -p /srv/pycli-user-data && chown nobody:nogroup /srv/pycli-user-data && chmod 750 /srv/pycli-user-data")
    try:
        for folder in folders:
            _send(three_nodes, entry, tmp_path / folder.strip("/").replace("/", "-"), dest=f"{folder}/pycli-fanout-blob")
        for node in NODES:
            for folder, kept in folders.items():
                assert _run(node, f"stat -c '%a %U:%G' {folder}")[1].strip() == kept, (node, folder)
                assert _sha256(node, f"{folder}/pycli-fanout-blob") == want, (node, folder)
    finally:
        for node in NODES:
            _run(node, "rm -rf /tmp/pycli-fanout-blob /srv/pycli-user-data")


def test_a_peers_damaged_copy_is_refused_and_the_next_peer_serves(three_nodes, blob):
    """fanout-pull.sh on node3, as fanout_round.yml runs it: node2's copy is damaged, node1's whole."""
    from pycli.cluster.model import load_cluster

    entry, want = blob
    addresses = {host.name: host.address for host in load_cluster(three_nodes).hosts}
    for node in ("node1", "node2"):
        _container(node).put_archive("/", _tar({DEST.lstrip("/"): entry.read_bytes()}))
    _run("node2", f"printf damaged | dd of={DEST} bs=1 seek=5 conv=notrunc 2>/dev/null")
    _container("node3").put_archive("/", _tar({"tmp/fanout-pull.sh": PULL_SCRIPT.read_bytes()}))
    code, out = _run("node3", f"bash /tmp/fanout-pull.sh {DEST} {want} root 600 {addresses['node2']} {addresses['node1']}")
    assert code == 0, out
    assert f"{addresses['node2']}: its copy has sha256 {_sha256('node2', DEST)}, not {want}" in out
    assert f"pulled from {addresses['node1']}" in out and _sha256("node3", DEST) == want
    code, out = _run("node3", f"ls {Path(DEST).parent}")
    assert out.split() == ["blob"]  # no half copy left behind


def test_a_peer_frozen_mid_transfer_costs_seconds_and_the_next_peer_serves(three_nodes, blob):
    """node2 sends slowly (tc), then freezes (every process stopped) while node3 pulls from it: SSH's
    keepalives give it up in seconds and node1 serves, where TCP alone would wait for minutes."""
    import threading
    import time

    from pycli.cluster.model import load_cluster

    entry, want = blob
    addresses = {host.name: host.address for host in load_cluster(three_nodes).hosts}
    for node in ("node1", "node2"):
        _container(node).put_archive("/", _tar({DEST.lstrip("/"): entry.read_bytes()}))
    _container("node3").put_archive("/", _tar({"tmp/fanout-pull.sh": PULL_SCRIPT.read_bytes()}))
    code, out = _run("node2", "tc qdisc add dev eth0 root tbf rate 2mbit burst 32kb latency 400ms")
    assert code == 0, out
    answer: dict[str, tuple[int, str]] = {}
    line = f"timeout 200 bash /tmp/fanout-pull.sh {DEST} {want} root 600 {addresses['node2']} {addresses['node1']}"
    pulling = threading.Thread(target=lambda: answer.setdefault("pull", _run("node3", line)))
    try:
        started = time.monotonic()
        pulling.start()
        time.sleep(5)  # 24 MB at 2 Mbit/s takes over 90 s: node2 is mid-transfer
        with frozen("node2", cluster=CLUSTER3):
            pulling.join(230)
            took = time.monotonic() - started
    finally:
        _run("node2", "tc qdisc del dev eth0 root")
    code, out = answer.get("pull", (-1, "still pulling after 230 s"))
    assert code == 0, out
    assert f"pulled from {addresses['node1']}" in out and f"{addresses['node2']}: Timeout, server" in out, out
    assert took < 90, f"{took:.0f} s to leave a frozen peer"
    assert _sha256("node3", DEST) == want


def test_nodes_no_peer_can_serve_get_it_from_the_controller(three_nodes, blob, tmp_path):
    """node1 holds the only copy and stops accepting the cluster key: node2 and node3 cannot
    pull from it (nor from each other: neither has it), so the controller sends to both."""
    entry, want = blob
    _container("node1").put_archive("/", _tar({DEST.lstrip("/"): entry.read_bytes()}))
    keys = "~/.ssh/authorized_keys"
    code, _ = _run("node1", f"cp {keys} /tmp/authorized_keys.kept && grep -v pycli-cluster- /tmp/authorized_keys.kept > {keys}")
    assert code == 0
    try:
        run, _ = _send(three_nodes, entry, tmp_path / "runs")
    finally:
        _run("node1", f"cat /tmp/authorized_keys.kept > {keys}")
    assert sorted(h for hosts in _events(run, "Copy from the controller cache").values() for h in hosts) == ["node2", "node3"]
    assert not _events(run, "Pull from a peer")
    assert all(_sha256(node, DEST) == want for node in NODES)


def _tar(files: dict[str, bytes]) -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
