"""The one place that builds launcher command lines: what every mpirun pycli runs has in common."""

import shlex

from pycli.check import mpirun_command
from pycli.cluster_model import Host
from pycli.launch_lines import MPIRUN_ENV, MPIRUN_FLAGS, mpirun_argv, ssh_port_option

HOSTS = (Host("n1", "10.9.0.1", slots=2), Host("n2", "10.9.0.2", slots=2))


def _flag_pairs(argv):
    """The -mca/-x settings and bare flags of an mpirun line, in a comparable form."""
    found, i = set(), 0
    while i < len(argv):
        if argv[i] == "-mca":
            found.add(("-mca", argv[i + 1], argv[i + 2]))
            i += 3
        elif argv[i] in ("-x", "-bind-to", "-map-by"):
            found.add((argv[i], argv[i + 1]))
            i += 2
        else:
            i += 1
    return found


def test_every_mpirun_gets_the_same_flags():
    argv = mpirun_argv("mpirun", HOSTS, np=4, user="root", ssh_ports={22}, network_interface="eth1")
    assert argv[:5] == ["mpirun", "-np", "4", "-H", "10.9.0.1:2,10.9.0.2:2"]
    assert argv[5:5 + len(MPIRUN_FLAGS)] == list(MPIRUN_FLAGS) and "--tag-output" in argv
    assert all(("-x", variable) in _flag_pairs(argv) for variable in MPIRUN_ENV)
    assert ("-mca", "btl_tcp_if_include", "eth1") in _flag_pairs(argv) and "--allow-run-as-root" in argv


def test_the_check_gate_runs_mpirun_as_jobs_do_but_untagged():
    gate = shlex.split(mpirun_command("/opt/mpi/bin/mpirun", HOSTS, "root", "eth1"))
    job = mpirun_argv("mpirun", HOSTS, np=4, user="root", ssh_ports={22}, network_interface="eth1")
    assert gate[:2] == ["timeout", "120"] and gate[-1] == "hostname"
    assert _flag_pairs(gate) == _flag_pairs(job)
    assert gate[gate.index("-H") + 1] == "10.9.0.1:1,10.9.0.2:1"  # one process per node
    assert "--tag-output" not in gate  # the gate compares the host names themselves


def test_the_ssh_port_is_named_only_when_it_is_not_22():
    assert ssh_port_option({22}) is None and ssh_port_option({2222}) == 2222
    argv = mpirun_argv("mpirun", HOSTS, np=2, user="ml", ssh_ports={2222}, network_interface=None)
    assert ("-mca", "plm_rsh_args", "-p 2222") in _flag_pairs(argv) and "--allow-run-as-root" not in argv
