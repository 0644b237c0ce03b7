"""Launcher host formats, both ways, and filling slots for --np (pure functions)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pycli.cluster.hostfiles import FORMATS, check_format, fill_slots, parse_horovod_hosts, parse_hostfile, render_hostfile
from pycli.cluster.inventory_writer import HostEntry
from pycli.cluster.model import Cluster, Host
from pycli.core.errors import EXIT_BAD_INPUT, BadInput


def cluster_of(*slots: int) -> Cluster:
    hosts = tuple(Host(name=f"n{i}", address=f"10.0.0.{i}", slots=count) for i, count in enumerate(slots, start=1))
    return Cluster(hosts=hosts, launcher="n1")


TWO_BY_FOUR = cluster_of(4, 4)

# ------------------------------------------------------------------ rendering


@pytest.mark.parametrize(
    "format_name, expected",
    [
        ("mpi", "10.0.0.1 slots=4\n10.0.0.2 slots=4\n"),
        ("horovod", "10.0.0.1:4,10.0.0.2:4\n"),
        ("deepspeed", "10.0.0.1 slots=4\n10.0.0.2 slots=4\n"),
    ],
)
def test_render_each_format(format_name, expected):
    assert render_hostfile(TWO_BY_FOUR.hosts, format_name) == expected


def test_render_names_hosts_by_address():
    hosts = (Host("gpu1", "gpu1"), Host("gpu2", "192.168.5.2", slots=2))
    assert render_hostfile(hosts, "horovod") == "gpu1:1,192.168.5.2:2\n"


@pytest.mark.parametrize("name", ["", "MPI", "hostfile", "openmpi"])
def test_unknown_format(name):
    with pytest.raises(BadInput, match=r"unknown --format .*; use one of mpi, horovod, deepspeed") as caught:
        check_format(name)
    assert caught.value.exit_code == EXIT_BAD_INPUT


def test_two_hosts_on_one_address_cannot_be_told_apart():
    hosts = (Host("a", "127.0.0.1", port=2201), Host("b", "127.0.0.1", port=2202))
    with pytest.raises(BadInput, match="hosts 'a' and 'b' share the address 127.0.0.1"):
        render_hostfile(hosts, "mpi")


def test_horovod_refuses_ipv6_mpi_takes_it():
    hosts = (Host("v6", "fe80::1", slots=2),)
    assert render_hostfile(hosts, "mpi") == "fe80::1 slots=2\n"
    with pytest.raises(BadInput, match="horovodrun -H cannot hold the IPv6 address"):
        render_hostfile(hosts, "horovod")


# ------------------------------------------------------------------ --np


@pytest.mark.parametrize(
    "slots, np, expected",
    [
        ((4, 4), None, [4, 4]),
        ((4, 4), 8, [4, 4]),
        ((4, 4), 1, [1]),
        ((4, 4), 4, [4]),
        ((4, 4), 5, [4, 1]),
        ((2, 1, 3), 4, [2, 1, 1]),
        ((1, 1, 1), 2, [1, 1]),
    ],
)
def test_fill_slots_examples(slots, np, expected):
    assert [host.slots for host in fill_slots(cluster_of(*slots), np)] == expected


@pytest.mark.parametrize(
    "np, fragment",
    [
        (0, "--np 0: the number of processes must be at least 1"),
        (-3, "must be at least 1"),
        (9, "--np 9 is more than the 8 slots of the cluster's 2 hosts; lower --np, or raise `slots`"),
    ],
)
def test_fill_slots_refuses(np, fragment):
    with pytest.raises(BadInput) as caught:
        fill_slots(TWO_BY_FOUR, np)
    assert fragment in str(caught.value)


clusters = st.lists(st.integers(min_value=1, max_value=16), min_size=1, max_size=40).map(lambda slots: cluster_of(*slots))


@given(clusters, st.data())
def test_fill_slots_properties(cluster, data):
    np = data.draw(st.integers(min_value=1, max_value=cluster.total_slots), label="np")
    used = fill_slots(cluster, np)
    # exactly np processes, on a prefix of the hosts, in inventory order
    assert sum(host.slots for host in used) == np
    assert [host.name for host in used] == [host.name for host in cluster.hosts[: len(used)]]
    # every host used but the last is full; the last holds at least one and at most its slots
    for given_host, used_host in zip(cluster.hosts, used[:-1]):
        assert used_host == given_host
    assert 1 <= used[-1].slots <= cluster.hosts[len(used) - 1].slots
    # no host is used that is not needed
    assert sum(host.slots for host in used[:-1]) < np


@given(clusters, st.integers())
def test_fill_slots_never_goes_beyond_the_cluster(cluster, np):
    if 1 <= np <= cluster.total_slots:
        assert sum(host.slots for host in fill_slots(cluster, np)) == np
    else:
        with pytest.raises(BadInput):
            fill_slots(cluster, np)


# ------------------------------------------------------------------ reading


@pytest.mark.parametrize(
    "text, expected",
    [
        # Volcano's /etc/volcano/worker.host: one host per line
        ("job-worker-0.job\njob-worker-1.job\n", [HostEntry("job-worker-0.job"), HostEntry("job-worker-1.job")]),
        # Open MPI / DeepSpeed, with comments, blank lines and Open MPI's max_slots
        (
            "# cluster\n\nnode1 slots=4\nnode2 slots=2 max_slots=8  # spare\nnode3 max-slots=2\n",
            [HostEntry("node1", slots=4), HostEntry("node2", slots=2), HostEntry("node3")],
        ),
        # MPICH / Intel MPI
        ("a:2\nb:1\n", [HostEntry("a", slots=2), HostEntry("b", slots=1)]),
        ("10.0.0.1 slots=8\n", [HostEntry("10.0.0.1", slots=8)]),
    ],
)
def test_parse_hostfile_forms(text, expected):
    assert parse_hostfile(text, source="hosts.txt") == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("a slots=0\n", "hosts.txt:1: host 'a': slots must be a positive integer, got '0'"),
        ("a slots=x\n", "got 'x'"),
        ("a\nb cpus=2\n", "hosts.txt:2: 'cpus=2' is not understood; a line is `host`, `host slots=N` or `host:N`"),
        ("a\n\nb\na slots=2\n", "hosts.txt:4: host 'a' is already on line 1; list each host once"),
        ("# only a comment\n\n", "hosts.txt: no hosts in it"),
        (":4\n", "hosts.txt:1: a host name is missing"),
    ],
)
def test_parse_hostfile_errors(text, fragment):
    with pytest.raises(BadInput) as caught:
        parse_hostfile(text, source="hosts.txt")
    assert fragment in str(caught.value)


def test_parse_hostfile_reports_every_bad_line():
    with pytest.raises(BadInput) as caught:
        parse_hostfile("a slots=0\nb\nc cpu=1\nb\n", source="h")
    assert [line.split(":")[1] for line in str(caught.value).splitlines()] == ["1", "3", "4"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a:4,b:4", [HostEntry("a", slots=4), HostEntry("b", slots=4)]),
        ("a:2, b", [HostEntry("a", slots=2), HostEntry("b")]),
        ("10.0.0.1:8", [HostEntry("10.0.0.1", slots=8)]),
    ],
)
def test_parse_horovod_hosts(text, expected):
    assert parse_horovod_hosts(text) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("a:4,,b:4", "an empty entry between commas"),
        ("a:four", "host 'a': slots must be a positive integer, got 'four'"),
        ("a:0", "got '0'"),
        ("a:1,a:2", "host 'a' is listed twice"),
    ],
)
def test_parse_horovod_hosts_errors(text, fragment):
    with pytest.raises(BadInput, match=r"^-H ") as caught:
        parse_horovod_hosts(text)
    assert fragment in str(caught.value)


# ------------------------------------------------------------------ round trips (text level)

names = st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True)


@given(st.dictionaries(names, st.integers(min_value=1, max_value=64), min_size=1, max_size=30), st.sampled_from(FORMATS))
def test_render_then_parse_gives_the_hosts_back(slots_by_name, format_name):
    hosts = tuple(Host(name=name, address=name, slots=slots) for name, slots in slots_by_name.items())
    text = render_hostfile(hosts, format_name)
    parsed = parse_horovod_hosts(text.strip()) if format_name == "horovod" else parse_hostfile(text, source="out")
    assert [(entry.name, entry.slots) for entry in parsed] == list(slots_by_name.items())
