"""The cluster model read through Ansible's own loader: real inventories in tmp_path, no mocks."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from pycli.cluster.inventory_writer import HostEntry
from pycli.cluster.model import (
    Cluster,
    Host,
    address_problem,
    host_from_vars,
    interface_problem,
    load_cluster,
    login_name_problem,
    parse_host_list,
    positive_int,
)
from pycli.core.errors import EXIT_BAD_INPUT, BadInput
from tests.conftest import run_pycli


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def bad_input(path: Path) -> str:
    with pytest.raises(BadInput) as caught:
        load_cluster(path)
    assert caught.value.exit_code == EXIT_BAD_INPUT
    return str(caught.value)


# ------------------------------------------------------------------ input forms


def test_ini_with_group_vars_per_host_values_and_launcher(tmp_path):
    inventory = write(tmp_path, "hosts.ini", """
        [nodes]
        gpu1 ansible_host=10.0.0.1 slots=8
        gpu2 ansible_host=10.0.0.2
        gpu3:2222 ansible_user=admin

        [launcher]
        gpu2

        [nodes:vars]
        ansible_user=train
        slots=4
    """)
    cluster = load_cluster(inventory)
    assert cluster == Cluster(
        hosts=(
            Host("gpu1", "10.0.0.1", 22, "train", 8),
            Host("gpu2", "10.0.0.2", 22, "train", 4),
            Host("gpu3", "gpu3", 2222, "admin", 4),
        ),
        launcher="gpu2",
    )
    assert cluster.total_slots == 16
    assert cluster.launcher_host.address == "10.0.0.2"


def test_defaults_first_node_launches_one_slot_port_22_current_user(tmp_path):
    cluster = load_cluster(write(tmp_path, "hosts", "[nodes]\nb\na\n"))
    assert cluster == Cluster(hosts=(Host("b", "b"), Host("a", "a")), launcher="b")
    assert cluster.hosts[0].user is None
    assert cluster.hosts[0].login_user  # whoever runs the tests


def test_slurm_controller_group_names_the_primary_then_its_backup(tmp_path):
    one = load_cluster(write(tmp_path, "one", "[nodes]\na\nb\nc\n[slurm_controller]\nb\n"))
    assert (one.slurm_controller, one.slurm_backup, one.slurm_controllers) == ("b", None, ("b",))
    two = load_cluster(write(tmp_path, "two", "[nodes]\na\nb\nc\n[slurm_controller]\nc\na\n"))
    assert (two.slurm_controller, two.slurm_backup, two.slurm_controllers) == ("c", "a", ("c", "a"))
    assert not load_cluster(write(tmp_path, "none", "[nodes]\na\n")).slurm_controllers


def test_yaml_inventory(tmp_path):
    inventory = write(tmp_path, "hosts.yml", """
        all:
          children:
            nodes:
              vars:
                slots: 2
              hosts:
                n1: {ansible_host: 192.168.1.1, ansible_port: 2201}
                n2: {ansible_host: 192.168.1.1, ansible_port: 2202, slots: "4"}
            launcher:
              hosts:
                n2:
    """)
    assert load_cluster(inventory) == Cluster(
        hosts=(Host("n1", "192.168.1.1", 2201, None, 2), Host("n2", "192.168.1.1", 2202, None, 4)), launcher="n2"
    )


def test_directory_with_group_vars_and_host_vars_files(tmp_path):
    inventory = tmp_path / "inv"
    write(inventory, "10-hosts.ini", "[gpu_a]\na1\na2\n[gpu_b]\nb1\n")
    write(inventory, "20-groups.yml", "nodes:\n  children:\n    gpu_a:\n    gpu_b:\n")
    write(inventory, "group_vars/all.yml", "ansible_user: everyone\nslots: 1\n")
    write(inventory, "group_vars/nodes/main.yml", "slots: 2\n")
    write(inventory, "group_vars/gpu_b.yml", "slots: 8\nansible_user: bee\n")
    write(inventory, "host_vars/a2.yml", "ansible_host: 10.9.9.2\nslots: 3\n")
    cluster = load_cluster(inventory)
    assert [(h.name, h.address, h.user, h.slots) for h in cluster.hosts] == [
        ("a1", "a1", "everyone", 2),
        ("a2", "10.9.9.2", "everyone", 3),
        ("b1", "b1", "bee", 8),
    ]


def test_host_ranges_old_ssh_aliases_and_templates(tmp_path):
    inventory = write(tmp_path, "hosts.ini", """
        [nodes]
        gpu[01:03].example.com
        old ansible_ssh_host=10.1.1.1 ansible_ssh_port=2022 ansible_ssh_user=legacy

        [nodes:vars]
        gpus_per_host=4
        slots="{{ gpus_per_host * 2 }}"
    """)
    cluster = load_cluster(inventory)
    assert [h.name for h in cluster.hosts] == ["gpu01.example.com", "gpu02.example.com", "gpu03.example.com", "old"]
    assert cluster.hosts[-1] == Host("old", "10.1.1.1", 2022, "legacy", 8)
    assert {h.slots for h in cluster.hosts} == {8}


def test_same_values_as_ansible_variable_manager(tmp_path):
    """Our per-group-set merge must give what Ansible's VariableManager gives, host by host."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    inventory = tmp_path / "inv"
    write(inventory, "hosts.ini", """
        [nodes:children]
        rack1
        rack2
        [rack1]
        r1a slots=5
        r1b
        [rack2]
        r2a ansible_port=2200
        [rack2:vars]
        slots=3
        ansible_user=rack2user
        [all:vars]
        ansible_user=alluser
        ansible_port=2022
    """)
    write(inventory, "group_vars/rack1.yml", "slots: 7\n")
    write(inventory, "group_vars/all.yml", "slots: 1\nansible_host: '{{ inventory_hostname }}.lan'\n")
    write(inventory, "host_vars/r1b.yml", "ansible_user: r1buser\n")
    ours = load_cluster(inventory)

    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(inventory)])
    variables = VariableManager(loader=loader, inventory=manager)
    from ansible.template import Templar

    for host in ours.hosts:
        merged = variables.get_vars(host=manager.get_host(host.name))
        templar = Templar(loader=loader, variables=merged)
        resolved = {key: templar.template(merged[key]) for key in ("ansible_host", "ansible_port", "ansible_user", "slots")}
        assert host_from_vars(host.name, resolved) == (host, [])
    # Ansible's default precedence: group_vars/all.yml (slots: 1) beats [rack2:vars] in the file.
    assert [h.slots for h in ours.hosts] == [5, 7, 1]
    assert ours.hosts[1].user == "r1buser" and ours.hosts[2].port == 2200


# ------------------------------------------------------------------ every error


ERRORS = {
    "ini parse error names Ansible's message and the line": (
        "hosts.ini",
        "[nodes]\na\nb slots\n",
        ["hosts.ini:3:", "Expected key=value host variable assignment, got: slots"],
    ),
    "ini unknown section type": ("hosts.ini", "[nodes]\na\n[nodes:bogus]\n", ["hosts.ini:3:", "has unknown type: bogus"]),
    "yaml parse error names the line and column": (
        "hosts.yml",
        "nodes:\n  hosts:\n    a: {ansible_host: 1.2.3.4\n",
        ["hosts.yml:4:1:", "YAML parsing failed"],
    ),
    "yaml with a wrong shape": ("hosts.yml", "nodes:\n  hosts:\n    - a\n", ['Invalid "hosts" entry for "nodes" group']),
    "no nodes group": ("hosts.ini", "[gpus]\na\n", ["no group 'nodes' (groups found: gpus)", "[nodes:children]"]),
    "empty nodes group": ("hosts.ini", "[nodes]\n[launcher]\n", ["group 'nodes' has no hosts"]),
    "ini host listed twice": (
        "hosts.ini",
        "[nodes]\na ansible_host=10.0.0.1\nb\na ansible_host=10.0.0.3\n",
        ["hosts.ini:4: host 'a' sets ansible_host again (first on line 2)", "list each host once"],
    ),
    "yaml host listed twice": (
        "hosts.yml",
        "nodes:\n  hosts:\n    a:\n    a:\n",
        ["hosts.yml:4:5: Found duplicate mapping key 'a'.", "keeps only the last one"],
    ),
    "two names, one address and port": (
        "hosts.ini",
        "[nodes]\na ansible_host=10.0.0.1\nb ansible_host=10.0.0.1 ansible_port=22\n",
        ["hosts 'a' and 'b' both reach 10.0.0.1:22", "own ansible_host or ansible_port"],
    ),
    "slots zero": ("hosts.ini", "[nodes]\na slots=0\n", ["host 'a': slots must be a positive integer", "got 0"]),
    "slots negative": ("hosts.ini", "[nodes]\na slots=-2\n", ["got -2"]),
    "slots a word": ("hosts.ini", "[nodes]\na slots=eight\n", ["got 'eight'"]),
    "slots a fraction": ("hosts.ini", "[nodes]\na slots=1.5\n", ["got 1.5"]),
    "slots a boolean": ("hosts.yml", "nodes:\n  hosts:\n    a: {slots: true}\n", ["got True"]),
    "port out of range": ("hosts.ini", "[nodes]\na ansible_port=70000\n", ["ansible_port must be a port number (1-65535), got 70000"]),
    "launcher not in nodes": ("hosts.ini", "[nodes]\na\n[launcher]\nz\n", ["launcher 'z' is not in group 'nodes'", "(a)"]),
    "two launchers": ("hosts.ini", "[nodes]\na\nb\n[launcher]\na\nb\n", ["group 'launcher' names 2 hosts (a, b); name exactly one"]),
    "slurm controller outside nodes": (
        "hosts.ini", "[nodes]\na\nb\n[slurm_controller]\nz\n",
        ["slurm controller 'z' (group 'slurm_controller') is not in group 'nodes'", "(a, b)"],
    ),
    "three slurm controllers": (
        "hosts.ini", "[nodes]\na\nb\nc\n[slurm_controller]\na\nb\nc\n",
        ["group 'slurm_controller' names 3 hosts (a, b, c); name one or two: the primary, where slurmctld and slurmdbd run, "
         "then its backup"],
    ),
    "a backup slurm controller outside nodes": (
        "hosts.ini", "[nodes]\na\nb\n[slurm_controller]\na\nz\n",
        ["slurm controller 'z' (group 'slurm_controller') is not in group 'nodes'"],
    ),
    "monitoring host outside nodes": (
        "hosts.ini", "[nodes]\na\nb\n[monitoring]\nz\n",
        ["monitoring host 'z' (group 'monitoring') is not in group 'nodes'", "(a, b): it runs node-exporter too"],
    ),
    "two monitoring hosts": (
        "hosts.ini", "[nodes]\na\nb\n[monitoring]\na\nb\n",
        ["group 'monitoring' names 2 hosts (a, b); name exactly one, where Prometheus and Alertmanager run"],
    ),
    "alert webhook that is no URL": (
        "hosts.ini", "[nodes]\na\nb\n[monitoring]\na\n[nodes:vars]\nmonitoring_alert_webhook_url=hooks.example.com/alerts\n",
        ["monitoring_alert_webhook_url 'hooks.example.com/alerts' is not an http:// or https:// URL"],
    ),
    "name not a DNS label": ("hosts.ini", "[nodes]\ngpu_1\n", ["host 'gpu_1': 'gpu_1' is not a valid host name", "rename it"]),
    "address not a DNS name": ("hosts.ini", "[nodes]\na ansible_host=-bad.example\n", ["'-bad.example' is not a valid host name", "fix its ansible_host"]),
    "user that is an ssh option": (
        "hosts.ini", "[nodes]\na ansible_user=-oProxyCommand=touch${IFS}/tmp/pwned\n",
        ["host 'a': ansible_user '-oProxyCommand=touch${IFS}/tmp/pwned' is not a login name"],
    ),
    "user with shell syntax": (
        "hosts.yml", "nodes:\n  hosts:\n    a: {ansible_ssh_user: 'ml; reboot'}\n",
        ["host 'a': ansible_ssh_user 'ml; reboot' is not a login name"],
    ),
    "user too long": ("hosts.ini", f"[nodes]\na ansible_user={'u' * 33}\n", ["is not a login name"]),
    "interface with a command in it": (
        "hosts.ini", "[nodes]\na\n[nodes:vars]\npycli_network_interface='eth0$(touch${IFS}/tmp/pwned)'\n",
        ["host 'a': pycli_network_interface 'eth0$(touch${IFS}/tmp/pwned)' is not a network interface name"],
    ),
    "interface too long": (
        "hosts.ini", "[nodes]\na pycli_network_interface=enp0s31f6longname\n",
        ["pycli_network_interface 'enp0s31f6longname' is not a network interface name", "1-15"],
    ),
    "template that cannot resolve": ("hosts.ini", "[nodes]\na slots='{{ nope }}'\n", ["host 'a': slots '{{ nope }}' cannot be resolved", "nope"]),
}


@pytest.mark.parametrize("name, text, expected", ERRORS.values(), ids=ERRORS.keys())
def test_each_error_is_bad_input_saying_what_to_change(tmp_path, name, text, expected):
    message = bad_input(write(tmp_path, name, text))
    first_line = message.splitlines()[0]
    assert first_line.startswith(str(tmp_path / name))
    for fragment in expected:
        assert fragment in message
    assert "Traceback" not in message


def test_missing_inventory(tmp_path):
    message = bad_input(tmp_path / "nope.ini")
    assert "no such inventory" in message and "pycli inventory new" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_inventory(tmp_path):
    inventory = write(tmp_path, "hosts.ini", "[nodes]\na\n")
    inventory.chmod(0)
    assert "cannot read the inventory" in bad_input(inventory)


def test_a_broken_file_in_an_inventory_directory_is_reported(tmp_path):
    write(tmp_path / "inv", "good.ini", "[nodes]\na\n")
    write(tmp_path / "inv", "broken.yml", "nodes: [\n")
    message = bad_input(tmp_path / "inv")
    assert f"{tmp_path / 'inv' / 'broken.yml'}:2:1: Ansible cannot read this inventory" in message


def test_a_broken_host_vars_file_is_reported_where_it_breaks(tmp_path):
    write(tmp_path / "inv", "hosts.ini", "[nodes]\na\n")
    write(tmp_path / "inv", "host_vars/a.yml", "slots: [1\n")
    message = bad_input(tmp_path / "inv")
    assert message.startswith(f"{tmp_path / 'inv' / 'host_vars' / 'a.yml'}:2:1: Ansible cannot read it: YAML parsing failed")


def test_parse_error_is_explained_when_ansible_cfg_makes_it_fatal(tmp_path):
    # inventory_any_unparsed_is_failed makes Ansible raise instead of warn; config is read at
    # import, so this runs in a fresh process.
    inventory = write(tmp_path, "hosts.ini", "[nodes]\na\nb slots\n")
    proc = run_pycli("inventory", "show", str(inventory), env={"ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "true"}, timeout=60)
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr == f"pycli: error: {inventory}:3: Ansible cannot read this inventory (ini plugin): Expected key=value host variable assignment, got: slots\n"


def test_all_problems_reported_together_each_line_standing_alone(tmp_path):
    inventory = write(tmp_path, "hosts.ini", """
        [nodes]
        a slots=0
        b ansible_port=0
        c_c
        d ansible_host=10.0.0.9
        e ansible_host=10.0.0.9
        [launcher]
        zz
    """)
    lines = bad_input(inventory).splitlines()
    assert len(lines) == 5
    assert all(line.startswith(f"{inventory}: ") for line in lines)
    assert [any(word in line for line in lines) for word in ("'a'", "'b'", "'c_c'", "'d' and 'e'", "'zz'")] == [True] * 5


def test_ansible_warnings_stay_quiet(tmp_path, capfd):
    # A dash in a group name makes Ansible warn about invalid characters; pycli shows none of it.
    load_cluster(write(tmp_path, "hosts.ini", "[nodes:children]\ngpu-a\n[gpu-a]\nx\n"))
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


# ------------------------------------------------------------------ pure helpers


@pytest.mark.parametrize(
    "value, expected",
    [(1, 1), (8, 8), ("4", 4), (" 2 ", 2), (0, None), (-1, None), (True, None), ("x", None), (2.0, None), ("", None), ("٣", None), (None, None)],
)
def test_positive_int(value, expected):
    assert positive_int(value) == expected


@pytest.mark.parametrize(
    "address, valid",
    [
        ("node1", True), ("gpu-01.rack.example.com", True), ("10.0.0.1", True), ("fe80::1", True), ("A1", True),
        ("gpu_1", False), ("-gpu", False), ("gpu-", False), ("a..b", False), ("", False), ("x" * 64, False),
        ("a b", False), ("node1.", False),
    ],
)
def test_address_problem(address, valid):
    assert (address_problem(address) is None) == valid


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a", [HostEntry("a")]),
        ("a,b, c", [HostEntry("a"), HostEntry("b"), HostEntry("c")]),
        ("bob@a:8", [HostEntry("a", user="bob", slots=8)]),  # host:N is slots, as horovodrun -H
        ("a:4,root@b", [HostEntry("a", slots=4), HostEntry("b", user="root")]),
        ("[fe80::1]:2,u@[::1]", [HostEntry("fe80::1", slots=2), HostEntry("::1", user="u")]),
        ("a:1024", [HostEntry("a", slots=1024)]),
        ("ml_user.2@a,Admin$@b", [HostEntry("a", user="ml_user.2"), HostEntry("b", user="Admin$")]),
    ],
)
def test_parse_host_list(text, expected):
    assert parse_host_list(text) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("a,,b", "an empty entry between commas"),
        ("a:x", "'a:x': slots must be a positive integer (host:slots, as horovodrun -H)"),
        ("a:0", "slots must be a positive integer"),
        # An SSH port typed as before release 0.3.0 is said, not taken as slots.
        ("admin@a:2222", "'admin@a:2222': 2222 slots? host:N is the host's slots (as horovodrun -H); its SSH port "
                         "is --port (host:PORT until release 0.3.0)"),
        ("a b", "'a b' is not [user@]host[:slots]"),
        ("@a", "is not [user@]host[:slots]"),
        ("-oProxyCommand=x@a", "'-oProxyCommand=x' is not a login name"),
        ("a$(reboot)@b", "is not a login name"),
    ],
)
def test_parse_host_list_errors(text, fragment):
    with pytest.raises(BadInput, match="^--hosts ") as caught:
        parse_host_list(text)
    assert fragment in str(caught.value)


def test_ssh_options_and_settings_come_from_the_inventory(tmp_path):
    from pycli.cluster.model import load_cluster

    path = tmp_path / "c.ini"
    path.write_text(
        "[nodes]\nn1 ansible_host=10.0.0.1\nn2 ansible_host=10.0.0.2 ansible_ssh_extra_args='-J bastion'\n"
        "[nodes:vars]\nansible_ssh_private_key_file=/keys/id\n"
        "ansible_ssh_common_args='-o UserKnownHostsFile=/keys/known_hosts'\npycli_network_interface=eth1\n"
    )
    cluster = load_cluster(path)
    n1, n2 = cluster.hosts
    assert n1.ssh_options == ("-i", "/keys/id", "-o", "UserKnownHostsFile=/keys/known_hosts")
    assert n2.ssh_options[-2:] == ("-J", "bastion")
    assert cluster.settings == {"pycli_network_interface": "eth1"}


@pytest.mark.parametrize(
    "name, valid",
    [
        ("eth0", True), ("enp0s31f6", True), ("ib0.8001", True), ("bond0", True), ("br-1a2b3c4d5e6f", True),
        ("docker_gwbridge", True), ("", False), ("-eth0", False), (".", False), ("..", False), ("eth0/1", False),
        ("eth 0", False), ("eth0:1", False), ("eth0$(id)", False), ("x" * 16, False), ("eth0,eth1", False),
    ],
)
def test_interface_problem(name, valid):
    assert (interface_problem(name) is None) == valid


@pytest.mark.parametrize(
    "name, valid",
    [
        ("root", True), ("ml", True), ("_svc", True), ("ci-runner.2", True), ("machine$", True), ("Admin", True),
        ("", False), ("-oProxyCommand=x", False), ("2fast", False), ("a b", False), ("a@b", False),
        ("a;b", False), ("a$b", False), ("u" * 33, False),
    ],
)
def test_login_name_problem(name, valid):
    assert (login_name_problem(name) is None) == valid
