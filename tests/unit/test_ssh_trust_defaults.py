"""ssh_trust's defaults, rendered by Ansible's own templating: one key pair per inventory."""

from pathlib import Path

import pytest
import yaml

ROLE = Path(__file__).resolve().parents[2] / "roles" / "ssh_trust"


def _render(name: str, **variables) -> str:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(defaults[name]))


def test_two_inventories_never_share_a_cluster_key():
    prod = _render("ssh_trust_cluster_name", inventory_file="/srv/clusters/prod.ini")
    other = _render("ssh_trust_cluster_name", inventory_file="/home/me/prod.ini")
    assert prod.startswith("prod-") and other.startswith("prod-") and prod != other
    assert prod == _render("ssh_trust_cluster_name", inventory_file="/srv/clusters/prod.ini")  # stable


def test_a_local_cluster_keeps_its_own_name():
    assert _render("ssh_trust_cluster_name", inventory_file="/x/local-a.ini", pycli_local_cluster="a") == "a"


@pytest.mark.parametrize(("interface", "ignored"), [
    ("docker0", True), ("br-1a2b3c", True), ("veth12ab", True), ("lo", True), ("virbr0", True),
    ("eth0", False), ("ens5", False), ("ib0", False), ("enp1s0f0", False), ("bond0", False),
])
def test_bridges_and_virtual_links_never_give_the_key_a_source_address(interface, ignored):
    import re

    pattern = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["ssh_trust_ignored_interfaces"]
    assert bool(re.match(pattern, interface)) is ignored


def test_the_members_keep_the_group_s_order_so_a_second_run_writes_the_same_files():
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    members = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__ssh_trust_members"]
    group = [f"node{i}" for i in range(1, 13)]
    answered = [host for host in reversed(group) if host != "node7"]  # node7 is down
    rendered = Templar(loader=DataLoader(), variables={
        "groups": {"nodes": group}, "ssh_trust_cluster_group": "nodes", "ansible_play_hosts": answered,
    }).template(trust_as_template(members))
    assert rendered == [host for host in group if host != "node7"]
