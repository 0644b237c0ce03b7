"""The cluster address of a node: where the other nodes and the cluster's services reach it.

The one rule every role uses (/etc/hosts, slurm.conf, the monitoring targets and listen
addresses, the package cache's address): the IPv4 address of the interface the inventory names
for the cluster's network (pycli_network_interface), else the address of the node's IPv4
default route, else the address Ansible reaches it on (ansible_host), else its inventory name.
The interface comes first because a default route is a public address on many servers.

From the node's variables as a play sees them (hostvars[name]), so that a template can ask it
of every node, also of one not reached in this run (no facts: its inventory address).
"""

import ipaddress

from jinja2.exceptions import UndefinedError


def _value(host_vars, key):
    try:
        return host_vars.get(key)
    except (AttributeError, UndefinedError):  # a host the play does not know
        return None


def cluster_address(host_vars, name):
    facts = _value(host_vars, "ansible_facts") or {}
    interface = str(_value(host_vars, "pycli_network_interface") or "")
    # Ansible's facts spell a "-" in an interface's name "_".
    named = facts.get(interface.replace("-", "_")) if interface else None
    for found in (named, facts.get("default_ipv4")):
        address = found.get("ipv4", found).get("address") if isinstance(found, dict) else None
        if address:
            return str(address)
    return str(_value(host_vars, "ansible_host") or name)


def is_global_address(address):
    """Whether `address` is an IP address the internet routes (not private, loopback, link-local,
    shared or reserved): a daemon without authentication must not answer there by default."""
    try:
        return ipaddress.ip_address(str(address)).is_global
    except ValueError:  # a name, not an address
        return False


class FilterModule:
    def filters(self):
        return {"cluster_address": cluster_address, "is_global_address": is_global_address}
