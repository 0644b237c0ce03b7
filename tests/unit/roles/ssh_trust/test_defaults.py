"""ssh_trust's defaults, rendered by Ansible's own templating: one key pair per inventory."""

import pytest
import yaml

from tests.conftest import ROOT

ROLE = ROOT / "roles" / "ssh_trust"


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


def _role_var(name: str, **variables):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    expression = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())[name]
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(expression))


def test_the_members_keep_the_group_s_order_so_a_second_run_writes_the_same_files():
    group = [f"node{i}" for i in range(1, 13)]
    answered = [host for host in reversed(group) if host != "node7"]  # node7 is down
    known = {host: {} for host in reversed(group) if host != "node12"}  # node12 was never reached
    variables = {"groups": {"nodes": group}, "ssh_trust_cluster_group": "nodes", "ansible_play_hosts": answered,
                 "__ssh_trust_nodes": known}
    # The files list node7, down now (its recorded entry), and not node12, never seen.
    assert _role_var("__ssh_trust_members", **variables) == group[:11]
    # Only the nodes reached log in to each other.
    assert _role_var("__ssh_trust_reached", **variables) == [host for host in group if host != "node7"]


def test_a_node_s_description_holds_each_host_key_as_type_and_key_in_the_role_s_order():
    """What the other nodes' known_hosts get of this node, and the controller records (preflight.yml)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    tasks = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
    (task,) = [t for t in tasks if t["name"] == "Describe this node for the others' trust"]
    facts = {"ssh_host_key_rsa_public": "AAAAB3rsa", "ssh_host_key_rsa_public_keytype": "ssh-rsa",
             "ssh_host_key_ed25519_public": "AAAAC3ed", "ssh_host_key_ed25519_public_keytype": "ssh-ed25519",
             "nodename": "node1.cluster.example"}
    variables = {"ansible_facts": facts, "_ssh_trust_names": ["node1"], "_ssh_trust_addresses": ["10.0.0.1"],
                 **yaml.safe_load((ROLE / "vars" / "main.yml").read_text())}
    templar = Templar(loader=DataLoader(), variables={**variables, "_kinds": trust_as_template(task["vars"]["_kinds"])})
    node = {key: templar.template(trust_as_template(value))
            for key, value in task["ansible.builtin.set_fact"]["_ssh_trust_node"].items()}
    assert node == {"names": ["node1"], "addresses": ["10.0.0.1"], "nodename": "node1.cluster.example",
                    "keys": ["ssh-ed25519 AAAAC3ed", "ssh-rsa AAAAB3rsa"]}


def test_the_cluster_s_name_is_the_one_its_nodes_recorded_so_a_moved_inventory_keeps_it():
    recorded = {"node1": {"ansible_local": {"ssh_trust": {"cluster": "prod-3f4a1b2c"}}}, "node2": {}}
    moved = {"inventory_file": "/elsewhere/renamed.ini", "ansible_play_hosts_all": ["node1", "node2"]}
    assert _render("ssh_trust_cluster_name", hostvars=recorded, **moved) == "prod-3f4a1b2c"
    # The first run: nothing recorded yet, the name made from the inventory's path as before.
    fresh = _render("ssh_trust_cluster_name", hostvars={"node1": {}, "node2": {}}, **moved)
    assert fresh.startswith("renamed-") and len(fresh) == len("renamed-") + 8
    # The inventory's own choice wins (preflight refuses it where the nodes recorded another).
    assert _render("ssh_trust_cluster_name", hostvars=recorded, pycli_cluster_name="lab", **moved) == "lab"


def test_a_run_naming_the_cluster_otherwise_than_its_nodes_is_refused_in_one_message():
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    tasks = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
    (task,) = [t for t in tasks if t["name"] == "Check the nodes belong to the cluster this run names"]
    hostvars = {"node1": {"ansible_local": {"ssh_trust": {"cluster": "prod-3f4a1b2c"}}}, "node2": {}}
    for name, passes in (("prod-3f4a1b2c", True), ("another", False)):
        variables = {"hostvars": hostvars, "ansible_play_hosts_all": ["node1", "node2"], "ssh_trust_cluster_name": name}
        variables.update({k: trust_as_template(v) for k, v in task["vars"].items()})
        templar = Templar(loader=DataLoader(), variables=variables)
        assert templar.template(trust_as_template("{{ " + task["ansible.builtin.assert"]["that"] + " }}")) is passes
        # Ansible resolves the message whether or not the assert fails: it must render in both cases.
        templar.template(trust_as_template(task["ansible.builtin.assert"]["fail_msg"]))
    said = " ".join(templar.template(trust_as_template(task["ansible.builtin.assert"]["fail_msg"])).split())
    assert said.startswith("These nodes were set up as cluster prod-3f4a1b2c (node1: prod-3f4a1b2c), and this run names it another")
    assert "Set pycli_cluster_name=prod-3f4a1b2c" in said
