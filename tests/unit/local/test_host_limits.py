"""The host limits a local cluster of many nodes needs: counted from a /proc of our own making,
checked before `cluster up` starts nodes, and the node that stopped while booting explained."""

import os
import subprocess

import pytest

from pycli.local import host_limits
from pycli.local.host_limits import INSTANCES, PER_NODE, RAISED, WATCHES, check_room_for, shortfalls, why_stopped
from tests.conftest import ROOT


@pytest.fixture
def fake_proc(tmp_path, monkeypatch):
    """A /proc with two processes holding inotify instances (3 watches in all) and one without,
    and the two limits."""
    proc = tmp_path / "proc"
    for pid, fds in (("10", {"3": 2, "4": 0}), ("11", {"5": 1}), ("12", {})):
        (proc / pid / "fd").mkdir(parents=True)
        (proc / pid / "fdinfo").mkdir()
        (proc / pid / "fd" / "0").symlink_to("/dev/null")
        for fd, watches in fds.items():
            (proc / pid / "fd" / fd).symlink_to("anon_inode:inotify")
            (proc / pid / "fdinfo" / fd).write_text("pos:\t0\nflags:\t00\n" + "inotify wd:1 ino:2 sdev:3 mask:4\n" * watches)
    (proc / "sys" / "fs" / "inotify").mkdir(parents=True)
    (proc / "sys" / "fs" / "inotify" / "max_user_instances").write_text("128\n")
    (proc / "sys" / "fs" / "inotify" / "max_user_watches").write_text("8192\n")
    (proc / "self").mkdir()  # not a process: left alone
    monkeypatch.setattr(host_limits, "PROC", proc)
    return proc


def test_what_roots_processes_hold_is_counted_from_proc(fake_proc):
    assert host_limits.inotify_in_use(os.geteuid()) == {INSTANCES: 3, WATCHES: 3}
    assert host_limits.inotify_in_use(os.geteuid() + 4242) == {INSTANCES: 0, WATCHES: 0}  # another user's limits
    assert host_limits.read_limit(INSTANCES) == 128 and host_limits.read_limit(WATCHES) == 8192


def test_cluster_up_is_told_in_one_line_per_limit_what_to_raise(fake_proc):
    fits = (128 - 3) // PER_NODE[INSTANCES]
    assert check_room_for(fits) == []
    (line,) = check_room_for(fits + 1)
    assert line == (f"{fits + 1} more nodes need about {(fits + 1) * PER_NODE[INSTANCES]} inotify instances of root's, "
                    "and fs.inotify.max_user_instances is 128 with 3 in use: run `sysctl -w fs.inotify.max_user_instances=1024` "
                    f"(sudo bash {ROOT}/scripts/host-prereqs.sh sets it for good)")
    assert len(check_room_for(1000)) == 2  # both limits
    # A limit that cannot be read is no reason to refuse.
    assert shortfalls(1000, {INSTANCES: None, WATCHES: None}, {}) == []
    # A cluster bigger than the raised limits is told to go beyond them.
    (big,) = shortfalls(200, {INSTANCES: 1024, WATCHES: None}, {INSTANCES: 10})
    assert f"={10 + 200 * PER_NODE[INSTANCES]}`" in big.line(200)


def test_a_node_that_stopped_while_booting_says_its_own_last_line_or_the_limits(fake_proc):
    assert why_stopped("systemd 252 running in system mode\nFailed to allocate manager object: Too many open files\n") == \
        "Failed to allocate manager object: Too many open files"
    silent = why_stopped("")
    assert silent.startswith("it printed nothing; fs.inotify.max_user_instances is 128 with 3 in use (a node takes about")
    assert f"(sudo bash {ROOT}/scripts/host-prereqs.sh raises them)" in silent


def test_host_prereqs_reads_the_values_and_the_file_from_here():
    """The script runs the machine's python3 on this module: standard library only."""
    code = "import sys; import pycli.local.host_limits as h; print(h.sysctl_file_text(), end=''); print(sorted(sys.modules) and 'typer' in sys.modules)"
    out = subprocess.run(["python3", "-c", code], cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"]},
                         capture_output=True, text=True, check=True).stdout
    assert f"fs.inotify.max_user_instances = {RAISED[INSTANCES]}\n" in out and out.rstrip().endswith("False")
    assert "raise_inotify_limits" in (ROOT / "scripts" / "host-prereqs.sh").read_text()
