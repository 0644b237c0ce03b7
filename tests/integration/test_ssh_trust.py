"""SSH trust on the session's 3-node cluster: the role's one-task check of every node's logins
to its peers (roles/ssh_trust/files/verify-peers.sh, as verify.yml runs it) passes, and when
one node no longer authorizes the cluster key, exactly the pairs into that node are named."""

import pytest

from tests.integration.conftest import CLUSTER3, node_shell

pytestmark = pytest.mark.integration
SCRIPT = "roles/ssh_trust/files/verify-peers.sh"
NODES = ("node1", "node2", "node3")


def _run(node: str, command: str) -> tuple[int, str]:
    return node_shell(node, command, cluster=CLUSTER3)


def _peers(inventory) -> list[str]:
    from pycli.cluster.model import load_cluster

    cluster = load_cluster(inventory)
    return [f"{host.name}={host.address}={_run(host.name, 'hostname')[1].strip()}" for host in cluster.hosts]


def _verify_from_every_node(inventory) -> dict[str, tuple[int, str]]:
    from pathlib import Path

    script = (Path(__file__).resolve().parents[2] / SCRIPT).read_text()
    peers = " ".join(_peers(inventory))
    answers = {}
    for place, node in enumerate(NODES):
        _run(node, f"cat > /tmp/verify-peers.sh <<'SCRIPT'\n{script}SCRIPT\n")
        answers[node] = _run(node, f"bash /tmp/verify-peers.sh 4 2 {place} all {peers} 2>/dev/null")
    return answers


def test_every_pair_passes_and_a_node_without_the_key_is_named_by_exactly_the_pairs_into_it(three_nodes):
    healthy = _verify_from_every_node(three_nodes)
    assert all(code == 0 for code, _ in healthy.values()), healthy
    assert all(out.count("ok ") == 6 for _, out in healthy.values())  # 3 nodes by name and by address

    keys = "~/.ssh/authorized_keys"
    code, _ = _run("node3", f"cp {keys} /tmp/authorized_keys.kept && grep -v pycli-cluster- /tmp/authorized_keys.kept > {keys}")
    assert code == 0
    try:
        broken = _verify_from_every_node(three_nodes)
    finally:
        _run("node3", f"cat /tmp/authorized_keys.kept > {keys}")
    address3 = _peers(three_nodes)[2].split("=")[1]
    for node, (code, out) in broken.items():
        failed = sorted(line.split(":")[0] for line in out.splitlines() if line.startswith("FAIL"))
        assert code == 1 and failed == sorted(["FAIL node3", f"FAIL {address3}"]), (node, out)


def test_a_full_hostname_and_a_second_address_pass_the_roles_own_check(three_nodes, tmp_path):
    """node2 set to node2.cluster.example (`hostname` there prints the full name, which the role's
    check must expect: Ansible's hostname fact is only its first label), and node1 with a second
    address on its interface, which it logs in from: the key's from= list must hold it."""
    import ipaddress

    from tests.conftest import run_pycli

    def trust(runs: str):
        return run_pycli("provision", str(three_nodes), "--tags", "ssh_trust", env={"PYCLI_RUNS": str(tmp_path / runs)})

    primary = ipaddress.ip_interface(_run("node1", "ip -o -4 addr show dev eth0")[1].split()[3])
    second = f"{primary.network[250]}/{primary.network.prefixlen}"
    code, out = _run("node1", f"ip addr add {second} dev eth0")
    assert code == 0, out
    code, out = _run("node2", "hostname node2.cluster.example && hostname")
    assert code == 0 and out.strip() == "node2.cluster.example", out
    try:
        proc = trust("unusual")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        login = f"ssh -b {second.split('/')[0]} -o BatchMode=yes -o StrictHostKeyChecking=yes node2 hostname"
        code, out = _run("node1", login)
        assert code == 0 and out.strip() == "node2.cluster.example", out
    finally:
        _run("node1", f"ip addr del {second} dev eth0")
        _run("node2", "hostname node2")
        assert trust("usual").returncode == 0  # the names and addresses it trusts are the nodes' own again
