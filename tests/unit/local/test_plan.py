"""The pure parts of the local cluster: names, addresses, subnets, the inventory it writes."""

import ipaddress
from pathlib import Path

import pytest

from pycli.core.errors import BadInput
from pycli.local.plan import (
    INVENTORY_MARKER,
    LOCAL_NODE_SLOTS,
    SUBNET_POOL,
    parse_subnet,
    pick_subnet,
    plan_cluster,
    render_local_inventory,
    validate_name,
)


def test_plan_gives_each_node_a_unique_name_container_and_address():
    plan = plan_cluster("demo", 3, ipaddress.ip_network("172.28.7.0/24"))
    assert [n.hostname for n in plan.nodes] == ["node1", "node2", "node3"]
    assert [n.container for n in plan.nodes] == ["pycli-demo-node1", "pycli-demo-node2", "pycli-demo-node3"]
    assert [n.address for n in plan.nodes] == ["172.28.7.11", "172.28.7.12", "172.28.7.13"]
    assert plan.network == "pycli-demo"


@pytest.mark.parametrize("count", [0, -1, 65])
def test_plan_refuses_node_counts_out_of_range(count):
    with pytest.raises(BadInput, match="--nodes must be between 1 and 64"):
        plan_cluster("demo", count, ipaddress.ip_network("172.28.7.0/24"))


@pytest.mark.parametrize("slots", [0, -4])
def test_plan_refuses_fewer_than_one_slot(slots):
    with pytest.raises(BadInput, match="--slots must be 1 or more processes per node, got"):
        plan_cluster("demo", 2, ipaddress.ip_network("172.28.7.0/24"), slots)


def test_plan_refuses_a_subnet_too_small_for_the_nodes():
    with pytest.raises(BadInput, match="too small"):
        plan_cluster("demo", 8, ipaddress.ip_network("172.28.7.0/28"))


@pytest.mark.parametrize(("text", "message"), [
    ("fd00::/64", "IPv4 only"),
    ("fd00::/120", "IPv4 only"),
    ("10.0.0.0/8", "a prefix from /16 to /28"),
    ("0.0.0.0/0", "a prefix from /16 to /28"),
    ("172.28.7.0/30", "a prefix from /16 to /28"),
    ("172.28.7.5/24", "has host bits set"),
    ("not-a-net", "does not appear to be an IPv4 or IPv6 network"),
])
def test_subnet_given_by_the_user_is_ipv4_and_of_bounded_size(text, message):
    with pytest.raises(BadInput, match=message) as caught:
        parse_subnet(text)
    assert str(caught.value).startswith(f"--subnet {text!r}") and "\n" not in str(caught.value)


@pytest.mark.parametrize("text", ["172.28.0.0/16", "10.1.2.0/24", "192.168.5.16/28"])
def test_subnet_within_bounds_is_taken(text):
    assert parse_subnet(text) == ipaddress.ip_network(text)


@pytest.mark.parametrize("subnet", ["fd00::/120", "10.0.0.0/12"])
def test_plan_refuses_subnets_it_would_not_parse(subnet):
    with pytest.raises(BadInput, match="--subnet"):
        plan_cluster("demo", 2, ipaddress.ip_network(subnet))


def test_plan_addresses_in_the_largest_subnet_without_listing_it():
    plan = plan_cluster("demo", 64, ipaddress.ip_network("10.7.0.0/16"))
    assert plan.nodes[0].address == "10.7.0.11" and plan.nodes[-1].address == "10.7.0.74"


@pytest.mark.parametrize("name", ["", "Demo", "a_b", "-a", "a-", "x" * 25, "a.b"])
def test_names_that_cannot_name_containers_and_networks_are_refused(name):
    with pytest.raises(BadInput, match="cluster name"):
        validate_name(name)


@pytest.mark.parametrize("name", ["a", "demo", "ci-42", "x" * 24])
def test_good_names_pass(name):
    validate_name(name)


def test_subnet_is_stable_for_a_name_and_inside_the_pool():
    first = pick_subnet("demo", [])
    assert first == pick_subnet("demo", [])
    assert first.subnet_of(SUBNET_POOL) and first.prefixlen == 24


def test_subnet_skips_blocks_that_overlap_existing_networks():
    first = pick_subnet("demo", [])
    again = pick_subnet("demo", [first, ipaddress.ip_network("10.0.0.0/8")])
    assert again != first and not again.overlaps(first)


def test_subnet_pool_exhausted_is_an_error():
    from pycli.core.errors import PycliError

    with pytest.raises(PycliError, match="no free /24"):
        pick_subnet("demo", [SUBNET_POOL])


def test_inventory_reads_back_through_ansible(tmp_path):
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    plan = plan_cluster("demo", 2, ipaddress.ip_network("172.28.7.0/24"))
    text = render_local_inventory(plan, Path("/keys/id_ed25519"), Path("/keys/known hosts"))
    assert text.startswith(INVENTORY_MARKER)
    path = tmp_path / "local-demo.ini"
    path.write_text(text)
    inventory = InventoryManager(loader=DataLoader(), sources=[str(path)])
    hosts = inventory.get_groups_dict()["nodes"]
    assert hosts == ["node1", "node2"]
    node2 = inventory.get_host("node2")
    merged = {**inventory.groups["nodes"].get_vars(), **node2.get_vars()}
    assert merged["ansible_host"] == "172.28.7.12"
    assert merged["ansible_user"] == "root"
    assert merged["ansible_port"] == 22
    assert merged["slots"] == LOCAL_NODE_SLOTS == 4
    # A path with a space survives quoting, and host keys are never switched off.
    assert merged["ansible_ssh_common_args"] == "-o UserKnownHostsFile=/keys/known hosts"
    assert "StrictHostKeyChecking" not in text


def test_slurms_cgroup_plugins_are_on_only_where_the_nodes_booted_with_their_own_cgroup_tree(tmp_path):
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    plan = plan_cluster("demo", 2, ipaddress.ip_network("172.28.7.0/24"))
    merged = {}
    for tree in (False, True):
        path = tmp_path / f"tree-{tree}.ini"
        path.write_text(render_local_inventory(plan, Path("/k"), Path("/kh"), cgroup_tree=tree))
        inventory = InventoryManager(loader=DataLoader(), sources=[str(path)])
        merged[tree] = inventory.groups["nodes"].get_vars()
    # (Ansible reads an ini file's booleans as strings; the role's `| bool` takes them.)
    assert merged[False]["slurm_cgroup"] == "false" and "slurm_cgroup_config" not in merged[False]
    assert merged[True]["slurm_cgroup"] == "true"
    assert merged[True]["slurm_cgroup_config"] == {
        "CgroupPlugin": "cgroup/v1", "CgroupMountpoint": "/run/pycli-cgroup", "ConstrainCores": "no"}
    # Either way a job that names no memory gets 2 GiB per CPU, so jobs share a node.
    assert merged[False]["slurm_extra_config"] == merged[True]["slurm_extra_config"] == {"DefMemPerCPU": 2048}


def test_inventory_gives_every_node_the_slots_asked_for(tmp_path):
    from pycli.cluster.model import load_cluster

    plan = plan_cluster("demo", 2, ipaddress.ip_network("172.28.7.0/24"), slots=3)
    path = tmp_path / "local-demo.ini"
    path.write_text(render_local_inventory(plan, Path("/k"), Path("/kh")))
    cluster = load_cluster(path)
    assert [host.slots for host in cluster.hosts] == [3, 3] and cluster.total_slots == 6
    assert "# Processes per node: these nodes have no GPU; ranks share the machine's cores." in path.read_text()


def test_a_slurm_or_monitoring_cluster_has_node1_as_its_controller(tmp_path):
    from pycli.cluster.model import load_cluster

    subnet = ipaddress.ip_network("172.28.7.0/24")
    path = tmp_path / "local-demo.ini"
    path.write_text(render_local_inventory(plan_cluster("demo", 2, subnet, opt_in=["slurm_controller"]), Path("/k"), Path("/kh")))
    assert (load_cluster(path).slurm_controller, load_cluster(path).monitoring_host) == ("node1", None)
    both = plan_cluster("demo", 2, subnet, opt_in=["slurm_controller", "monitoring"])
    path.write_text(render_local_inventory(both, Path("/k"), Path("/kh")))
    assert (load_cluster(path).slurm_controller, load_cluster(path).monitoring_host) == ("node1", "node1")
    assert "\n# Monitoring: Prometheus and Alertmanager; every host of [nodes] runs node-exporter.\n[monitoring]\nnode1\n" in path.read_text()
    path.write_text(render_local_inventory(plan_cluster("demo", 2, subnet), Path("/k"), Path("/kh")))
    assert (load_cluster(path).slurm_controller, load_cluster(path).monitoring_host) == (None, None)


def test_test_bed_settings_read_back_as_data(tmp_path):
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    plan = plan_cluster("demo", 1, ipaddress.ip_network("172.28.7.0/24"))
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    path = tmp_path / "local-demo.ini"
    path.write_text(render_local_inventory(plan, Path("/k"), Path("/kh"), ca))
    inventory = InventoryManager(loader=DataLoader(), sources=[str(path)])
    merged = inventory.groups["nodes"].get_vars()
    assert merged["docker_daemon_options"] == {
        "iptables": False, "ip6tables": False, "bridge": "none",
        "runtimes": {"runc-nested": {"path": "/usr/local/bin/runc-nested"}}, "default-runtime": "runc-nested",
    }
    assert merged["openmpi_source_sha256"] == "ddaee7dbdb01eb4fab1fda5b5e03e8bbff026711806c095c1f39bb410f99f263"
    assert merged["common_extra_ca_bundle"] == str(ca.resolve())


def test_the_package_cache_group_comes_when_asked_or_from_eight_hosts_unless_refused():
    from pycli.cluster.inventory_writer import PACKAGE_CACHE_FROM_HOSTS, opt_in_groups

    assert opt_in_groups() == ()
    assert opt_in_groups(slurm=True, package_cache=True) == ("slurm_controller", "package_cache")
    assert PACKAGE_CACHE_FROM_HOSTS == 8
    assert opt_in_groups(package_cache=None, hosts=7) == ()
    assert opt_in_groups(package_cache=None, hosts=8) == ("package_cache",)
    assert opt_in_groups(package_cache=False, hosts=64) == ()
