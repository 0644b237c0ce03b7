"""What keeps local clusters apart: each owns its inventory, and one pycli at a time changes a cluster.

No Docker: where `up` and `down` are called, the engine is a stand-in that fails the test if reached.
"""

import ipaddress
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pycli.core.errors import BadInput
from pycli.local import cluster as local_cluster
from pycli.local import dockerapi
from pycli.local.plan import check_inventory_owner, inventory_owner, plan_cluster, render_local_inventory
from tests.conftest import ROOT


def _inventory(name: str) -> str:
    plan = plan_cluster(name, 2, ipaddress.ip_network("172.28.7.0/24"))
    return render_local_inventory(plan, Path("/k"), Path("/kh"))


@pytest.fixture(autouse=True)
def _private_state(tmp_path, monkeypatch):
    monkeypatch.setenv("PYCLI_STATE", str(tmp_path / "state"))

    def no_docker():
        raise AssertionError("Docker was reached")

    monkeypatch.setattr(dockerapi, "connect", no_docker)


# --- whose inventory -------------------------------------------------------------------------


def test_the_inventory_pycli_writes_names_its_cluster():
    assert inventory_owner(_inventory("a")) == "a"
    assert inventory_owner("[nodes]\nn1\n") is None


def test_an_inventory_of_another_cluster_is_refused(tmp_path):
    path = tmp_path / "local-a.ini"
    with pytest.raises(BadInput, match=r"local-a.ini is the inventory of local cluster 'a'") as caught:
        check_inventory_owner(path, _inventory("a"), "b")
    assert "\n" not in str(caught.value)


def test_an_inventory_of_the_same_cluster_or_none_is_fine(tmp_path):
    check_inventory_owner(tmp_path / "local-a.ini", _inventory("a"), "a")
    check_inventory_owner(tmp_path / "new.ini", None, "a")


def test_an_inventory_pycli_did_not_write_is_refused(tmp_path):
    with pytest.raises(BadInput, match="was not written by pycli"):
        check_inventory_owner(tmp_path / "mine.ini", "[nodes]\nn1\n", "a")


def test_up_refuses_another_clusters_inventory_before_reaching_docker(tmp_path):
    path = tmp_path / "local-a.ini"
    path.write_text(_inventory("a"))
    with pytest.raises(BadInput, match="inventory of local cluster 'a'"):
        local_cluster.up("b", 2, inventory=path)
    assert inventory_owner(path.read_text()) == "a"


class _NoContainers:
    """A Docker client with no containers, networks or volumes."""

    class containers:  # noqa: N801
        @staticmethod
        def list(**_):
            return []

    class networks:  # noqa: N801
        @staticmethod
        def list(**_):
            return []

    class volumes:  # noqa: N801
        @staticmethod
        def list(**_):
            return []


def test_removing_a_cluster_leaves_another_clusters_inventory(tmp_path):
    theirs, ours = tmp_path / "local-a.ini", tmp_path / "local-b.ini"
    theirs.write_text(_inventory("a"))
    ours.write_text(_inventory("b"))
    local_cluster._remove(_NoContainers(), "b", theirs, None)
    assert theirs.exists()
    local_cluster._remove(_NoContainers(), "b", ours, None)
    assert not ours.exists()


def test_down_removes_the_keys_and_secrets_the_roles_made_for_that_cluster_only(tmp_path, monkeypatch):
    from pycli.local.plan import ROLE_STATE_DIRS

    monkeypatch.setenv("PYCLI_STATE", str(tmp_path / "state"))
    monkeypatch.setattr(dockerapi, "connect", lambda: _NoContainers())
    for role in ROLE_STATE_DIRS:
        for name in ("b", "bb"):
            (tmp_path / "state" / role / name).mkdir(parents=True)
            (tmp_path / "state" / role / name / "secret").write_text("x")
    local_cluster.down("b", say=lambda _: None)
    for role in ROLE_STATE_DIRS:
        assert not (tmp_path / "state" / role / "b").exists() and (tmp_path / "state" / role / "bb" / "secret").exists()
    # The folders are the roles' own: ssh_trust_key_dir and slurm_secret_dir end in <role>/<cluster name>.
    for role, var in zip(ROLE_STATE_DIRS, ("ssh_trust_key_dir", "slurm_secret_dir")):
        defaults = (ROOT / "roles" / role / "defaults" / "main.yml").read_text()
        assert var in defaults and f"~ '/{role}/' ~ {role}_cluster_name" in defaults


# --- one pycli at a time ---------------------------------------------------------------------


def test_a_second_holder_of_a_clusters_lock_is_refused_in_one_line():
    with local_cluster.cluster_lock("demo"):
        with pytest.raises(BadInput) as caught:
            with local_cluster.cluster_lock("demo"):
                pass
        assert str(caught.value) == f"cluster demo is being changed by another pycli (pid {os.getpid()})"
        with local_cluster.cluster_lock("other"):
            pass
    with local_cluster.cluster_lock("demo"):
        pass


def test_up_and_down_wait_for_no_one_while_another_process_holds_the_lock(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys
            from pycli.local.cluster import cluster_lock
            with cluster_lock("demo"):
                print("held", flush=True)
                sys.stdin.read()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ},
    )
    try:
        assert holder.stdout.readline() == "held\n"
        message = f"cluster demo is being changed by another pycli (pid {holder.pid})"
        with pytest.raises(BadInput, match=message.replace("(", r"\(").replace(")", r"\)")):
            local_cluster.up("demo", 2, inventory=tmp_path / "local-demo.ini")
        with pytest.raises(BadInput, match="being changed by another pycli"):
            local_cluster.down("demo")
    finally:
        holder.stdin.close()
        holder.wait(10)
    with local_cluster.cluster_lock("demo"):
        pass
