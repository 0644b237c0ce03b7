"""Fixtures that need a Docker engine: a real 2-node local cluster reached over SSH."""

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ANSIBLE_PLAYBOOK, PYCLI, ROOT, TEST_CA_BUNDLE, run_pycli

# One cluster per test session, so sessions running side by side never share nodes.
CLUSTER = f"pytest-{os.getpid()}"
# The tests that need a third node share one more cluster, started only when one of them runs.
CLUSTER3 = f"pytest3-{os.getpid()}"
# The nodes' shared venv, as the common role makes it.
NODE_VENV = yaml.safe_load((ROOT / "roles" / "common" / "defaults" / "main.yml").read_text())["common_venv_path"]


def node_run(node: str, *argv: str, cluster: str = CLUSTER) -> tuple[int, str]:
    """argv on a node of a test cluster: its exit code and output (stdout and stderr together).

    Through pycli.local.dockerapi.run_in: the SDK's exec_run drops output on a loaded machine."""
    from pycli.local.dockerapi import run_in
    from pycli.local.plan import container_name

    return run_in(container_name(cluster, node), argv)


def node_shell(node: str, command: str, cluster: str = CLUSTER) -> tuple[int, str]:
    """A bash command line on a node of a test cluster, as node_run."""
    return node_run(node, "bash", "-c", command, cluster=cluster)


@contextlib.contextmanager
def frozen(node: str, cluster: str = CLUSTER):
    """Every process of a node but its init stopped (SIGSTOP), as on a hung node: the kernel
    still answers TCP, nothing above it does. Not `docker pause`: its cgroup freezer gave up
    ("unable to freeze") on a loaded CI machine, where a signal cannot fail."""
    code, out = node_shell(node, "kill -STOP -1", cluster=cluster)
    assert code == 0, out
    try:
        yield
    finally:
        node_shell(node, "kill -CONT -1", cluster=cluster)


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=10).ping()
        return True
    except Exception:  # noqa: BLE001 - any failure means no engine
        return False


@pytest.fixture(scope="session")
def docker_engine():
    if not _docker_answers():
        if os.environ.get("CI"):
            pytest.fail("no Docker engine answers; 'make test' runs scripts/host-prereqs.sh first")
        pytest.skip("no Docker engine answers; run 'sudo scripts/host-prereqs.sh'")


@pytest.fixture(scope="session")
def local_cluster(docker_engine, tmp_path_factory) -> Path:
    """A 2-node cluster named 'pytest-<pid>', up for the whole session and removed after it.

    In a lane of make test that follows the first provisioning (the Slurm lane, below), it is made
    at the lowest priority and its nodes stay at a low CPU weight until its own first provisioning
    (_follows_the_first_provisioning): node containers that wait cost nothing, and the node image
    is made once, by the first lane (pycli.local.image holds a lock while it makes it).
    Set PYCLI_KEEP_TEST_CLUSTER=1 to leave it up after the run, to look at it.
    """
    follows = _follows_the_first_provisioning()
    inventory = tmp_path_factory.mktemp("cluster") / f"local-{CLUSTER}.ini"
    # One slot per node: the tests run --np 2 and mean one rank on each node.
    run_pycli(
        "cluster", "up", "--name", CLUSTER, "--nodes", "2", "--slots", "1", "--output", str(inventory),
        "--ca-bundle", TEST_CA_BUNDLE, check=True, pycli=[*LOW_PRIORITY, *PYCLI] if follows else PYCLI,
    )
    if follows:
        _cpu_shares(CLUSTER, 2, LOW_CPU_SHARES)
    yield inventory
    if not os.environ.get("PYCLI_KEEP_TEST_CLUSTER"):
        run_pycli("cluster", "down", "--name", CLUSTER, check=True)


# make test installs pycli under a second Python too (Makefile, SECOND_PYTHON), from its wheel as
# a user installs it, and names that pycli here; one provisioning of the session's cluster and one
# job go through it, from a folder that is not the checkout (test_roles_state.py), so the
# controller is proven on two Pythons and in its installed form. Unset (pytest run by hand), it is
# this Python's pycli.
SECOND_PYCLI_ENV = "PYCLI_TEST_SECOND_PYCLI"


@pytest.fixture(scope="session")
def second_pycli() -> list[str]:
    """The command of the second Python's pycli (PYCLI_TEST_SECOND_PYCLI), checked to start and
    to run on another Python than this one; a test fails, not skips, where it does not."""
    path = os.environ.get(SECOND_PYCLI_ENV)
    if not path:
        return PYCLI
    if made := os.environ.get("PYCLI_TEST_SECOND_MADE"):  # make test makes it beside these tests: its exit code
        started = time.monotonic()
        while not Path(made).exists():
            if time.monotonic() - started > 3600:
                pytest.fail(f"the second venv was not made within 3600 s ({made})", pytrace=False)
            time.sleep(2)
        if (waited := time.monotonic() - started) > 1:
            print(f"\nwaited {waited:.0f} s for the second venv")
        if Path(made).read_text().strip() != "0":
            pytest.fail(f"the second venv was not made (exit {Path(made).read_text().strip()}): make test's output says why",
                        pytrace=False)
    here = "%d.%d" % sys.version_info[:2]
    try:
        started = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=120)
        # The entry script's own interpreter is its venv's, beside it.
        asked = subprocess.run([str(Path(path).with_name("python")), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=120)
    except OSError as error:
        pytest.fail(f"{SECOND_PYCLI_ENV}={path} does not start: {error}", pytrace=False)
    version = asked.stdout.strip()
    if started.returncode != 0 or not started.stdout.startswith("pycli ") or asked.returncode != 0:
        pytest.fail(f"{SECOND_PYCLI_ENV}={path} is no working pycli: {(started.stderr or asked.stderr).strip()[-300:]}",
                    pytrace=False)
    if version == here and not os.environ.get("PYCLI_TEST_SECOND_SAME"):  # make test's one-Python machine sets it
        pytest.fail(f"{SECOND_PYCLI_ENV}={path} runs on Python {version}, the one of these tests: it must be a second one",
                    pytrace=False)
    # The installed form (make test installs the wheel there, not editable): its tree is the one in
    # the package, inside that venv, asked from a folder that is not the checkout.
    with tempfile.TemporaryDirectory() as elsewhere:
        asked = subprocess.run([str(Path(path).with_name("python")), "-c", "from pycli.core.tree import PROJECT_ROOT; print(PROJECT_ROOT)"],
                               capture_output=True, text=True, timeout=120, cwd=elsewhere)
    tree, venv = Path(asked.stdout.strip() or "/"), Path(path).parent.parent  # VENV/bin/pycli
    if asked.returncode != 0 or venv not in tree.parents or not (tree / "playbooks" / "site.yml").is_file():
        pytest.fail(f"{SECOND_PYCLI_ENV}={path} is no installed pycli: it drives the tree at {tree} "
                    f"{asked.stderr.strip()[-300:]}", pytrace=False)
    return [path]


# `make test` starts the unit tests that need torch only once the first provisioning is past
# what its Open MPI build waits for in line (the checks, the build tools), which they would slow;
# then the build runs in the background and they take the cores beside it. PYCLI_TEST_SIDE_GO names the file that says so; this play is the first after the build's start.
SIDE_GO_PLAY = "Base system of the training nodes"


def _say_when_the_build_runs(runs: Path, marker: Path, ended: threading.Event) -> None:
    """Touch `marker` once a provisioning's events under `runs` reach SIDE_GO_PLAY, or when told it ended."""
    read: set[Path] = set()
    while not ended.wait(2):
        for path in runs.glob("*-provision/artifacts/*/job_events/*.json"):
            if path in read:
                continue
            try:
                event = json.loads(path.read_text())
            except (OSError, ValueError):  # still being written: read it next time
                continue
            read.add(path)
            if event.get("event") == "playbook_on_play_start" and event.get("event_data", {}).get("play") == SIDE_GO_PLAY:
                marker.touch()
                return
    marker.touch()


@pytest.fixture(scope="session")
def first_provisioning(request, local_cluster, tmp_path_factory) -> Path:
    """The run folder of the session's first `pycli provision` (site.yml) of its cluster.

    With an empty cache (CI) it builds Open MPI and Horovod (10 to 20 minutes on 2 cores);
    with a warm one it unpacks them from the cache (PYCLI_CACHE) in a few minutes. In a lane that
    follows the first lane's (make test's Slurm lane) it waits for that one, then is made from the
    cache it filled at a middle priority (nice 10, its nodes at a CPU weight of 256), and the
    nodes get their full weight back once it has ended. The Slurm lane is make test's longest, so
    its provisioning comes before what runs at the lowest priority (the 3-node cluster's, molecule,
    the second venv's unit tests), among which it took 14 minutes, against 3 alone; at the usual
    priority it took 2-node tests such as test_cache_stage's 2.5 times as long, and the whole run
    13 minutes longer (make test, 2026-12-07).
    """
    if _follows_the_first_provisioning():
        if failure := _wait_for_the_first_provisioning(lambda: False):
            pytest.fail(failure, pytrace=False)
        try:
            _cpu_shares(CLUSTER, 2, MIDDLE_CPU_SHARES)
            proc = run_pycli("provision", str(local_cluster), timeout=3600, pycli=[*MIDDLE_PRIORITY, *PYCLI])
        finally:
            _cpu_shares(CLUSTER, 2, NODE_CPU_SHARES)
        return _provisioned(proc)
    ended = threading.Event()
    if marker := os.environ.get("PYCLI_TEST_SIDE_GO"):
        threading.Thread(target=_say_when_the_build_runs, args=(Path(os.environ["PYCLI_RUNS"]), Path(marker), ended),
                         daemon=True).start()
    code = 1  # what the marker says where the provisioning raised
    try:
        proc = run_pycli("provision", str(local_cluster), timeout=3600)
        code = proc.returncode
    finally:
        ended.set()
        # make test starts molecule and lint once the provisioning has ended, well or not (Makefile),
        # and the lanes that follow it their clusters once it has passed: the exit code says which.
        if provisioned := os.environ.get(PROVISIONED_ENV):
            Path(provisioned).write_text(f"{code}\n")
    run_folder = _provisioned(proc)
    _start_three_nodes(request.session, tmp_path_factory)
    return run_folder


def _provisioned(proc: subprocess.CompletedProcess) -> Path:
    """The run folder a passed `pycli provision` names in its first line."""
    if proc.returncode != 0:
        raise AssertionError(f"pycli provision exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}")
    found = re.search(r"; run folder (\S+)", proc.stdout)  # provisioning's first line
    assert found, proc.stdout[:2000]
    return Path(found.group(1))


@pytest.fixture(scope="session")
def provisioned_cluster(local_cluster, first_provisioning) -> Path:
    """The session's cluster after `pycli provision` (site.yml): Open MPI, Horovod, SSH trust.

    Under `make test` the unit tests run beside the first provisioning; the tests wait here
    until they have ended (the file PYCLI_TEST_AFTER names exists), so that no test that times
    something shares the cores with them (molecule and lint, which time nothing, start once the
    first provisioning has ended, at the lowest priority).
    """
    _wait_for_the_parts_beside()
    return local_cluster


# `pycli train --docker`'s image in the tests: no registry is reachable here, so it is made on
# each node of the session's cluster from the node's own system (tests/fixtures/job_image.yml).
JOB_IMAGE = "pycli-test/horovod:1"


@pytest.fixture(scope="session")
def job_image(provisioned_cluster) -> str:
    """JOB_IMAGE on both nodes, made once a session (test_slurm's containers, test_train_docker's)."""
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(provisioned_cluster), "tests/fixtures/job_image.yml"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return JOB_IMAGE


def _wait_for_the_parts_beside() -> None:
    _wait_for_marker(os.environ.get("PYCLI_TEST_AFTER"), "the unit tests")


def _wait_for_marker(marker: str | None, what: str, limit_s: float = 3600) -> None:
    """Wait until the file make test writes when `what` has ended exists (nothing where unset)."""
    if not marker:
        return
    started = time.monotonic()
    while not Path(marker).exists():
        if time.monotonic() - started > limit_s:
            pytest.fail(f"{what} beside the integration tests did not end within {limit_s:.0f} s ({marker})", pytrace=False)
        time.sleep(2)
    if (waited := time.monotonic() - started) > 1:
        print(f"\nwaited {waited:.0f} s for {what} to end")


# make test runs the integration tests as three lanes, three pytest processes side by side
# (PYCLI_TEST_LANE), each with its own cluster: the 2-node cluster's tests; the Slurm tests
# (the marker `lane("slurm")`), on a 2-node cluster of their own; the 3-node cluster's tests (the
# fixture three_nodes). The first lane's first provisioning fills the cache (on CI: builds Open
# MPI and Horovod); the other two lanes wait for it to pass (PYCLI_TEST_PROVISIONED), then make
# and provision their clusters from that cache at a low priority (the 3-node cluster at nice 19
# and a CPU weight of 64 for its node containers, which no nice value reaches, against a node's
# 1024; the Slurm lane's, the longest lane, at nice 10 and 256: first_provisioning), so they take
# the cores the first lane's tests leave idle (waiting on a dead node, a timeout, a poll) and not
# those they use; the nodes get their weight back before the lane's first test. So the
# Slurm tests (15 minutes, most of it waiting on the scheduler) and the 3-node ones run beside
# the 2-node ones, not after them.
# Run by hand (no PYCLI_TEST_LANE), one pytest runs them all, on one 2-node cluster and the
# 3-node one: the first lane's tests, the Slurm ones, the 3-node cluster's last
# (pytest_collection_modifyitems).
# The compute gate compares nodes measured one after another, and beside the other lane's jobs a
# healthy node came out at 0.2 to 0.58 of the others (make test, 2026-12-04). So a test that
# measures the machine's cores (the fixture quiet_machine) holds the lanes' lock
# (PYCLI_TEST_LANES_LOCK) alone while it runs: it waits for the other lanes' running tests to
# end, and their next tests wait for it (every other test holds the lock shared).
THREE_NODES_FIXTURE = "three_nodes"
LOW_CPU_SHARES, MIDDLE_CPU_SHARES, NODE_CPU_SHARES = 64, 256, 1024
LOW_PRIORITY, MIDDLE_PRIORITY = ["nice", "-n", "19"], ["nice", "-n", "10"]
LANE_ENV = "PYCLI_TEST_LANE"
LOCK_ENV = "PYCLI_TEST_LANES_LOCK"  # a path the lanes share; make test sets it (Makefile)
PROVISIONED_ENV = "PYCLI_TEST_PROVISIONED"  # the file the first lane's first provisioning writes its exit code to
FIRST_LANE, SLURM_LANE, THREE_NODES_LANE = "two-nodes", "slurm", "three-nodes"
LANES = (FIRST_LANE, SLURM_LANE, THREE_NODES_LANE)  # in the order one pytest run by hand runs them


def lane_of(item: pytest.Item) -> str:
    if THREE_NODES_FIXTURE in getattr(item, "fixturenames", ()):
        return THREE_NODES_LANE
    mark = item.get_closest_marker("lane")
    return mark.args[0] if mark else FIRST_LANE


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"lane(name): the lane of make test that runs the test, one of {', '.join(LANES)} "
                                       f"(default {FIRST_LANE}; a test that needs the fixture {THREE_NODES_FIXTURE} "
                                       f"is {THREE_NODES_LANE}'s)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests in their lanes' order, each lane's in its own; under PYCLI_TEST_LANE, only
    those of that lane."""
    unknown = sorted({lane for item in items if (lane := lane_of(item)) not in LANES})
    if unknown:
        raise pytest.UsageError(f"lane {', '.join(unknown)} of a test: one of {', '.join(LANES)}")
    items.sort(key=lambda item: LANES.index(lane_of(item)))
    lane = os.environ.get(LANE_ENV)
    if not lane:
        return
    if lane not in LANES:
        raise pytest.UsageError(f"{LANE_ENV}={lane}: one of {', '.join(LANES)}")
    kept = [item for item in items if lane_of(item) == lane]
    if lane == THREE_NODES_LANE:
        both = [item.nodeid for item in kept if {"local_cluster", "provisioned_cluster"} & set(item.fixturenames)]
        if both:  # the lane would make a 2-node cluster of its own
            raise pytest.UsageError(f"{LANE_ENV}={lane}: these tests need both clusters: {', '.join(both)}")
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept


def _follows_the_first_provisioning() -> bool:
    """Whether this session is a lane of make test that makes its 2-node cluster after the first
    lane's first provisioning (from the cache it filled), not beside it."""
    return os.environ.get(LANE_ENV) == SLURM_LANE and bool(os.environ.get(PROVISIONED_ENV))


def _wait_for_the_first_provisioning(stopping) -> str | None:
    """In a lane of make test but the first, wait until the first lane's first provisioning has
    ended (PROVISIONED_ENV: it writes its exit code there) or `stopping()`; what failed, or None."""
    marker = os.environ.get(PROVISIONED_ENV)
    if not marker or os.environ.get(LANE_ENV) in (None, FIRST_LANE):
        return None
    path, started = Path(marker), time.monotonic()
    while not stopping() and not path.exists():
        time.sleep(2)
    said = path.read_text().strip() if path.exists() else "not ended"
    print(f"\nwaited {time.monotonic() - started:.0f} s for the first provisioning (the first lane's): exit {said or '?'}")
    if said != "0":
        return f"the first lane's first provisioning did not pass (exit {said or '?'}): its output says why"
    return None


@contextlib.contextmanager
def _lanes_lock(exclusive: bool):
    """The lanes' lock (LOCK_ENV), shared or alone; nothing where it is not set. A turnstile in
    front of it keeps a test that waits to hold it alone from waiting behind test after test of
    the other lanes: once it waits, their next tests wait behind it."""
    path = os.environ.get(LOCK_ENV)
    if not path:
        yield
        return
    with open(f"{path}.turnstile", "a") as turnstile, open(path, "a") as lock:
        if exclusive:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            fcntl.flock(lock, fcntl.LOCK_EX)
        else:
            fcntl.flock(turnstile, fcntl.LOCK_SH)
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


QUIET_FIXTURE = "quiet_machine"


def _is_quiet(item: pytest.Item) -> bool:
    return QUIET_FIXTURE in getattr(item, "fixturenames", ())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """Every other test holds the lanes' lock shared from its setup (the fixtures it is the first
    to need: a provisioning, say) to its teardown."""
    if _is_quiet(item):
        yield
        return
    with _lanes_lock(exclusive=False):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A test that names quiet_machine holds the lanes' lock alone while it runs (its setup, which
    may wait for its cluster, holds nothing)."""
    if not _is_quiet(item):
        yield
        return
    started = time.monotonic()
    with _noisy_steps_held():
        if (waited := time.monotonic() - started) > 1:
            print(f"\nwaited {waited:.0f} s for a step of molecule or lint to end")
        started = time.monotonic()
        with _lanes_lock(exclusive=True):
            if (waited := time.monotonic() - started) > 1:
                print(f"\nwaited {waited:.0f} s for the other lanes' tests to end")
            yield


# make test's molecule and lint run at nice 19, but two of their steps are work nice cannot hold
# back: removing a scenario's node containers (Docker's daemon deletes their files, at the usual
# priority) and ansible-lint's start. Twice on 2026-12-07 the compute gate measured in such a
# minute (a healthy node at 0.41 and at 0.14 of the median, the test clusters' nodes idle). Those
# steps hold this lock shared (Makefile, NOISY); a test that measures the cores holds it alone,
# so that neither runs while it does (PYCLI_TEST_NOISY_LOCK).
NOISY_LOCK_ENV = "PYCLI_TEST_NOISY_LOCK"


@contextlib.contextmanager
def _noisy_steps_held():
    path = os.environ.get(NOISY_LOCK_ENV)
    if not path:
        yield
        return
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture
def quiet_machine():
    """For a test that measures the machine's cores: while it runs, the other lanes of make test
    run no test (pytest_runtest_call above)."""
    return


class _ThreeNodes(threading.Thread):
    """`pycli cluster up` and `pycli provision` of the 3-node cluster, in the background, and
    `pycli cluster down` once the session ends (stopping what still runs)."""

    def __init__(self, inventory: Path) -> None:
        super().__init__(daemon=True, name="three-nodes")
        self.inventory = inventory
        self.failure: str | None = None
        self._proc: subprocess.Popen | None = None
        self._stopping = False

    def _pycli(self, *args: str, env: dict | None = None, timeout: float = 3600) -> tuple[int, str]:
        if self._stopping:
            return 1, "stopped: the session ended"
        self._proc = subprocess.Popen([*LOW_PRIORITY, *PYCLI, *args], cwd=ROOT, env={**os.environ, **(env or {})},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = self._proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out, _ = self._proc.communicate()
            out += f"\n(stopped after {timeout:.0f} s)"
        return self._proc.returncode, out

    def run(self) -> None:
        try:
            self._make()
        except Exception as error:  # noqa: BLE001 - the fixture says it, with the test that needs the cluster
            self.failure = f"making the 3-node cluster failed: {error!r}"

    def _make(self) -> None:
        if not self._first_provisioning_passed():
            return
        code, out = self._pycli("cluster", "up", "--name", CLUSTER3, "--nodes", "3", "--slots", "1",
                                "--output", str(self.inventory), "--ca-bundle", TEST_CA_BUNDLE, timeout=900)
        if code != 0:
            self.failure = f"pycli cluster up --name {CLUSTER3} exited {code}:\n{out}"
            return
        _cpu_shares(CLUSTER3, 3, LOW_CPU_SHARES)
        code, out = self._pycli("provision", str(self.inventory), "--skip-tags", "docker",
                                env={"PYCLI_RUNS": str(self.inventory.parent / "runs")})
        if code != 0:
            self.failure = f"pycli provision of {CLUSTER3} exited {code}:\n{out[-6000:]}"

    def _first_provisioning_passed(self) -> bool:
        self.failure = _wait_for_the_first_provisioning(lambda: self._stopping)
        return self.failure is None

    def end(self) -> None:
        """Stop what still runs (pycli ends its Ansible on SIGINT, as on Ctrl-C), then the cluster goes."""
        self._stopping = True
        if self.is_alive() and self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
        self.join(timeout=120)
        if not os.environ.get("PYCLI_KEEP_TEST_CLUSTER"):
            down = run_pycli("cluster", "down", "--name", CLUSTER3)
            if down.returncode != 0:  # said, as the fixture's teardown said it before: the nodes may be left
                print(f"\npycli cluster down --name {CLUSTER3} exited {down.returncode}: {down.stderr.strip()[-500:]}",
                      file=sys.stderr)


def _cpu_shares(cluster: str, nodes: int, shares: int) -> None:
    """The CPU weight of a test cluster's node containers (docker update --cpu-shares)."""
    from pycli.local.plan import container_name

    names = [container_name(cluster, f"node{i}") for i in range(1, nodes + 1)]
    subprocess.run(["docker", "update", "--cpu-shares", str(shares), *names], check=True, capture_output=True)


def _start_three_nodes(session: pytest.Session, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Start making the 3-node cluster where a test of this session needs it."""
    if any(lane_of(item) == THREE_NODES_LANE for item in session.items):
        _made_here(session.config, tmp_path_factory)


def _made_here(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> _ThreeNodes:
    maker = _ThreeNodes(tmp_path_factory.mktemp("cluster3") / f"local-{CLUSTER3}.ini")
    config.stash[_THREE_NODES_KEY] = maker
    config.add_cleanup(maker.end)
    maker.start()
    return maker


_THREE_NODES_KEY = pytest.StashKey[_ThreeNodes]()


@pytest.fixture(scope="session")
def three_nodes(request, docker_engine, tmp_path_factory) -> Path:
    """A 3-node cluster, provisioned (Docker left out: no job containers here), for the tests
    that need a third node (check --deep's pairs, SSH trust between more than two nodes,
    artifacts passed from node to node). The provisioning's run folder is in runs/ beside
    the inventory. Made in the background once the first provisioning has ended (above), or
    here where no first provisioning ran."""
    maker = request.config.stash.get(_THREE_NODES_KEY, None) or _made_here(request.config, tmp_path_factory)
    started = time.monotonic()
    # In the 3-node lane this includes the wait for the first lane's first provisioning (up to its
    # own 3600 s), then this cluster's `cluster up` and provisioning at nice 19.
    limit_s = 7200 if os.environ.get(LANE_ENV) else 3600
    maker.join(timeout=limit_s)
    waited = time.monotonic() - started
    if waited > 1:
        print(f"\nwaited {waited:.0f} s for the 3-node cluster")
    assert not maker.is_alive(), f"the 3-node cluster was not made within {limit_s} s"
    assert maker.failure is None, maker.failure
    _cpu_shares(CLUSTER3, 3, NODE_CPU_SHARES)
    _wait_for_the_parts_beside()  # the 3-node lane's first test, as the other lanes'
    return maker.inventory
