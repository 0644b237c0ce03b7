"""The cache stage on the real local cluster: fetch, offline provisioning, a failed build, and
`ansible-playbook playbooks/site.yml` without an inventory. The README's own commands run on the
Slurm inventory of the same nodes (tests/integration/test_slurm.py): `ansible-playbook
playbooks/site.yml` as the whole site's second run, `pycli train --np 8` beside the queue."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pycli.core.cache import sha256_of
from tests.conftest import ANSIBLE_PLAYBOOK, ROOT, run_pycli

pytestmark = pytest.mark.integration
OPENMPI_SOURCE = "openmpi_4.1.4.orig.tar.xz"  # the test bed's source (pycli/local/plan.py)


def ok_events(runs: Path) -> list[dict]:
    """The event data of every task that ended ok, over every run folder in `runs` (or one run folder)."""
    events = (json.loads(path.read_text()) for path in sorted(runs.rglob("job_events/*.json")))
    return [event.get("event_data") or {} for event in events if event.get("event") == "runner_on_ok"]


def changed_tasks(runs: Path) -> list[str]:
    """'host: task' for every task that reported a change, over every run folder in `runs`."""
    return [f"{data.get('host')}: {data.get('task')}" for data in ok_events(runs) if (data.get("res") or {}).get("changed")]


def fetch(inventory: Path, cache: Path, runs: Path) -> subprocess.CompletedProcess:
    return run_pycli("fetch", str(inventory), env={"PYCLI_CACHE": str(cache), "PYCLI_RUNS": str(runs)}, timeout=900)


def test_fetch_fills_an_empty_cache_once_for_two_runs_checks_it_and_changes_nothing_twice(local_cluster, tmp_path):
    cache = tmp_path / "cache"
    # Two runs at once on one empty cache: both pass, each file is fetched whole and checked.
    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(lambda i: fetch(local_cluster, cache, tmp_path / f"runs1-{i}"), range(2)))
    for proc in procs:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    source = cache / "downloads" / OPENMPI_SOURCE
    assert (cache / "downloads" / "horovod-0.28.1.tar.gz").is_file() and source.is_file()
    (wheelhouse,) = (cache / "wheelhouse").glob("cp311-x86_64-*/")
    lock = (ROOT / "roles/horovod/files/wheelhouse/cp311-x86_64.txt").read_text()
    pinned = dict(re.findall(r"^(\S+)==\S+ --hash=sha256:(\w+)", lock, re.M))
    assert sorted(sha256_of(p) for p in wheelhouse.iterdir()) == sorted(pinned.values())
    assert any(p.name.startswith("torch-2.13.0") for p in wheelhouse.iterdir())
    assert not list((cache / "artifacts").iterdir())  # it downloads, it builds nothing

    second = fetch(local_cluster, cache, tmp_path / "runs2")
    assert second.returncode == 0, second.stdout + second.stderr
    assert changed_tasks(tmp_path / "runs2") == []

    # A corrupted download and a corrupted wheel are detected and fetched again.
    good = sha256_of(source)
    source.write_bytes(b"not the Open MPI source")
    torch = next(p for p in wheelhouse.iterdir() if p.name.startswith("torch-"))
    torch_sum = sha256_of(torch)
    with torch.open("r+b") as stream:
        stream.truncate(1000)
    third = fetch(local_cluster, cache, tmp_path / "runs3")
    assert third.returncode == 0, third.stdout + third.stderr
    assert sha256_of(source) == good and sha256_of(torch) == torch_sum


def test_export_import_then_offline_provisioning(provisioned_cluster, tmp_path):
    exported = tmp_path / "cache.tar"
    proc = run_pycli("cache", "export", str(exported), check=True)
    assert "exported" in proc.stdout
    offline = tmp_path / "offline-cache"
    env = {"PYCLI_CACHE": str(offline), "PYCLI_RUNS": str(tmp_path / "runs")}

    # Nothing imported yet: --offline names what is missing and how to bring it.
    empty = run_pycli("provision", str(provisioned_cluster), "--offline", "--tags", "openmpi", env=env, timeout=900)
    assert empty.returncode == 1, empty.stdout + empty.stderr
    assert f"{OPENMPI_SOURCE} is missing" in empty.stdout and "pycli cache import" in empty.stdout

    run_pycli("cache", "import", str(exported), env=env, check=True)
    # A truncated artifact whose .sha256 is gone counts as absent and is made again.
    (artifact,) = (offline / "artifacts").glob("openmpi-*.tar.gz")
    Path(f"{artifact}.sha256").unlink()
    with artifact.open("r+b") as stream:
        stream.truncate(4096)
    # What pycli downloads is Open MPI's and Horovod's (the other roles install from apt).
    proc = run_pycli("provision", str(provisioned_cluster), "--offline", "--tags", "openmpi,horovod", env=env, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert Path(f"{artifact}.sha256").read_text().split()[0] == sha256_of(artifact)


def test_a_failed_build_is_named_on_every_node(provisioned_cluster, tmp_path):
    # Configure fails on the build node (node1); node2 must say so, not that a file is missing.
    # With openmpi_with_cuda auto and no CUDA on the nodes, the build starts after the GPU
    # stack (a real inventory's default), not in the early start the local bed's false allows.
    flags = tmp_path / "bad-flags.yml"
    flags.write_text('openmpi_configure_flags: ["--with-hwloc=/nonexistent/hwloc"]\nopenmpi_with_cuda: auto\n')
    proc = run_pycli(
        "provision", str(provisioned_cluster), "--tags", "openmpi", "-e", f"@{flags}",
        env={"PYCLI_RUNS": str(tmp_path)}, timeout=1800,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # Each failure is one line, "host: task: message", with configure's own last words: the
    # build runs in the background (it started before the roles between), and fails the run all the same.
    wait = r"Wait for configure, compile and install to end: configure: error: "
    assert re.search(rf"node1: [^\n]*Open MPI 4\.1\.4 did not build here: {wait}", proc.stdout), proc.stdout[-4000:]
    assert re.search(rf"node2: [^\n]*Open MPI 4\.1\.4 \(openmpi-[^)]+\) was to be built on node1, which failed: {wait}",
                     proc.stdout), proc.stdout[-4000:]
    assert "Unable to access" not in proc.stdout
    started = [(data["play"], data["host"]) for data in ok_events(tmp_path)
               if data.get("task") == "Start configure, compile and install in the background (several minutes)"]
    assert started == [("Start the Open MPI build on the other nodes", "node1")], started


DEFAULT_INVENTORY = ROOT / "inventory" / "local-local.ini"


@contextlib.contextmanager
def _default_inventory():
    """The checkout's default inventory held alone: site_yml_as_typed links it for its run, and
    make test's lanes run side by side in one checkout (tests/integration/conftest.py), so the
    test that wants none there waits for the link to go (it saw it once, and its site run passed)."""
    digest = hashlib.sha256(str(ROOT).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"pycli-tests-default-inventory-{digest}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _site(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "True"}
    env.pop("ANSIBLE_INVENTORY", None)
    return subprocess.run([ANSIBLE_PLAYBOOK, *args, "playbooks/site.yml"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)


def site_yml_as_typed(inventory: Path) -> subprocess.CompletedProcess:
    """`ansible-playbook playbooks/site.yml` as the README has it, without -i: ansible.cfg's default
    inventory is where `pycli cluster up` writes the 'local' cluster's, here a link to `inventory`.
    Where that cluster is up (a developer's machine), its inventory is left alone and -i names
    `inventory`. test_slurm.py runs it as the whole site's second run, which must change nothing."""
    with _default_inventory():
        if DEFAULT_INVENTORY.exists():
            return _site("-i", str(inventory))
        DEFAULT_INVENTORY.parent.mkdir(exist_ok=True)  # a fresh clone has no inventory/ until pycli writes one
        DEFAULT_INVENTORY.symlink_to(inventory)
        try:
            return _site()
        finally:
            DEFAULT_INVENTORY.unlink()


def test_site_yml_without_an_inventory_says_how_to_get_one():
    with _default_inventory():
        if DEFAULT_INVENTORY.exists():
            pytest.skip("the 'local' cluster is up here; its inventory is the default")
        proc = _site()
    assert proc.returncode != 0
    assert "No hosts in group 'nodes': start the local cluster with 'pycli cluster up'" in proc.stdout
