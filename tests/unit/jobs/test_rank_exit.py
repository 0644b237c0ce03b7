"""The first failing rank, its host and how it ended, read from each launcher's own words."""

import pytest

from pycli.cluster.model import Host
from pycli.jobs.rank_exit import RankExit, RankExitReader, rank_hosts

HOSTS = (Host("node1", "10.0.0.1", slots=2), Host("node2", "10.0.0.2", slots=2))


def first(lines, hosts=HOSTS):
    reader = RankExitReader(hosts)
    for line in lines:
        reader.feed(line)
    return reader.first


def test_ranks_fill_each_host_s_slots_in_turn():
    assert rank_hosts(HOSTS) == ["node1", "node1", "node2", "node2"]


def test_horovodrun_gloo_names_the_rank_whose_process_ended():
    lines = [
        "[2]<stdout>:epoch 1 loss 0.41\n",
        "Process 2 exit with status code 137.\n",
        "Terminating remaining workers after failure of Process 2.\n",
        "Process 0 exit with status code 143.\n",
        "RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing the job "
        "to be terminated. The first process to do so was:\n",
    ]
    found = first(lines)
    assert found == RankExit(2, "node2", 137)
    assert found.describe() == "rank 2 on node2 was killed by SIGKILL (exit 137)"


def test_mpirun_names_the_rank_and_node_of_a_signal():
    lines = [
        "--------------------------------------------------------------------------\n",
        "mpirun noticed that process rank 3 with PID 4242 on node 10.0.0.2 exited on signal 9 (Killed).\n",
    ]
    assert first(lines).describe() == "rank 3 on node2 was killed by SIGKILL"


def test_mpirun_names_the_first_rank_that_exited_non_zero():
    lines = [
        "mpirun detected that one or more processes exited with non-zero status, thus causing\n",
        "the job to be terminated. The first process to do so was:\n",
        "\n",
        "  Process name: [[43262,1],1]\n",
        "  Exit code:    3\n",
    ]
    assert first(lines).describe() == "rank 1 on node1 exited 3"


def test_torchrun_root_cause_is_read_through_pycli_s_host_prefix():
    lines = [
        "[node2] Root Cause (first observed failure):\n",
        "[node2] [0]:\n",
        "[node2]   time      : 2026-11-24_18:40:01\n",
        "[node2]   host      : node2.cluster.internal\n",
        "[node2]   rank      : 3 (local_rank: 1)\n",
        "[node2]   exitcode  : -9 (pid: 4242)\n",
        "[node2]   error_file: <N/A>\n",
        "[node1] Root Cause (first observed failure):\n",
        "[node1]   host      : node1\n",
        "[node1]   rank      : 0 (local_rank: 0)\n",
        "[node1]   exitcode  : 1 (pid: 17)\n",
    ]
    assert first(lines) == RankExit(3, "node2", -9)


@pytest.mark.parametrize(("code", "said"), [
    (255, "rank 1 on node1 ended with exit 255 (ssh's: the rank was killed by a signal, or the node stopped answering)"),
    (-15, "rank 1 on node1 was killed by SIGTERM"),
    (143, "rank 1 on node1 was killed by SIGTERM (exit 143)"),
    (1, "rank 1 on node1 exited 1"),
    (200, "rank 1 on node1 exited 200"),
])
def test_each_kind_of_end_reads_as_words(code, said):
    assert RankExit(1, "node1", code).describe() == said


def test_output_that_names_no_rank_leaves_it_unknown():
    assert first(["Traceback (most recent call last):\n", "ValueError: boom\n", "Exit code: 3\n"]) is None
