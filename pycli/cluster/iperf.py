"""Raw TCP throughput between two servers (iperf3), beside the allreduce figures of `pycli bench`."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pycli.cluster.model import Cluster
from pycli.cluster.node_facts import NodeFacts
from pycli.cluster.nodes import run_on_nodes

IPERF3_PORT = 5201


@dataclass(frozen=True)
class TcpLink:
    client: str
    server: str
    gbit_per_s: float | None  # None: not measured, `note` says why
    seconds: int = 0
    note: str = ""


def parse_iperf3(output: str) -> float:
    """Received bits per second from `iperf3 -J` output (with --bidir, the slower direction's);
    ValueError with iperf3's own error."""
    start = output.find("{")
    if start < 0:
        raise ValueError(output.strip().splitlines()[-1] if output.strip() else "iperf3 printed nothing")
    data = json.loads(output[start:])
    if data.get("error"):
        raise ValueError(str(data["error"]))
    end = data["end"]
    directions = [end[key]["bits_per_second"] for key in ("sum_received", "sum_received_bidir_reverse") if key in end]
    return float(min(directions))


# The server's pidfile lives in a folder only its user can enter, made anew by mktemp on the node:
# a fixed name in /tmp could be planted by anyone there, and `kill $(cat pidfile)` would obey it.
_SERVER_FOLDER = "pycli-iperf3.XXXXXXXX"
_SERVER_FOLDER_NAME = re.compile(r"pycli-iperf3\.[A-Za-z0-9]{8}")


def server_lifetime_s(seconds: int) -> int:
    """How long a server may live at most: longer than any client waits (60 s plus 6 per second
    measured), so that one left behind by a killed pycli still frees its port by itself."""
    return 120 + 6 * seconds


def tcp_server_command(seconds: int, port: int = IPERF3_PORT) -> str:
    """Start an iperf3 server in the background and print its private folder once it listens.

    `iperf3 -D` returns before its child listens, and a one-shot server (`-1`) is gone after a
    client's first try: the client's retries then met a refused connection and hid the real error.
    So the server serves every try until the stop line or its lifetime ends, and this line waits
    (10 s at most) until the port listens; otherwise it prints iperf3's own words and fails."""
    server_argv = shlex.join(["timeout", str(server_lifetime_s(seconds)), "iperf3", "-s", "-p", str(port)])
    listening = f'grep -Eq ":{port:04X} [0-9A-F]+:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null'
    return (f"folder=$(mktemp -d -t {_SERVER_FOLDER}) || exit 1; "
            f'setsid {server_argv} -I "$folder/pid" </dev/null >"$folder/log" 2>&1 & server=$!; '
            "for tick in $(seq 100); do "
            f'if [ -s "$folder/pid" ] && {listening}; then printf "%s\n" "$folder"; exit 0; fi; '
            'kill -0 "$server" 2>/dev/null || break; sleep 0.1; done; '
            'kill "$server" 2>/dev/null; tail -n 3 "$folder/log" >&2; rm -rf "$folder"; '
            f'echo "iperf3 -s is not listening on port {port}" >&2; exit 1')


def tcp_client_command(server_address: str, seconds: int, *, both_ways: bool = False) -> str:
    """Measure TCP to the server for `seconds` (JSON), retrying five times a second apart; when
    every try fails, the first try's answer (later ones may only repeat the symptom). `both_ways`:
    both directions at once (--bidir), so a link slow either way shows."""
    client_argv = shlex.join(["iperf3", "-c", server_address, "-p", str(IPERF3_PORT), "-t", str(seconds), "-J",
                              *(["--bidir"] if both_ways else [])])
    return (f'first=""; for attempt in 1 2 3 4 5; do out=$({client_argv} 2>&1) && break; '
            'first=${first:-$out}; out=$first; sleep 1; done; printf "%s\n" "$out"')


def tcp_commands(server_address: str, seconds: int) -> tuple[str, str]:
    """(start the server and print its private folder, run the client with retries)."""
    return tcp_server_command(seconds), tcp_client_command(server_address, seconds)


def tcp_stop_command(folder: str) -> str:
    """Stop a server left waiting and remove its folder; `folder` is what the start line printed.

    ValueError unless it is an absolute path to a folder that line makes, so a stray answer
    can never become an `rm -rf` of something else."""
    path = PurePosixPath(folder)
    if (not path.is_absolute() or str(path) != folder or any(part in (".", "..") for part in path.parts)
            or not re.fullmatch(r"[\w./-]+", folder) or not _SERVER_FOLDER_NAME.fullmatch(path.name)):
        raise ValueError(f"{folder!r} is not a folder the iperf3 start line makes")
    quoted, pidfile = shlex.quote(folder), shlex.quote(f"{folder}/pid")
    return f'if [ -f {pidfile} ]; then kill "$(cat {pidfile})" 2>/dev/null; fi; rm -rf {quoted}; true'


def measure_tcp(cluster: Cluster, facts: Mapping[str, NodeFacts], run_dir: Path, seconds: int) -> TcpLink:
    """iperf3 from the first server to the second; a note instead of a number when it cannot run."""
    hosts = cluster.hosts
    if len(hosts) < 2:
        return TcpLink(hosts[0].name, "", None, note="one server: there is no network link between servers to measure")
    client, server = hosts[0], hosts[1]
    missing = [h.name for h in (client, server) if not facts[h.name].iperf3]
    if missing:
        return TcpLink(client.name, server.name, None,
                       note=f"raw TCP not measured: iperf3 is not installed on {', '.join(missing)}")
    start, measure = tcp_commands(server.address, seconds)
    folder = run_dir / "iperf3"
    started = run_on_nodes(cluster, [server.name], folder / "server", start)[server.name]
    if not started.ok:
        return TcpLink(client.name, server.name, None, note=f"raw TCP not measured: iperf3 -s on {server.name}: {started.why()}")
    try:
        stop = tcp_stop_command(started.stdout.strip().splitlines()[-1] if started.stdout.strip() else "")
    except ValueError as exc:
        return TcpLink(client.name, server.name, None, note=f"raw TCP not measured: iperf3 -s on {server.name}: {exc}")
    try:
        answer = run_on_nodes(cluster, [client.name], folder / "client", measure)[client.name]
    finally:
        run_on_nodes(cluster, [server.name], folder / "stop", stop)
    (folder / "client.json").write_text(answer.stdout)
    try:
        bits = parse_iperf3(answer.stdout)
    except (ValueError, KeyError, json.JSONDecodeError) as exc:
        return TcpLink(client.name, server.name, None, note=f"raw TCP not measured: iperf3 -c failed: {exc}")
    return TcpLink(client.name, server.name, bits / 1e9, seconds)
