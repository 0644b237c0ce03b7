"""The package cache (role package_cache) on the shared 2-node cluster: node1 runs the cache (nginx) and both
nodes' apt fetch through it. What one node fetched, the next gets from the cache; apt still checks every
signature and hash of what the cache hands it.
"""

import io
import os
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import docker
import pytest

from tests.conftest import ROOT, run_pycli
from tests.integration.conftest import CLUSTER, node_run
from tests.integration.test_cache_stage import changed_tasks
from tests.integration.test_node_down import _address

pytestmark = pytest.mark.integration
CACHE_LOG = "/var/log/nginx/pycli-package-cache.log"
CACHE_DIR = "/var/cache/pycli-package-cache"
APT_CONF = "/etc/apt/apt.conf.d/01pycli-package-cache"
# A small package of Debian's that no role installs.
PROBE = "hello"


def provision_package_cache(inventory: Path, runs: Path) -> subprocess.CompletedProcess:
    proc = run_pycli("provision", str(inventory), "--tags", "package_cache", env={"PYCLI_RUNS": str(runs)}, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc


@pytest.fixture(scope="module")
def cached_cluster(provisioned_cluster, tmp_path_factory):
    """The shared cluster's inventory with group package_cache (node1); the setting taken back afterwards."""
    folder = tmp_path_factory.mktemp("package-cache")
    inventory = folder / "cached.ini"
    # node1's own address is a repository of this site's (test_apt_refuses_through_the_cache_...).
    node1 = _address(provisioned_cluster, "node1")
    inventory.write_text(provisioned_cluster.read_text() + "\n[package_cache]\nnode1\n"
                         f"\n[all:vars]\npackage_cache_repositories=[\"{node1}\"]\n")
    provision_package_cache(inventory, folder / "runs-first")
    yield inventory
    provision_package_cache(provisioned_cluster, folder / "runs-without")
    for node in ("node1", "node2"):
        assert node_run(node, "test", "-e", APT_CONF)[0] == 1, f"{node} still sends apt through the cache"


def transfers(path_part: str) -> list[tuple[str, str]]:
    """(answer, client) of every request in the cache's log whose URL holds path_part: answer is the
    cache's (MISS: fetched from the repository; HIT: handed out from the cache; ...)."""
    code, log = node_run("node1", "cat", CACHE_LOG)
    assert code == 0, log
    found = []
    for line in log.splitlines():
        fields = line.split()
        answer = next((f.removeprefix("cache=") for f in fields if f.startswith("cache=")), "")
        if len(fields) > 4 and path_part in fields[4]:
            found.append((answer, fields[0]))
    return found


def test_a_package_one_node_fetched_comes_to_the_next_from_the_cache_and_a_changed_copy_is_refused(
        cached_cluster, tmp_path):
    # nginx stopped on the cache host, whose own apt goes through it, and its package lists an
    # hour old, so that this run's apt asks the cache: the run repairs the cache first (before,
    # its apt failed through the stopped cache and nothing could repair it), and changes nothing
    # else but the lists it refreshed.
    code, out = node_run("node1", "sh", "-c", "systemctl stop nginx && touch -d '2 hours ago' /var/lib/apt/lists "
                         "&& { [ ! -e /var/lib/apt/periodic/update-success-stamp ] || "
                         "touch -d '2 hours ago' /var/lib/apt/periodic/update-success-stamp; }")
    assert code == 0, out
    provision_package_cache(cached_cluster, tmp_path / "again")
    assert set(changed_tasks(tmp_path / "again")) - {"node1: Install nginx"} == {
        "node1: Start a stopped cache before this host's apt asks it"}
    for node in ("node1", "node2"):
        code, out = node_run(node, "sh", "-c", f"cd /tmp && rm -f {PROBE}_*.deb && apt-get download -q {PROBE} 2>&1")
        assert code == 0, (node, out)
    found = transfers(f"/{PROBE}_")
    node1, node2 = _address(cached_cluster, "node1"), _address(cached_cluster, "node2")
    # One fetch from Debian's mirror (node1's miss), then node2's copy straight from the cache (a hit).
    assert found == [("MISS", node1), ("HIT", node2)], found

    # Nothing but a repository through the cache: not the cloud's metadata address, not the cache host
    # itself, not another node's port, not a host no source names (plain or over TLS).
    node2_web = f"http://{node2}/"
    refused = ["http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:22/", node2_web,
               "http://example.com/", "http://HTTPS///169.254.169.254/latest/", "http://HTTPS///example.com/x"]
    fetch = ("import sys, urllib.request as u, urllib.error as e\n"
             f"o = u.build_opener(u.ProxyHandler({{'http': 'http://{node1}:3142'}}))\n"
             "for url in sys.argv[1:]:\n"
             "    try: print(o.open(url, timeout=10).status, url)\n"
             "    except e.HTTPError as x: print(x.code, url)\n")
    code, out = node_run("node2", "python3", "-c", fetch, *refused)
    assert code == 0 and out.split() == [w for url in refused for w in ("403", url)], out
    assert not [line for line in node_run("node1", "cat", CACHE_LOG)[1].splitlines()
                if " 403 " not in line and ("169.254" in line or "example.com" in line or "127.0.0.1:22" in line)]
    # A path that decodes to a line break would split the request the cache sends upstream: refused.
    split = ["http://deb.debian.org/debian/dists/x%0d%0aX-Injected:%201", "http://HTTPS///deb.debian.org/x%0aY:%201"]
    code, out = node_run("node2", "python3", "-c", fetch, *split)
    assert code == 0 and out.split() == [w for url in split for w in ("400", url)], out

    # A cache that hands out a changed file: the same size, other bytes. apt checks the hash the signed
    # index gives and refuses it.
    code, cached = node_run("node1", "grep", "-rlE", f"^KEY: http://.*/{PROBE}_", CACHE_DIR)
    assert code == 0 and len(cached.split()) == 1, cached
    # The file's last bytes are the package's (the cache's own header comes first).
    spoil = "import sys; f = open(sys.argv[1], 'r+b'); f.seek(-64, 2); b = f.read(64); f.seek(-64, 2); " \
            "f.write(bytes(x ^ 0xFF for x in b))"
    assert node_run("node1", "python3", "-c", spoil, cached.split()[0])[0] == 0
    try:
        code, out = node_run("node2", "sh", "-c", f"cd /tmp && rm -f {PROBE}_*.deb && apt-get download -q {PROBE} 2>&1")
        assert code != 0 and "Hash Sum mismatch" in out, out
        assert node_run("node2", "sh", "-c", f"ls /tmp/{PROBE}_*.deb")[0] != 0, "apt kept the changed file"
    finally:
        node_run("node1", "rm", "-f", cached.split()[0])


def _deb(folder: Path, name: str, version: str) -> Path:
    root = folder / name
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: pycli tests <noreply@example.invalid>\n"
        "Description: pycli's package cache test (installs nothing)\n")
    deb = folder / f"{name}_{version}_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True, capture_output=True)
    return deb


def _put(node: str, folder: Path, where: str) -> None:
    """Copy folder's files into the node at `where`."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        tar.add(folder, arcname=".")
    container = docker.from_env().containers.get(f"pycli-{CLUSTER}-{node}")
    assert node_run(node, "mkdir", "-p", where)[0] == 0
    container.put_archive(where, data.getvalue())


def test_apt_refuses_through_the_cache_what_its_keyring_does_not_sign(cached_cluster, tmp_path):
    """A signed repository, served on node1's port 80 and fetched by node2 through the cache: with the key
    that signed it apt installs from it; with another key apt refuses it."""
    sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "nvidia_repo"))
    from build_repo import make_key, publish_flat

    repo, keys = tmp_path / "repo", tmp_path / "keys"
    keys.mkdir()
    for name in ("signer", "other"):
        make_key(tmp_path / name)
        subprocess.run(["gpg", "--batch", "--yes", "--export", "-o", str(keys / f"{name}.gpg")],
                       env={**os.environ, "GNUPGHOME": str(tmp_path / name)}, check=True)
    publish_flat(repo, [_deb(tmp_path, "pycli-cache-probe", "1.0")], tmp_path / "signer", "pycli-cache-test")
    _put("node1", repo, "/srv/pycli-cache-test")
    _put("node2", keys, "/etc/apt/keyrings/pycli-cache-test")
    server = threading.Thread(target=node_run, daemon=True, args=(
        "node1", "timeout", "120", "python3", "-m", "http.server", "80", "--directory", "/srv/pycli-cache-test"))
    server.start()
    node1 = _address(cached_cluster, "node1")
    deadline = time.monotonic() + 30
    while node_run("node2", "python3", "-c", f"import socket; socket.create_connection(('{node1}', 80), 1)")[0] != 0:
        assert time.monotonic() < deadline, "node1's test repository did not start"
        time.sleep(0.5)
    url = f"http://{node1}/"
    source = "/etc/apt/sources.list.d/pycli-cache-test.list"

    def update_with(key: str) -> tuple[int, str]:
        line = f"deb [signed-by=/etc/apt/keyrings/pycli-cache-test/{key}.gpg] {url} ./"
        node_run("node2", "sh", "-c", f"echo '{line}' > {source}")
        return node_run("node2", "sh", "-c", f"apt-get update -o Dir::Etc::sourcelist={source} "
                        "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0 2>&1")

    try:
        code, out = update_with("other")
        assert code != 0 and "NO_PUBKEY" in out, out
        code, out = node_run("node2", "sh", "-c", "apt-get download pycli-cache-probe 2>&1")
        assert code != 0, out
        code, out = update_with("signer")
        assert code == 0, out
        code, out = node_run("node2", "sh", "-c", "cd /tmp && apt-get download pycli-cache-probe 2>&1")
        assert code == 0, out
        # Both answers came through the cache: it logged handing node2 the repository's files.
        node2 = _address(cached_cluster, "node2")
        assert ("MISS", node2) in transfers("pycli-cache-probe"), transfers("pycli-cache")
    finally:
        node_run("node2", "rm", "-rf", source, "/etc/apt/keyrings/pycli-cache-test", "/tmp/pycli-cache-probe_1.0_all.deb")
        node_run("node1", "sh", "-c", "pkill -f 'http.server 80'; rm -rf /srv/pycli-cache-test")
        node_run("node2", "apt-get", "update", "-qq")


def test_a_node_whose_cache_does_not_answer_stops_in_one_line_or_where_the_site_allows_goes_direct(
        cached_cluster, tmp_path):
    """nginx stopped on node1, and a run of node2 alone (nothing in it starts the cache again)."""
    assert node_run("node1", "systemctl", "stop", "nginx")[0] == 0
    try:
        def node2_alone(*more: str) -> subprocess.CompletedProcess:
            return run_pycli("provision", str(cached_cluster), "--tags", "package_cache", "--limit", "node2",
                             "-e", "package_cache_wait_seconds=3", *more, env={"PYCLI_RUNS": str(tmp_path)}, timeout=600)

        stopped = node2_alone()
        assert stopped.returncode == 1, stopped.stdout[-3000:]
        assert "does not answer from node2 within 3 s" in stopped.stdout, stopped.stdout[-3000:]
        direct = node2_alone("-e", "package_cache_go_direct=true")
        assert direct.returncode == 0, direct.stdout[-3000:]
        assert "fetched straight from the repositories this run (package_cache_go_direct)" in direct.stdout
        assert node_run("node2", "test", "-e", APT_CONF)[0] == 1, "node2's apt still goes through the stopped cache"
        code, out = node_run("node2", "sh", "-c", f"cd /tmp && rm -f {PROBE}_*.deb && apt-get download -q {PROBE} 2>&1")
        assert code == 0, out
    finally:
        node_run("node1", "systemctl", "start", "nginx")
    # The next run that finds the cache answering sends node2's apt through it again.
    provision_package_cache(cached_cluster, tmp_path / "back")
    assert node_run("node2", "test", "-e", APT_CONF)[0] == 0
