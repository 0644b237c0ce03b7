"""The cluster model on a real local cluster: its inventory read back, its hosts reached at the
addresses the model gives."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from pycli.cluster import runner
from pycli.cluster.model import load_cluster
from pycli.core.paths import new_run_dir
from tests.conftest import run_pycli

pytestmark = pytest.mark.integration


def test_local_cluster_inventory_reads_as_a_cluster(local_cluster):
    cluster = load_cluster(local_cluster)
    assert [host.name for host in cluster.hosts] == ["node1", "node2"]
    assert cluster.launcher == "node1"
    assert all(host.user == "root" and host.port == 22 and host.slots == 1 for host in cluster.hosts)

    shown = json.loads(run_pycli("inventory", "show", "--json", str(local_cluster), check=True, timeout=60).stdout)
    assert [(h["name"], h["address"]) for h in shown["hosts"]] == [(h.name, h.address) for h in cluster.hosts]
    assert shown["total_slots"] == 2

    hostfile = run_pycli("hostfile", str(local_cluster), "--format", "horovod", check=True, timeout=60).stdout
    assert hostfile == ",".join(f"{host.address}:1" for host in cluster.hosts) + "\n"


def test_the_model_addresses_are_where_ansible_lands(local_cluster):
    """Each host answers over SSH, and the address the model gives is one of its own."""
    cluster = load_cluster(local_cluster)
    addresses: dict[str, str] = {}

    def keep_stdout(event: Mapping[str, object]) -> None:
        data = event.get("event_data") or {}
        if event.get("event") == "runner_on_ok" and isinstance(data, Mapping):
            addresses[str(data["host"])] = str((data.get("res") or {}).get("stdout", ""))

    request = runner.RunRequest(inventory=local_cluster, pattern="nodes", module="ansible.builtin.command", module_args="hostname -I")
    result = runner.run(request, new_run_dir("inventory-test"), on_event=keep_stdout)
    assert result.rc == 0, result.hosts
    for host in cluster.hosts:
        assert host.address in addresses[host.name].split()
