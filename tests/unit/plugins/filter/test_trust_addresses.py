"""Role ssh_trust's addresses (plugins/filter/trust_addresses.py): every address a node may log
in from or be reached on goes into the key's from= list and the known hosts."""

import importlib.util

from tests.conftest import PLUGINS

PLUGIN = PLUGINS / "filter" / "trust_addresses.py"
IGNORED = r"^(lo|docker[0-9]*|br-.*|veth.*|virbr.*|cni.*|flannel.*|cali.*|vxlan.*|tun.*|tap.*|kube.*)$"


def _filter():
    spec = importlib.util.spec_from_file_location("trust_addresses", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()["trust_addresses"]


def _facts(**interfaces) -> dict:
    loopback = {"ipv4": {"address": "127.0.0.1"}, "ipv6": [{"address": "::1", "scope": "host"}]}
    facts = {"interfaces": ["lo", *interfaces], "lo": loopback}
    facts.update({name.replace("-", "_"): value for name, value in interfaces.items()})
    return facts


def test_secondary_and_ipv6_addresses_are_in_and_the_default_routes_comes_first():
    facts = _facts(
        eth0={"ipv4": {"address": "10.1.0.11"}, "ipv4_secondaries": [{"address": "10.1.0.211"}],
              "ipv6": [{"address": "fd00:1::11", "scope": "global"}, {"address": "fe80::42:acff:fe1c:20b", "scope": "link"}]},
        eth1={"ipv4": {"address": "192.168.5.11"}},
    )
    facts["default_ipv4"] = {"address": "192.168.5.11"}
    facts["default_ipv6"] = {"address": "fd00:1::11"}
    assert _filter()(facts, IGNORED, "node1") == ["192.168.5.11", "fd00:1::11", "10.1.0.11", "10.1.0.211"]


def test_bridges_loopback_and_link_local_addresses_are_left_out_and_an_address_ansible_uses_is_in():
    facts = _facts(**{
        "docker0": {"ipv4": {"address": "172.17.0.1"}},
        "br-1a2b": {"ipv4": {"address": "172.18.0.1"}},
        "ens3": {"ipv4": {"address": "169.254.10.1"}, "ipv6": [{"address": "fe80::1", "scope": "link"}]},
    })
    assert _filter()(facts, IGNORED, "2001:db8::7") == ["2001:db8::7"]
    assert _filter()(facts, IGNORED, "10.9.0.4") == ["10.9.0.4"]
    assert _filter()(facts, IGNORED, "node4.cluster.example") == []


def test_an_interface_without_addresses_or_facts_is_passed_over():
    facts = _facts(eth0={"ipv4": {"address": "10.1.0.12"}}, eth1={})
    facts["interfaces"].append("ib0")  # no facts under its name
    assert _filter()(facts, IGNORED, "") == ["10.1.0.12"]


def test_the_cluster_address_comes_first_and_a_name_there_is_left_out():
    facts = {**_facts(eth0={"ipv4": {"address": "203.0.113.7"}}, ib0={"ipv4": {"address": "10.10.0.3"}}),
             "default_ipv4": {"address": "203.0.113.7"}}
    addresses = _filter()(facts, IGNORED, "", "10.10.0.3")
    assert addresses == ["10.10.0.3", "203.0.113.7"]
    assert _filter()(facts, IGNORED, "", "node1") == ["203.0.113.7", "10.10.0.3"]  # no address to log in at
