"""The slurm role's slurm.conf, gres.conf and node gate wrappers, rendered by Ansible's own templating from recorded facts."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import PLUGINS, ROOT, ansible_plugins

ROLE = ROOT / "roles" / "slurm"


def _facts(hostname: str, address: str, cpus: int = 64, memory_mb: int = 515_000) -> dict:
    return {"ansible_facts": {"hostname": hostname, "default_ipv4": {"address": address},
                              "memtotal_mb": memory_mb, "processor_vcpus": cpus}}


def _trusted(value):
    """A value from the role's own files, trusted as templates all the way down, as Ansible trusts them."""
    from ansible.template import trust_as_template

    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trusted(item) for item in value]
    if isinstance(value, dict):
        return {key: _trusted(item) for key, item in value.items()}
    return value


def _render(template: str, host: str, hostvars: dict, **overrides) -> str:
    """The template as the role's template task writes it on `host` (trim_blocks, like the template module)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    def trusted(values: dict) -> dict:
        return {k: _trusted(v) for k, v in values.items()}

    ansible_plugins()  # the roles' filters, pycli.cluster.NAME
    variables = {
        # Role pycli_node runs inside this one (its node gate): its defaults are the play's too.
        **trusted(yaml.safe_load((ROLE.parent / "pycli_node" / "defaults" / "main.yml").read_text())),
        # Its dependencies' defaults: the group names and the controller's folders.
        **trusted(yaml.safe_load((ROLE.parent / "cluster_groups" / "defaults" / "main.yml").read_text())),
        **trusted(yaml.safe_load((ROLE.parent / "controller_folders" / "defaults" / "main.yml").read_text())),
        **trusted(yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())),
        **trusted(yaml.safe_load((ROLE / "vars" / "main.yml").read_text())),
        "slurm_cluster_name": "Lab-A",
        "groups": {"nodes": list(hostvars), "slurm_controller": [next(iter(hostvars))]},
        # The play's hosts in another order than the group's: the file must keep the group's.
        "ansible_play_hosts": list(reversed(hostvars)),
        "hostvars": hostvars,
        "ansible_managed": "Ansible managed",
        "inventory_hostname": host,
        **hostvars[host],
        **overrides,
    }
    templar = Templar(loader=DataLoader(), variables=variables).copy_with_new_env(trim_blocks=True)
    return templar.template(trust_as_template((ROLE / "templates" / template).read_text()))


def _gpu_cluster(gpus: int = 8, nvml: bool = False) -> dict:
    return {
        name: {**_facts(name, f"10.0.0.{i}"), "_slurm_gpus": str(gpus), "_slurm_cpus": "64", "_slurm_nvml": nvml}
        for i, name in enumerate(["gpu1", "gpu2"], start=1)
    }


def test_slurm_conf_has_one_line_per_node_with_its_gpus_cpus_and_memory_less_the_reserve():
    conf = _render("slurm.conf.j2", "gpu2", _gpu_cluster()).splitlines()
    assert [line for line in conf if line.startswith("NodeName=")] == [
        "NodeName=gpu1 NodeHostname=gpu1 NodeAddr=10.0.0.1 CPUs=64 RealMemory=513976 Gres=gpu:8 State=UNKNOWN",
        "NodeName=gpu2 NodeHostname=gpu2 NodeAddr=10.0.0.2 CPUs=64 RealMemory=513976 Gres=gpu:8 State=UNKNOWN",
    ]
    assert "SlurmctldHost=gpu1(10.0.0.1)" in conf
    assert "ClusterName=lab_a" in conf
    assert "PartitionName=batch Nodes=gpu1,gpu2 Default=YES MaxTime=INFINITE State=UP" in conf
    assert {"ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup,task/affinity", "GresTypes=gpu",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core_Memory", "ReturnToService=2",
            "AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageTRES=gres/gpu"} <= set(conf)
    assert not any(line.startswith("SlurmdParameters=") for line in conf)


def test_every_node_gets_the_same_slurm_conf():
    cluster = _gpu_cluster()
    assert _render("slurm.conf.j2", "gpu1", cluster) == _render("slurm.conf.j2", "gpu2", cluster)


def test_a_node_this_run_did_not_reach_keeps_its_line_and_its_place_in_the_partition():
    """gpu2 is down (or outside --limit): dropping its line would restart slurmctld without it."""
    cluster = _gpu_cluster()
    cluster["gpu3"] = {}  # never reached, not in the file: left out until a run reaches it
    before = {"gpu2": "NodeName=gpu2 NodeHostname=gpu2 NodeAddr=10.0.0.2 CPUs=32 RealMemory=1000 State=UNKNOWN",
              "gone": "NodeName=gone NodeHostname=gone NodeAddr=10.0.0.9 CPUs=2 RealMemory=1000 State=UNKNOWN"}
    conf = _render("slurm.conf.j2", "gpu1", cluster, ansible_play_hosts=["gpu1"], __slurm_lines_before=before).splitlines()
    assert [line for line in conf if line.startswith("NodeName=")] == [
        "NodeName=gpu1 NodeHostname=gpu1 NodeAddr=10.0.0.1 CPUs=64 RealMemory=513976 Gres=gpu:8 State=UNKNOWN",
        before["gpu2"],
    ]
    assert "PartitionName=batch Nodes=gpu1,gpu2 Default=YES MaxTime=INFINITE State=UP" in conf


def test_a_backup_controller_is_the_second_slurmctld_host_sharing_the_state_folder_with_the_inventorys_timeout():
    cluster = _gpu_cluster()
    groups = {"nodes": ["gpu1", "gpu2"], "slurm_controller": ["gpu1", "gpu2"]}
    conf = _render("slurm.conf.j2", "gpu1", cluster, groups=groups, slurm_state_save_location="/shared/slurm",
                   slurm_ctld_timeout=15).splitlines()
    assert [line for line in conf if line.startswith("SlurmctldHost=")] == ["SlurmctldHost=gpu1(10.0.0.1)",
                                                                            "SlurmctldHost=gpu2(10.0.0.2)"]
    assert "StateSaveLocation=/shared/slurm" in conf and "SlurmctldTimeout=15" in conf
    # Accounting stays with the primary's slurmdbd.
    assert "AccountingStorageHost=10.0.0.1" in conf
    # One controller: no timeout line, the state where Debian's package keeps it.
    single = _render("slurm.conf.j2", "gpu1", cluster).splitlines()
    assert [line for line in single if line.startswith("SlurmctldHost=")] == ["SlurmctldHost=gpu1(10.0.0.1)"]
    assert "StateSaveLocation=/var/lib/slurm/slurmctld" in single and not any(
        line.startswith("SlurmctldTimeout=") for line in single)


def test_a_backup_controller_this_run_did_not_reach_keeps_its_line():
    cluster = _gpu_cluster()
    groups = {"nodes": ["gpu1", "gpu2"], "slurm_controller": ["gpu1", "gpu2"]}
    before = ["SlurmctldHost=gpu1(10.0.0.1)", "SlurmctldHost=gpu2-old(10.0.0.22)"]
    conf = _render("slurm.conf.j2", "gpu1", cluster, groups=groups, ansible_play_hosts=["gpu1"],
                   __slurm_ctld_lines_before=before, __slurm_lines_before={}).splitlines()
    assert [line for line in conf if line.startswith("SlurmctldHost=")] == before


def test_the_node_lines_of_a_slurm_conf_are_read_back_by_node():
    import importlib.util

    spec = importlib.util.spec_from_file_location("slurm_nodes", PLUGINS / "filter" / "slurm_nodes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    conf = _render("slurm.conf.j2", "gpu1", _gpu_cluster())
    lines = module.slurm_node_lines(conf + "NodeName=DEFAULT CPUs=2\nNodeName=a[1-4] CPUs=2\n#NodeName=x y\n")
    written = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert lines == {"gpu1": written[0], "gpu2": written[1]}


def test_the_test_bed_runs_without_cgroup_plugins_and_with_its_own_cpu_count():
    cluster = {name: {**_facts(name, f"172.28.0.{i}", cpus=2), "_slurm_gpus": "0", "_slurm_cpus": "4", "_slurm_nvml": False}
               for i, name in enumerate(["node1", "node2"], start=11)}
    conf = _render("slurm.conf.j2", "node1", cluster, slurm_cgroup=False, slurm_slurmd_parameters=["config_overrides"])
    lines = conf.splitlines()
    assert {"ProctrackType=proctrack/linuxproc", "TaskPlugin=task/affinity", "JobAcctGatherType=jobacct_gather/linux",
            "SlurmdParameters=config_overrides"} <= set(lines)
    assert "NodeName=node1 NodeHostname=node1 NodeAddr=172.28.0.11 CPUs=4 RealMemory=513976 State=UNKNOWN" in lines
    assert "Gres=" not in conf
    assert "# node1 has no NVIDIA GPU." in _render("gres.conf.j2", "node1", cluster)


def test_cgroup_conf_confines_cores_memory_and_devices_and_takes_settings_over_them():
    cluster = _gpu_cluster()
    assert _render("cgroup.conf.j2", "gpu1", cluster).splitlines()[2:] == [
        "ConstrainCores=yes", "ConstrainDevices=yes", "ConstrainRAMSpace=yes"]
    # The test bed's: the node's own tree, and no core confinement (its slots share the machine's cores).
    bed = _render("cgroup.conf.j2", "gpu1", cluster, slurm_cgroup_config={
        "CgroupPlugin": "cgroup/v1", "CgroupMountpoint": "/run/pycli-cgroup", "ConstrainCores": "no"}).splitlines()[2:]
    assert bed == ["CgroupMountpoint=/run/pycli-cgroup", "CgroupPlugin=cgroup/v1", "ConstrainCores=no",
                   "ConstrainDevices=yes", "ConstrainRAMSpace=yes"]


@pytest.mark.parametrize(("gpus", "nvml", "line"), [
    (8, False, "Name=gpu File=/dev/nvidia[0-7]"),
    (1, False, "Name=gpu File=/dev/nvidia0"),
    (4, True, "AutoDetect=nvml"),
])
def test_gres_conf_names_the_device_files_unless_slurm_has_its_nvml_plugin(gpus, nvml, line):
    gres = _render("gres.conf.j2", "gpu1", _gpu_cluster(gpus, nvml)).splitlines()
    assert gres[-1] == line


def _gate(item: str, **overrides) -> str:
    """A wrapper of the node gate; its job mapping folder is role pycli_node's (its defaults are the play's)."""
    ansible_plugins()
    cluster = _gpu_cluster()
    cluster["gpu1"]["ansible_facts"]["python"] = {"executable": "/usr/bin/python3"}
    return _render("node-gate.sh.j2", "gpu1", cluster, item=item, role_path=str(ROLE), **overrides)


@pytest.mark.parametrize("item", ["prolog", "epilog"])
def test_with_monitoring_the_prolog_and_epilog_keep_dcgm_exporters_job_mapping(item):
    groups = {"nodes": ["gpu1", "gpu2"], "slurm_controller": ["gpu1"], "monitoring": ["gpu1"]}
    node_defaults = yaml.safe_load((ROLE.parent / "pycli_node" / "defaults" / "main.yml").read_text())
    [command] = [line for line in _gate(item, groups=groups).splitlines() if line.startswith("exec ")]
    probe = f" --probe-timeout {_defaults()['slurm_prolog_timeout']}" if item == "prolog" else ""
    assert command.endswith(f"-m pycli_node.node_gate {item}{probe} --node gpu1 --job-mapping-dir "
                            f"{node_defaults['pycli_node_dcgm_job_mapping_dir']}")
    # The inventory's value wins, as it does for the exporter.
    [command] = [line for line in _gate(item, groups=groups, pycli_node_dcgm_job_mapping_dir="/run/jobs").splitlines()
                 if line.startswith("exec ")]
    assert command.endswith("--job-mapping-dir /run/jobs")


@pytest.mark.parametrize("item", ["prolog", "epilog"])
def test_without_monitoring_the_prolog_and_epilog_write_no_job_mapping(item):
    assert "--job-mapping-dir" not in _gate(item)


def _defaults() -> dict:
    return yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())


@pytest.mark.parametrize("timeout", [None, 7])
def test_the_gpu_probe_gets_slurm_prolog_timeout_and_the_prolog_is_killed_after_it_and_before_slurm_gives_up(timeout):
    """slurm_prolog_timeout (the role's default, or the inventory's) is the one number: the gate's
    probe gets it in the health check and the prolog, the prolog is killed some seconds later, and
    slurm.conf's PrologEpilogTimeout is later still."""
    overrides = {} if timeout is None else {"slurm_prolog_timeout": timeout}
    seconds = int(_defaults()["slurm_prolog_timeout"] if timeout is None else timeout)
    for item in ("health", "prolog"):
        [command] = [line for line in _gate(item, **overrides).splitlines() if line.startswith("exec ")]
        assert f" {item} --probe-timeout {seconds} --node gpu1" in command
    [command] = [line for line in _gate("prolog", **overrides).splitlines() if line.startswith("exec ")]
    killed = int(command.split("timeout -k 5 ", 1)[1].split()[0]) + 5
    conf = _render("slurm.conf.j2", "gpu2", _gpu_cluster(), **overrides).splitlines()
    [slurms] = [int(line.split("=", 1)[1]) for line in conf if line.startswith("PrologEpilogTimeout=")]
    assert seconds + 15 < killed < slurms


def test_partitions_come_from_inventory_groups_with_their_own_limits_and_settings():
    cluster = {**_gpu_cluster(), "cpu1": {**_facts("cpu1", "10.0.0.3"), "_slurm_gpus": "0", "_slurm_cpus": "64",
                                          "_slurm_nvml": False}}
    groups = {"nodes": list(cluster), "slurm_controller": ["gpu1"], "gpu_nodes": ["gpu2", "gpu1", "elsewhere"],
              "cpu_nodes": ["cpu1"]}
    partitions = [{"name": "gpu", "group": "gpu_nodes", "default": True, "max_time": "2-00:00:00"},
                  {"name": "cpu", "group": "cpu_nodes", "settings": {"AllowQos": "normal", "AllowAccounts": "ALL"}},
                  {"name": "all"}]
    conf = _render("slurm.conf.j2", "gpu1", cluster, groups=groups, slurm_partitions=partitions).splitlines()
    # A group's nodes in the cluster's order, and only those of the cluster.
    assert [line for line in conf if line.startswith("PartitionName=")] == [
        "PartitionName=gpu Nodes=gpu1,gpu2 Default=YES MaxTime=2-00:00:00 State=UP",
        "PartitionName=cpu Nodes=cpu1 Default=NO MaxTime=INFINITE State=UP AllowAccounts=ALL AllowQos=normal",
        "PartitionName=all Nodes=gpu1,gpu2,cpu1 Default=NO MaxTime=INFINITE State=UP",
    ]


def _preflight_check(name_start: str) -> dict:
    tasks = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
    [task] = [task for task in tasks if task["name"].startswith(name_start)]
    return task


@pytest.mark.parametrize(("partitions", "passes"), [
    ([{"name": "gpu", "group": "gpu_nodes", "default": True}, {"name": "cpu", "group": "nodes"}], True),
    ([{"name": "gpu", "default": True}, {"name": "cpu", "default": "yes"}], False),  # two defaults
    ([{"name": "gpu"}, {"name": "gpu"}], False),
    ([{"name": "gpu part"}], False),
    ([{"group": "nodes"}], False),
    ([], False),
])
def test_the_preflight_takes_partitions_with_distinct_names_and_one_default_at_most(partitions, passes):
    task = _preflight_check("Check the partitions have names")
    rules = task["ansible.builtin.assert"]["that"]
    said = _render_expression(" and ".join(f"({rule})" for rule in rules), task["vars"], slurm_partitions=partitions)
    assert said == str(passes)


@pytest.mark.parametrize(("groups", "empty"), [
    ({"gpu_nodes": ["gpu1"]}, "[]"),
    ({"gpu_nodes": ["elsewhere"]}, "[['gpu', 'gpu_nodes', 0]]"),  # no node of the cluster
    ({}, "[['gpu', 'gpu_nodes', 0]]"),  # no such group
])
def test_the_preflight_refuses_a_partition_whose_group_holds_no_node_of_the_cluster(groups, empty):
    task = _preflight_check("Check each partition's inventory group")
    said = _render_expression("_empty", task["vars"], slurm_partitions=[{"name": "gpu", "group": "gpu_nodes"}],
                              groups={"nodes": ["gpu1", "gpu2"], "slurm_controller": ["gpu1"], **groups})
    assert said == empty


def _render_expression(expression: str, task_vars: dict, **overrides) -> str:
    """An expression of a task's, with the task's own vars, as the role evaluates it."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    groups = yaml.safe_load((ROLE.parent / "cluster_groups" / "defaults" / "main.yml").read_text())  # a dependency's
    variables = {**groups, **yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()), **task_vars, **overrides}
    variables = {k: _trusted(v) for k, v in variables.items()}
    templar = Templar(loader=DataLoader(), variables=variables)
    return str(templar.template(trust_as_template("{{ " + expression + " }}")))


@pytest.mark.parametrize(("declared", "line"), [
    ({}, None),
    ({"slurm_qos": [{"name": "gpu", "state": "absent"}]}, None),  # only removals: nothing to enforce
    ({"slurm_accounts": [{"name": "team"}]}, "AccountingStorageEnforce=associations,limits,qos"),
    ({"slurm_users": [{"name": "u", "accounts": ["team"]}], "slurm_accounting_enforce": ["associations"]},
     "AccountingStorageEnforce=associations"),
])
def test_accounting_is_enforced_where_the_inventory_declares_accounts_users_or_qos(declared, line):
    conf = _render("slurm.conf.j2", "gpu1", _gpu_cluster(), **declared).splitlines()
    assert [found for found in conf if found.startswith("AccountingStorageEnforce=")] == ([line] if line else [])


def test_the_node_gate_wrappers_quote_what_the_inventory_gives_them():
    import shlex

    paths = ["/", "/var/lib/slurm $(touch /tmp/owned)"]
    for item in ("health", "prolog", "epilog"):
        [command] = [line for line in _gate(item, slurm_health_check_paths=paths, pycli_node_dir="/opt/pycli node").splitlines()
                     if line.startswith("exec ")]
        words = shlex.split(command)
        assert "PYTHONPATH=/opt/pycli node" in words, command
        if item == "health":
            assert words[words.index("--path", words.index("--path") + 1) + 1] == paths[1], command


def test_logins_belong_to_jobs_through_an_extern_step_an_allow_list_and_a_session_stack_without_pam_systemd():
    """slurm_ssh_adopt: PrologFlags gains Contain (every job's extern step, which pam_slurm_adopt
    adopts logins into); pam_access lets the allow-list in and sends everyone else on to it; sshd's
    session stack is Debian's common-session as found, without pam_systemd."""
    import base64

    cluster = _gpu_cluster()
    flags = lambda **o: [line for line in _render("slurm.conf.j2", "gpu1", cluster, **o).splitlines()  # noqa: E731
                         if line.startswith("PrologFlags=")]
    assert flags() == ["PrologFlags=Alloc,Contain"]
    assert flags(slurm_ssh_adopt=False) == ["PrologFlags=Alloc"]
    assert flags(slurm_node_gate=False) == ["PrologFlags=Contain"]
    assert flags(slurm_node_gate=False, slurm_ssh_adopt=False) == []
    access = _render("ssh-adopt-access.conf.j2", "gpu1", cluster, ansible_user="ops",
                     slurm_ssh_allow_groups=["hpc-admins"]).splitlines()
    assert [line for line in access if not line.startswith("#")] == [
        "+:root:ALL", "+:ops:ALL", "+:(hpc-admins):ALL", "-:ALL:ALL"]
    common = ("# here are the per-package modules\nsession\t[default=1]\t\t\tpam_permit.so\nsession\trequisite\t\t\tpam_deny.so\n"
              "session\trequired\t\t\tpam_permit.so\nsession\trequired\tpam_unix.so \nsession\toptional\tpam_systemd.so \n")
    stack = _render("pycli-sshd-session.j2", "gpu1", cluster,
                    __slurm_common_session={"content": base64.b64encode(common.encode()).decode()}).splitlines()
    assert [line for line in stack if not line.startswith("#")] == [
        "session\t[default=1]\t\t\tpam_permit.so", "session\trequisite\t\t\tpam_deny.so",
        "session\trequired\t\t\tpam_permit.so", "session\trequired\tpam_unix.so "]
