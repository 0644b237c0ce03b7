"""A node's cluster address has one rule, role cluster_address's filter, which /etc/hosts (role
common), the package cache's address, slurm.conf and the monitoring targets all use."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.conftest import ROOT, ansible_plugins

ROLES = ROOT / "roles"
PUBLIC, CLUSTER, SSH = "203.0.113.7", "10.10.0.3", "192.168.1.3"


def _node(interface: str | None = None, facts: bool = True, ansible_host: str | None = SSH) -> dict:
    found: dict = {"ansible_host": ansible_host} if ansible_host else {}
    if facts:
        found["ansible_facts"] = {"hostname": "n1", "default_ipv4": {"address": PUBLIC},
                                  "ib_0": {"ipv4": {"address": CLUSTER}}}
    return {**found, "pycli_network_interface": interface} if interface else found


def _template(text: str, hostvars: dict, **variables) -> str:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    ansible_plugins()
    templar = Templar(loader=DataLoader(), variables={"hostvars": hostvars, **variables}).copy_with_new_env(trim_blocks=True)
    return templar.template(trust_as_template(text))


@pytest.mark.parametrize(("node", "address"), [
    (_node("ib-0"), CLUSTER),                       # the interface the inventory names for the cluster
    (_node("eth9"), PUBLIC),                        # named, but not on this node: the default route's
    (_node(), PUBLIC),                              # none named: the default route's
    (_node(facts=False), SSH),                      # not reached in this run: where Ansible reaches it
    (_node(facts=False, ansible_host=None), "n1"),  # nor an address in the inventory: its name
])
def test_the_rule(node, address):
    assert _template("{{ hostvars['n1'] | pycli.cluster.cluster_address('n1') }}", {"n1": node}) == address


def test_etc_hosts_and_the_package_cache_give_a_node_the_address_the_rule_gives():
    hostvars = {"n1": _node("ib-0"), "n2": _node(facts=False)}
    hosts = _template((ROLES / "common" / "templates" / "hosts.j2").read_text(), hostvars,
                      groups={"nodes": ["n1", "n2"]}, common_cluster_group="nodes")
    assert hosts.splitlines() == [f"{CLUSTER} n1", f"{SSH} n2"]
    cache = yaml.safe_load((ROLES / "package_cache" / "vars" / "main.yml").read_text())["__package_cache_address"]
    assert _template(cache, hostvars, __package_cache_host="n1") == CLUSTER
    assert _template(cache, hostvars, __package_cache_host="") == ""  # no cache host: no address


def test_no_role_picks_a_node_s_address_from_its_facts_by_itself():
    # The facts' default route address is read in the filter alone (slurm's preflight may check it is there).
    pattern = re.compile(r"\['default_ipv4'\]\['address'\](?! is defined)")
    sources = [*ROLES.glob("*/*/*.yml"), *ROLES.glob("*/templates/*.j2"), *(ROLES.parent / "playbooks").glob("*.yml")]
    assert len(sources) > 50
    assert [str(p.relative_to(ROLES.parent)) for p in sources if pattern.search(p.read_text())] == []


def test_every_role_that_writes_an_address_names_the_rule_by_its_full_name():
    """A bare `cluster_address` would not be found where the roles run as the collection pycli.cluster."""
    bare = re.compile(r"\|\s*cluster_address\(")
    for role in ("common", "package_cache", "slurm", "monitoring", "ssh_trust"):
        sources = [p for p in (ROLES / role).rglob("*") if p.suffix in {".yml", ".j2"}]
        assert any("pycli.cluster.cluster_address(" in p.read_text() for p in sources), role
        assert [p.name for p in sources if bare.search(p.read_text())] == [], role


def test_monitoring_refuses_to_listen_unasked_on_a_public_default_route():
    """The monitoring role's preflight: no interface named and no listen address set, a node whose
    default route is a public address stops the run; a private one, a named interface or an
    explicit address passes."""
    tasks = yaml.safe_load((ROLES / "monitoring" / "tasks" / "facts.yml").read_text())
    (check,) = [t for t in tasks if t["name"] == "Check the daemons would not answer the internet unasked"]
    role_vars = yaml.safe_load((ROLES / "monitoring" / "vars" / "main.yml").read_text())
    condition = "{{ (" + check["ansible.builtin.assert"]["that"].strip() + ") | bool }}"

    def passes(node: dict, listen: str = "") -> bool:
        names = {key: role_vars[key] for key in ("__monitoring_interface", "__monitoring_address")}
        said = _template(condition, {"n1": node}, inventory_hostname="n1", monitoring_listen_address=listen,
                         **{k: _template(v, {"n1": node}, inventory_hostname="n1", **node) for k, v in names.items()}, **node)
        return said in (True, "True")

    def route(address: str, interface: str | None = None) -> dict:
        node = _node(interface)
        node["ansible_facts"]["default_ipv4"]["address"] = address
        return node

    assert not passes(route("34.120.7.9"))
    assert passes(route("34.120.7.9"), listen="10.10.0.3") and passes(route("34.120.7.9", "ib-0"))
    assert passes(route("10.20.0.4")) and passes(route("172.28.246.11"))
