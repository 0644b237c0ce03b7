"""`pycli inventory new|show` and `pycli hostfile` through the real CLI entry point."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from pycli.cli.app import main
from pycli.cli.inventory import ClusterSettings, new_inventory_text
from pycli.cluster.inventory_writer import HostEntry
from pycli.cluster.model import Cluster, Host, load_cluster
from pycli.core.errors import EXIT_BAD_INPUT
from tests.conftest import run_pycli


def pycli(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def ok(capsys, *args: str) -> str:
    code, out, err = pycli(capsys, *args)
    assert (code, err) == (0, ""), err
    return out


# ------------------------------------------------------------------ inventory new


def test_new_from_hosts_writes_a_commented_inventory_ansible_reads(capsys, tmp_path):
    output = tmp_path / "cluster.ini"
    out = ok(capsys, "inventory", "new", "-o", output, "--hosts", "gpu1,admin@gpu2:8,gpu3", "--slots", "4", "--user", "train", "--launcher-host", "gpu3")
    assert f"wrote {output} (3 hosts)" in out
    text = output.read_text()
    assert text.startswith("# Cluster inventory written by 'pycli inventory new' from --hosts gpu1,admin@gpu2:8,gpu3.")
    assert "[nodes]\ngpu1\ngpu2 ansible_user=admin slots=8\ngpu3\n" in text
    assert "[launcher]\ngpu3\n" in text
    assert "[nodes:vars]" in text and "\nslots=4\n" in text and "\nansible_user=train\n" in text
    assert load_cluster(output) == Cluster(
        hosts=(Host("gpu1", "gpu1", 22, "train", 4), Host("gpu2", "gpu2", 22, "admin", 8), Host("gpu3", "gpu3", 22, "train", 4)),
        launcher="gpu3",
    )


def test_new_with_slurm_makes_the_launcher_slurms_controller(capsys, tmp_path):
    output = tmp_path / "cluster.ini"
    ok(capsys, "inventory", "new", "-o", output, "--hosts", "gpu1,gpu2", "--launcher-host", "gpu2", "--slurm")
    assert "\n[slurm_controller]\ngpu2\n" in output.read_text()
    assert load_cluster(output).slurm_controller == "gpu2"
    plain = tmp_path / "plain.ini"
    ok(capsys, "inventory", "new", "-o", plain, "--hosts", "gpu1,gpu2", "--slurm")
    assert load_cluster(plain).slurm_controller == "gpu1"
    without = tmp_path / "without.ini"
    ok(capsys, "inventory", "new", "-o", without, "--hosts", "gpu1,gpu2")
    assert "slurm" not in without.read_text() and not load_cluster(without).has_slurm


def test_new_with_monitoring_makes_the_launcher_the_monitoring_host(capsys, tmp_path):
    output = tmp_path / "cluster.ini"
    ok(capsys, "inventory", "new", "-o", output, "--hosts", "gpu1,gpu2", "--launcher-host", "gpu2", "--monitoring", "--slurm")
    text = output.read_text()
    assert "\n[slurm_controller]\ngpu2\n" in text and "\n[monitoring]\ngpu2\n" in text
    assert (load_cluster(output).monitoring_host, load_cluster(output).slurm_controller) == ("gpu2", "gpu2")
    plain = tmp_path / "plain.ini"
    ok(capsys, "inventory", "new", "-o", plain, "--hosts", "gpu1,gpu2")
    assert "monitoring" not in plain.read_text() and load_cluster(plain).monitoring_host is None


def test_the_package_cache_is_on_when_asked_and_by_default_from_eight_hosts(capsys, tmp_path):
    def cache_group(name, *argv):
        output = tmp_path / f"{name}.ini"
        ok(capsys, "inventory", "new", "-o", output, *argv)
        text = output.read_text()
        return text.split("\n[package_cache]\n", 1)[1].split("\n", 1)[0] if "[package_cache]" in text else None

    def hosts(count):
        return ",".join(f"n{i}" for i in range(count))

    assert cache_group("seven", "--hosts", hosts(7)) is None
    assert cache_group("eight", "--hosts", hosts(8)) == "n0"
    assert cache_group("many-without", "--hosts", hosts(64), "--no-package-cache") is None
    assert cache_group("with", "--hosts", "a,b,c,d", "--launcher-host", "b", "--package-cache") == "b"


def test_a_second_package_cache_host_is_one_line(capsys, tmp_path):
    output = tmp_path / "two-caches.ini"
    output.write_text("[nodes]\na\nb\n\n[package_cache]\na\nstore\n")
    code, out, err = pycli(capsys, "inventory", "show", output)
    assert (code, out) == (EXIT_BAD_INPUT, "") and err.count("\n") == 1, err
    assert "group 'package_cache' names 2 hosts (a, store); name exactly one" in err


def test_new_with_port_and_key(capsys, tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text("not a real key\n")
    output = tmp_path / "c.ini"
    ok(capsys, "inventory", "new", "-o", output, "--hosts", "a,b", "--port", "2200", "--key", key)
    text = output.read_text()
    assert "\nansible_port=2200\n" in text and f"\nansible_ssh_private_key_file={key}\n" in text
    assert [h.port for h in load_cluster(output).hosts] == [2200, 2200]


@pytest.mark.parametrize(
    "source_args, expected",
    [
        (["--hosts-file", "worker.host"], [("job-worker-0.job", 1), ("job-worker-1.job", 1)]),
        (["--hosts-file", "mpi.hostfile"], [("node1", 8), ("node2", 2)]),
        (["--horovod-hosts", "a:4,b:2"], [("a", 4), ("b", 2)]),
        (["--hosts", "x,y", "--slots", "3"], [("x", 3), ("y", 3)]),
        (["--hosts-file", "mpi.hostfile", "--slots", "5"], [("node1", 8), ("node2", 2)]),  # a host's own slots win
    ],
)
def test_new_from_each_source(capsys, tmp_path, monkeypatch, source_args, expected):
    monkeypatch.chdir(tmp_path)
    Path("worker.host").write_text("job-worker-0.job\njob-worker-1.job\n")
    Path("mpi.hostfile").write_text("# two nodes\nnode1 slots=8\nnode2 slots=2 max_slots=4\n")
    ok(capsys, "inventory", "new", "-o", "out.ini", *source_args)
    assert [(h.name, h.slots) for h in load_cluster("out.ini").hosts] == expected


def test_new_from_stdin(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("h1\nh2 slots=2\n"))
    ok(capsys, "inventory", "new", "-o", tmp_path / "s.ini", "--hosts-file", "-")
    assert [(h.name, h.slots) for h in load_cluster(tmp_path / "s.ini").hosts] == [("h1", 1), ("h2", 2)]


def test_new_refuses_to_overwrite_without_force(capsys, tmp_path):
    output = tmp_path / "c.ini"
    output.write_text("mine\n")
    code, out, err = pycli(capsys, "inventory", "new", "-o", output, "--hosts", "a")
    assert code == EXIT_BAD_INPUT and "already exists; pass --force to replace it" in err
    assert output.read_text() == "mine\n"
    ok(capsys, "inventory", "new", "-o", output, "--hosts", "a", "--force")
    assert "[nodes]\na\n" in output.read_text()


def test_new_inventory_text_checks_before_rendering():
    with pytest.raises(Exception, match="launcher 'c' is not in group 'nodes'"):
        new_inventory_text([HostEntry("a"), HostEntry("b")], ClusterSettings(launcher="c"), made_from="test")


# ------------------------------------------------------------------ inventory show


@pytest.fixture
def inventory(tmp_path) -> Path:
    path = tmp_path / "hosts.ini"
    path.write_text("[nodes]\ngpu1 ansible_host=10.0.0.1 slots=4\ngpu2 ansible_host=10.0.0.2 ansible_user=ops\n[nodes:vars]\nslots=2\n[launcher]\ngpu2\n")
    return path


def test_show_table(capsys, inventory):
    lines = ok(capsys, "inventory", "show", inventory).splitlines()
    assert lines[0].split() == ["HOST", "ADDRESS", "USER", "PORT", "SLOTS", "LAUNCHER"]
    assert lines[1].split()[:2] == ["gpu1", "10.0.0.1"] and "(current user)" in lines[1]
    assert lines[2].split() == ["gpu2", "10.0.0.2", "ops", "22", "2", "yes"]
    assert lines[3] == "2 hosts, 6 slots in total, launcher gpu2"


def test_show_json(capsys, inventory):
    shown = json.loads(ok(capsys, "inventory", "show", "--json", inventory))
    assert shown["launcher"] == "gpu2" and shown["total_slots"] == 6
    assert shown["hosts"][1] == {
        "name": "gpu2", "address": "10.0.0.2", "user": "ops", "user_is_default": False, "port": 22, "local": False,
        "slots": 2, "launcher": True,
        "drained": None,
    }
    assert shown["hosts"][0]["user_is_default"] is True


# ------------------------------------------------------------------ hostfile


@pytest.mark.parametrize(
    "args, expected",
    [
        ([], "10.0.0.1 slots=4\n10.0.0.2 slots=2\n"),
        (["--format", "mpi", "--np", "5"], "10.0.0.1 slots=4\n10.0.0.2 slots=1\n"),
        (["--format", "horovod"], "10.0.0.1:4,10.0.0.2:2\n"),
        (["--format", "horovod", "--np", "3"], "10.0.0.1:3\n"),
        (["--format", "deepspeed", "--np", "6"], "10.0.0.1 slots=4\n10.0.0.2 slots=2\n"),
    ],
)
def test_hostfile_prints(capsys, inventory, args, expected):
    assert ok(capsys, "hostfile", inventory, *args) == expected


def test_hostfile_writes_output(capsys, inventory, tmp_path):
    target = tmp_path / "out" / "hostfile"
    out = ok(capsys, "hostfile", inventory, "--np", "2", "-o", target)
    assert target.read_text() == "10.0.0.1 slots=2\n" and "1 hosts, 2 processes" in out


@pytest.mark.parametrize("format_name", ["mpi", "horovod", "deepspeed"])
def test_round_trip_hosts_inventory_hostfile_inventory(capsys, tmp_path, format_name):
    first, second, hostfile = tmp_path / "first.ini", tmp_path / "second.ini", tmp_path / "hosts.txt"
    ok(capsys, "inventory", "new", "-o", first, "--hosts", "n1,n2,10.1.2.3", "--slots", "4")
    ok(capsys, "hostfile", first, "--format", format_name, "-o", hostfile)
    source = ["--horovod-hosts", hostfile.read_text().strip()] if format_name == "horovod" else ["--hosts-file", hostfile]
    ok(capsys, "inventory", "new", "-o", second, *source)
    assert load_cluster(second) == load_cluster(first)


# ------------------------------------------------------------------ every bad input: exit 2, one clear line each


def test_binary_stdin_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"h1\n\xff\xfe\n"), encoding="utf-8"))
    code, out, err = pycli(capsys, "inventory", "new", "-o", tmp_path / "s.ini", "--hosts-file", "-")
    assert (code, out) == (EXIT_BAD_INPUT, "")
    assert err == "pycli: error: --hosts-file -: not UTF-8 text (byte 0xff at offset 3)\n"


NEW = ["inventory", "new", "-o", "{tmp}/new.ini"]
# id -> (arguments, with {tmp} for the test's folder, which error_files fills; what stderr says)
CLI_ERRORS: dict[str, tuple[list[str], str]] = {
    "show: missing file": (["inventory", "show", "{tmp}/missing.ini"], "no such inventory"),
    "show: parse error": (["inventory", "show", "{tmp}/broken.ini"], "{tmp}/broken.ini:2: Ansible cannot read this inventory (ini plugin)"),
    "show: empty nodes": (["inventory", "show", "{tmp}/empty.ini"], "group 'nodes' has no hosts"),
    "hostfile: unknown format": (["hostfile", "{tmp}/good.ini", "--format", "slurm"], "unknown --format 'slurm'; use one of mpi, horovod, deepspeed"),
    "hostfile: np too big": (["hostfile", "{tmp}/good.ini", "--np", "5"], "--np 5 is more than the 4 slots"),
    "hostfile: np zero": (["hostfile", "{tmp}/good.ini", "--np", "0"], "--np 0: the number of processes must be at least 1"),
    "hostfile: np not a number": (["hostfile", "{tmp}/good.ini", "--np", "x"], "Invalid value for '--np'"),
    "new: no source": (NEW, "give exactly one of --hosts, --hosts-file, --horovod-hosts or --local (got none)"),
    "new: local and hosts": ([*NEW, "--local", "--hosts", "a", "--port", "2222"],
                             "--local writes this machine alone, reached without SSH; leave out --hosts, --port"),
    "new: relative venv": ([*NEW, "--hosts", "a", "--venv", "venvs/torch"], "--venv venvs/torch: give an absolute path on the hosts"),
    "new: bad work dir": ([*NEW, "--local", "--work-dir", "/srv/my jobs"], "--work-dir /srv/my jobs: only letters, digits"),
    "new: two sources": ([*NEW, "--hosts", "a", "--horovod-hosts", "a:1"], "(got 2: --hosts, --horovod-hosts)"),
    "new: no output": (["inventory", "new", "--hosts", "a"], "Missing option '--output'"),
    "new: exists": (["inventory", "new", "-o", "{tmp}/existing.ini", "--hosts", "a"], "already exists; pass --force"),
    "new: duplicate host": ([*NEW, "--hosts", "a,b,a"], "host 'a' is listed twice"),
    "new: a host twice with slots": ([*NEW, "--hosts", "a:2,a:4"], "host 'a' is listed twice"),
    "new: bad name": ([*NEW, "--hosts", "gpu_1"], "'gpu_1' is not a valid host name"),
    "new: an old host:PORT": ([*NEW, "--hosts", "a:2222"], "2222 slots? host:N is the host's slots (as horovodrun -H); "
                              "its SSH port is --port"),
    "new: bad port": ([*NEW, "--hosts", "a", "--port", "99999"], "Invalid value for '--port'"),
    "new: launcher not a node": ([*NEW, "--hosts", "a,b", "--launcher-host", "c"], "launcher 'c' is not in group 'nodes'"),
    "new: slots zero": ([*NEW, "--hosts", "a", "--slots", "0"], "Invalid value for '--slots'"),
    "new: missing key": ([*NEW, "--hosts", "a", "--key", "{tmp}/nokey"], "no such file"),
    "new: missing hosts file": ([*NEW, "--hosts-file", "{tmp}/nofile"], "cannot read it"),
    "new: binary hosts file": ([*NEW, "--hosts-file", "{tmp}/binary.hostfile"], "{tmp}/binary.hostfile: not UTF-8 text (byte 0xff at offset 3)"),
    "new: bad hostfile line": ([*NEW, "--hosts-file", "{tmp}/bad.hostfile"], "{tmp}/bad.hostfile:1: host 'a': slots must be a positive integer"),
    "new: bad -H": ([*NEW, "--horovod-hosts", "a:x"], "-H 'a:x': host 'a': slots must be a positive integer"),
}


@pytest.fixture
def error_case(request, tmp_path) -> tuple[list[str], str]:
    for name, text in {
        "good.ini": "[nodes]\na slots=2\nb slots=2\n",
        "broken.ini": "[nodes]\na = b\n",
        "empty.ini": "[nodes]\n",
        "existing.ini": "x\n",
        "bad.hostfile": "a slots=0\n",
        "binary.hostfile": b"a\nb\xff\n",
    }.items():
        (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    args, fragment = CLI_ERRORS[request.param]
    return [arg.format(tmp=tmp_path) for arg in args], fragment.format(tmp=tmp_path)


@pytest.mark.parametrize("error_case", CLI_ERRORS, indirect=True)
def test_each_bad_input_exits_2_with_a_clear_message(capsys, tmp_path, error_case):
    args, fragment = error_case
    code, out, err = pycli(capsys, *args)
    assert code == EXIT_BAD_INPUT
    assert out == ""
    assert err.startswith("pycli: error: ") and fragment in err
    assert "Traceback" not in err
    assert not (tmp_path / "new.ini").exists()


@pytest.mark.parametrize("error_case", ["show: parse error", "hostfile: unknown format", "new: duplicate host"], indirect=True)
def test_a_real_process_shows_no_traceback(error_case):
    args, fragment = error_case
    proc = run_pycli(*args, timeout=60)
    assert proc.returncode == EXIT_BAD_INPUT
    assert fragment in proc.stderr and "Traceback" not in proc.stderr and "[WARNING]" not in proc.stderr
