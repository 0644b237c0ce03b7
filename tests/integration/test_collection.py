"""The roles as the Ansible collection pycli.cluster (galaxy.yml, docs/collection.md): built from
the checkout, installed with ansible-galaxy outside it, its `site` playbook run by
ansible-playbook (no pycli, no project ansible.cfg) from a folder of a user's own, against an
inventory there, on the 3-node cluster pycli provisioned: it passes and changes nothing.

This is the collection's own check, not a second whole provisioning: the site playbook runs every
play, role, plugin and module of the installed copy on one node (`-e pycli_hosts=node3`, the
limit the site documents and `pycli provision --retry` passes), with the cluster-wide files
(SSH trust on every node, known_hosts, /etc/hosts) worked out from the whole inventory. The
same roles provisioned all three nodes a moment before (pycli's run, conftest), from the same
files; a run over all three would repeat that per node (about 150 s more in make test)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pycli.core.paths import folders_env
from tests.conftest import ROOT

pytestmark = pytest.mark.integration
TOOLS = Path(sys.executable).parent
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def _galaxy(*args: str, cwd: Path) -> str:
    done = subprocess.run([str(TOOLS / "ansible-galaxy"), "collection", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _user_env(collections: Path) -> dict[str, str]:
    """The environment of a user with the collection installed: Ansible's own settings, the
    folders pycli's runs use (so that the cluster's key pair and cache are the same ones)."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("ANSIBLE_", "PYCLI_TEST_")) and name != "PYTHONPATH"}
    return {**env, **folders_env(), "ANSIBLE_COLLECTIONS_PATH": str(collections), "ANSIBLE_PIPELINING": "True",
            "ANSIBLE_FORCE_COLOR": "0", "PATH": f"{TOOLS}{os.pathsep}{env.get('PATH', '')}"}


def test_the_collections_site_playbook_provisions_the_cluster_from_a_users_own_folder(three_nodes, tmp_path):
    _galaxy("build", "--output-path", str(tmp_path / "dist"), str(ROOT), cwd=tmp_path)
    (tarball,) = (tmp_path / "dist").glob("pycli-cluster-*.tar.gz")
    collections = tmp_path / "collections"
    # --force: a copy installed elsewhere (~/.ansible/collections) would make it install nothing here.
    _galaxy("install", "--force", "--no-deps", "-p", str(collections), str(tarball), cwd=tmp_path)
    installed = collections / "ansible_collections" / "pycli" / "cluster"
    assert (installed / "plugins" / "filter" / "cluster_address.py").is_file()
    assert not (installed / "pycli").exists() and not (installed / "tests").exists()

    user = tmp_path / "site"
    user.mkdir()
    shutil.copy(three_nodes, user / "hosts.ini")
    ran = subprocess.run([str(TOOLS / "ansible-playbook"), "-i", "hosts.ini", "pycli.cluster.site", "-e", "pycli_hosts=node3",
                          "--skip-tags", "docker"],  # as pycli provisioned this cluster (conftest, _ThreeNodes)
                         cwd=user, env=_user_env(collections), capture_output=True, text=True, timeout=1200)
    tail = (ran.stdout + ran.stderr)[-6000:]
    assert ran.returncode == 0, tail
    recap = {host: (int(ok), int(changed), int(unreachable), int(failed))
             for host, ok, changed, unreachable, failed in RECAP.findall(ran.stdout)}
    nodes = {host: counts for host, counts in recap.items() if host.startswith("node")}
    assert sorted(nodes) == ["node1", "node2", "node3"], recap  # SSH trust reaches every node
    # node3 ran the whole site; the others the plays every run gives every node.
    assert nodes["node3"][0] > 2 * max(nodes["node1"][0], nodes["node2"][0]), recap
    # The same roles as pycli's run, from the installed copy: nothing left to change.
    assert all(changed == 0 and failed == 0 and unreachable == 0 for _, changed, unreachable, failed in nodes.values()), tail
