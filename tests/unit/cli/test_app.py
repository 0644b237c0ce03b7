"""Bad input ends in one line on stderr and exit 2, never a traceback."""

from pathlib import Path

import pytest

from pycli.cli.app import main
from pycli.core.errors import BadInput


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cluster", "up", "--nodes", "0"], "--nodes must be between 1 and 64"),
        (["cluster", "up", "--nodes", "two"], "Invalid value for '--nodes'"),
        (["cluster", "up", "--name", "Bad_Name"], "cluster name 'Bad_Name'"),
        (["cluster", "up", "--slots", "0"], "--slots must be 1 or more processes per node, got 0"),
        (["cluster", "up", "--slots", "four"], "Invalid value for '--slots'"),
        (["cluster", "up", "--bogus"], "No such option: --bogus"),
        (["cluster", "down", "--name", "x_y"], "cluster name"),
        (["cluster", "image", "--ca-bundle", "/nonexistent.pem"], "cannot read CA bundle"),
        (["no-such-command"], "No such command"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith("pycli: error: ") and err.count("\n") == 1
    assert "Traceback" not in err


def test_version_names_the_tree_pycli_drives_and_the_machines_set_up(capsys):
    from pycli.core.tree import PROJECT_ROOT

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"pycli {__import__('pycli').__version__}", f"roles, playbooks and workloads: {PROJECT_ROOT}",
        f"this machine's set-up for a local cluster: sudo bash {PROJECT_ROOT}/scripts/host-prereqs.sh"]


INVENTORY = "[nodes]\nn1 ansible_host=10.0.0.1 slots=2\nn2 ansible_host=10.0.0.2 slots=2\n"


@pytest.mark.parametrize("command", [["inventory", "show"], ["hostfile"]])
def test_the_inventory_is_an_argument_or_dash_i(command, tmp_path, capsys):
    inventory = tmp_path / "a.ini"
    inventory.write_text(INVENTORY)
    assert main([*command, str(inventory)]) == 0
    as_argument = capsys.readouterr().out
    assert main([*command, "-i", str(inventory)]) == 0
    assert capsys.readouterr().out == as_argument
    assert main([*command, str(inventory), "--inventory", str(tmp_path / "." / "a.ini")]) == 0  # the same one twice


@pytest.mark.parametrize("command", [
    ["inventory", "show"], ["hostfile"], ["provision"], ["fetch"], ["check"], ["train", "--np", "2"], ["bench"],
])
def test_two_different_inventories_are_one_line_and_exit_2(command, tmp_path, capsys):
    first, second = tmp_path / "a.ini", tmp_path / "b.ini"
    first.write_text(INVENTORY)
    second.write_text(INVENTORY)
    assert main([*command, str(first), "-i", str(second)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"two inventories given, {first} and -i {second}" in err


EVERY_INVENTORY_COMMAND = [
    ["inventory", "show"], ["hostfile"], ["provision"], ["fetch"], ["check"], ["train", "--np", "2"], ["bench"],
    ["drain", "n1", "--reason", "r"], ["undrain", "n1"],
]


@pytest.mark.parametrize("command", EVERY_INVENTORY_COMMAND)
def test_no_inventory_and_no_local_cluster_is_one_line_and_exit_2(command, capsys, monkeypatch):
    monkeypatch.setattr("pycli.local.cluster.running_clusters", lambda: {})
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err == ("pycli: error: no inventory given and no local cluster is up: name one (first argument or "
                   "-i INVENTORY), or run 'pycli cluster up'\n")


@pytest.mark.parametrize("command", EVERY_INVENTORY_COMMAND)
def test_every_command_falls_back_to_the_one_local_cluster_up_and_says_so(command, tmp_path, capsys, monkeypatch):
    # One rule for all: the inventory of the local cluster that is up, named on stderr. The
    # inventory here names hosts that do not answer, so only the commands that touch no node run
    # to the end; every command gets as far as reading it (no "no inventory given").
    inventory = tmp_path / "local-x.ini"
    inventory.write_text(INVENTORY)
    monkeypatch.setattr("pycli.local.cluster.running_clusters", lambda: {"x": inventory})
    monkeypatch.setenv("PYCLI_STATE", str(tmp_path / "state"))
    monkeypatch.setattr("pycli.cli.provision.provision", lambda cluster, request: 0)
    monkeypatch.setattr("pycli.cli.cache.provision", lambda cluster, request: 0)
    monkeypatch.setattr("pycli.health.run.check", lambda cluster, options, as_json=False: 0)
    monkeypatch.setattr("pycli.jobs.train.run_job", lambda cluster, request: type("Outcome", (), {"code": 0})())
    monkeypatch.setattr("pycli.bench.run.bench", lambda cluster, request: 0)
    main(command)
    err = capsys.readouterr().err
    assert err.startswith(f"pycli: inventory {inventory}: the local cluster 'x', the one that is up\n")
    assert "no inventory given" not in err


def test_two_local_clusters_up_and_no_inventory_is_exit_2(capsys, monkeypatch):
    monkeypatch.setattr("pycli.local.cluster.running_clusters", lambda: {"a": Path("a.ini"), "b": Path("b.ini")})
    assert main(["provision"]) == 2
    assert capsys.readouterr().err == (
        "pycli: error: no inventory given and 2 local clusters are up (a, b): name one (first argument or -i INVENTORY)\n")


@pytest.mark.parametrize(("command", "module"), [(["provision"], "pycli.cli.provision"), (["fetch"], "pycli.cli.cache")])
def test_playbook_commands_read_the_inventory_once_as_argument_or_dash_i(command, module, tmp_path, monkeypatch):
    inventory = tmp_path / "a.ini"
    inventory.write_text(INVENTORY)
    given = []
    monkeypatch.setattr(f"{module}.provision", lambda cluster, request: given.append((cluster, request)) or 0)
    assert main([*command, str(inventory), "-l", "n1"]) == 0
    assert main([*command, "-i", str(inventory), "-l", "n1"]) == 0
    (by_argument, request), (by_option, same_request) = given
    assert by_argument == by_option and [h.name for h in by_argument.hosts] == ["n1", "n2"]
    assert by_argument.inventory_path == by_option.inventory_path == inventory
    assert request == same_request and request.limit == "n1"


def test_an_inventory_first_among_train_s_and_bench_s_arguments(tmp_path, monkeypatch):
    from pycli.cli.options import leading_inventory

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cluster.ini").write_text(INVENTORY)
    (tmp_path / "mnist").write_text("")  # a file named like a built-in workload is still the workload
    (tmp_path / "train.py").write_text("")
    assert leading_inventory(["cluster.ini", "synthetic", "--epochs", "2"]) == (Path("cluster.ini"), ["synthetic", "--epochs", "2"])
    assert leading_inventory(["mnist", "--epochs", "2"], ["mnist"]) == (None, ["mnist", "--epochs", "2"])
    assert leading_inventory(["train.py"]) == (None, ["train.py"])
    with pytest.raises(BadInput, match=r"^missing.ini: no such inventory; the first argument is an inventory"):
        leading_inventory(["missing.ini"])  # named like no workload: the inventory, whether it exists or not
    with pytest.raises(BadInput, match=r"^mnsit: no such inventory; the first argument is a workload \(mnist, ddp or"):
        leading_inventory(["mnsit", "--epochs", "2"], ["mnist", "ddp"])
    # with -i the inventory is known: a missing first word is the workload, for its own check to name
    assert leading_inventory(["mnsit"], ["mnist"], option_given=True) == (None, ["mnsit"])
    assert leading_inventory(["cluster.ini", "mnist"], ["mnist"], option_given=True) == (Path("cluster.ini"), ["mnist"])
    assert leading_inventory(["--epochs", "cluster.ini"]) == (None, ["--epochs", "cluster.ini"])
    assert leading_inventory([]) == (None, [])



@pytest.mark.parametrize(
    ("inventory", "options", "message"),
    [
        (INVENTORY, ["--network-interface", "eth0$(touch${IFS}/tmp/pwned)"],
         "--network-interface 'eth0$(touch${IFS}/tmp/pwned)' is not a network interface name"),
        ("[nodes]\nn1 ansible_host=10.0.0.1 ansible_user=-oProxyCommand=touch${IFS}/tmp/pwned\n", [],
         "host 'n1': ansible_user '-oProxyCommand=touch${IFS}/tmp/pwned' is not a login name"),
        ("[nodes]\nn1 ansible_host=10.0.0.1 pycli_network_interface='eth0;reboot'\n", [],
         "host 'n1': pycli_network_interface 'eth0;reboot' is not a network interface name"),
    ],
)
def test_values_that_would_reach_a_shell_are_one_line_and_exit_2(inventory, options, message, tmp_path, capsys):
    path = tmp_path / "a.ini"
    path.write_text(inventory)
    assert main(["train", str(path), "synthetic", "--np", "1", *options]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("pycli: error: ") and err.count("\n") == 1


def test_arguments_after_the_double_dash_are_the_workload_s_when_none_is_named(tmp_path, capsys, monkeypatch):
    # `pycli train --np 8 -- --epochs 1` runs mnist with --epochs 1; it reaches the plan's own
    # checks (here a --min-np too large), never "unknown workload '--epochs'".
    monkeypatch.setenv("PYCLI_CACHE", str(tmp_path / "cache"))
    inventory = tmp_path / "a.ini"
    inventory.write_text(INVENTORY)
    argv = ["train", "--np", "4", "-i", str(inventory), "--max-restarts", "1", "--min-np", "9", "--", "--epochs", "1"]
    assert main(argv) == 2
    assert capsys.readouterr().err == "pycli: error: --min-np 9: give a number of ranks from 1 to --np 4\n"


def test_an_unknown_workload_with_i_is_named_as_a_workload(tmp_path, capsys, monkeypatch):
    # -i names the inventory, so the first word can only be the workload: its own check speaks
    monkeypatch.setenv("PYCLI_CACHE", str(tmp_path / "cache"))
    inventory = tmp_path / "a.ini"
    inventory.write_text(INVENTORY)
    assert main(["train", "resnet50", "--np", "1", "-i", str(inventory)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pycli: error: unknown workload 'resnet50'") and err.count("\n") == 1


@pytest.mark.parametrize(("argv", "environ", "message"), [
    (["--forks", "0"], {}, "--forks must be at least 1, got 0"),
    (["-f", "-3"], {}, "--forks must be at least 1, got -3"),
    ([], {"ANSIBLE_FORKS": "0"}, "ANSIBLE_FORKS='0': expected a whole number of at least 1"),
])
def test_provision_refuses_forks_below_one_in_one_line(argv, environ, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYCLI_RUNS", str(tmp_path / "runs"))
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    inventory = tmp_path / "a.ini"
    inventory.write_text(INVENTORY)
    assert main(["provision", str(inventory), *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"pycli: error: {message}\n"
    assert not (tmp_path / "runs").exists()  # refused before any run folder


SLURM_INVENTORY = INVENTORY + "[slurm_controller]\nn1\n"


@pytest.mark.parametrize(("inventory", "argv", "message"), [
    (INVENTORY, ["train", "--np", "2", "--scheduler", "slurm"],
     "--scheduler slurm: this inventory has no Slurm; add a [slurm_controller] group naming one node"),
    (INVENTORY, ["train", "--np", "2", "--scheduler", "pbs"], "unknown --scheduler 'pbs'; use one of slurm, ssh"),
    (SLURM_INVENTORY, ["train", "--np", "2", "--scheduler", "pbs"], "unknown --scheduler 'pbs'"),
    (SLURM_INVENTORY, ["train", "--np", "2", "--docker", "img:1", "--docker-opt", "-e 'A=x\ny'"],
     "an option cannot hold a line break"),
    (SLURM_INVENTORY + "[nodes:vars]\nslurm_node_gate=false\n", ["train", "--np", "2", "--docker", "img:1"],
     "--docker through Slurm needs pycli's node gate"),
    (INVENTORY, ["jobs"], "this inventory has no Slurm"),
    (SLURM_INVENTORY, ["jobs", "--since", "now -1days"], "--since 'now -1days': give one time as sacct -S takes it"),
    (INVENTORY + "[slurm_controller]\nn9\n", ["jobs"], "slurm controller 'n9' (group 'slurm_controller') is not in group 'nodes'"),
    (INVENTORY + "[monitoring]\nn9\n", ["hostfile"], "monitoring host 'n9' (group 'monitoring') is not in group 'nodes'"),
    (INVENTORY + "[monitoring]\nn1\n[nodes:vars]\nmonitoring_alert_webhook_url=ftp://x/y\n", ["provision"],
     "monitoring_alert_webhook_url 'ftp://x/y' is not an http:// or https:// URL"),
])
def test_slurm_bad_input_is_one_line_and_exit_2(inventory, argv, message, tmp_path, capsys):
    path = tmp_path / "hosts.ini"
    path.write_text(inventory)
    assert main([*argv, "-i", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.startswith("pycli: error: ") and err.count("\n") == 1
