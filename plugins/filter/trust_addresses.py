"""The addresses of role ssh_trust: every address a node may reach its peers from, or be reached
on, for the key's from= list and the known hosts.

From the node's facts: its cluster address first (the filter cluster_address, which the
play passes in: the node's address for the logins the role checks and for the fan-out of
artifacts), then the default route's addresses (IPv4, then IPv6), then every interface's (primary IPv4, its
secondary addresses, its IPv6 addresses), then the address Ansible reaches the node on.
Interfaces matching the ignored pattern (bridges, virtual links) are left out, and so are
loopback and link-local addresses: those never carry a login from another node.
"""

import ipaddress
import re


def _usable(address):
    try:
        ip = ipaddress.ip_address(str(address).split("%")[0])
    except ValueError:
        return False
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast)


def trust_addresses(facts, ignored="", ansible_host="", cluster_address=""):
    """Every usable address of a node, in the order above, each once."""
    found = [cluster_address, facts.get("default_ipv4", {}).get("address"), facts.get("default_ipv6", {}).get("address")]
    for name in facts.get("interfaces", []):
        if ignored and re.match(ignored, name):
            continue
        interface = facts.get(name.replace("-", "_"))
        if not isinstance(interface, dict):
            continue
        found.append(interface.get("ipv4", {}).get("address"))
        found += [entry.get("address") for entry in interface.get("ipv4_secondaries", [])]
        found += [entry.get("address") for entry in interface.get("ipv6", [])]
    found.append(ansible_host)
    addresses = []
    for address in found:
        if address and _usable(address) and str(address) not in addresses:
            addresses.append(str(address))
    return addresses


class FilterModule:
    def filters(self):
        return {"trust_addresses": trust_addresses}
