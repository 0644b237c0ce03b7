"""The one place that calls ansible-runner.

Commands build a `RunRequest` (pure data, unit-tested), and `run()` hands it to
ansible-runner with the project's ansible.cfg, collecting per-host results from the
event stream. Artifacts (events as JSON, stdout) stay in the run folder, which keeps no
secret: ansible-runner records the environment and command line it ran with there, so
Ansible gets only the allow-listed part of the controller's environment, the extra
vars go by a private file outside the folder, removed after the run, and so do the real
values of the variables that hold credentials in a URL (the folder records them masked).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shlex
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from pycli.core.errors import BadInput
from pycli.core.paths import folders_env
from pycli.core.tree import COLLECTIONS, PROJECT_ROOT

# What Ansible may see of the controller's environment (ansible-runner would pass it all,
# and write it into the run folder): names, and prefixes ending in "_".
ENV_ALLOWED = (
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_", "TMPDIR", "SSH_AUTH_SOCK", "ANSIBLE_", "PYCLI_",
    "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
    "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR",
    "PIP_",  # the cache stage runs `pip download` on the controller (a mirror, its CA)
)

# The credentials of a URL wherever one appears in a value: "user:password@" or a lone "token@"
# between the scheme and the host (the last "@" there, should a password hold an unquoted one).
_URL_CREDENTIALS = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^/?#\s]*)@")


def mask_url_credentials(text: str) -> str:
    """`text` with the password of every URL in it, or its lone token, replaced by "***"
    (`http://bob:***@proxy:3128`, `https://***@mirror/simple`): what a run folder may record
    of an environment variable or a command line."""

    def masked(match: re.Match[str]) -> str:
        user, colon, _ = match[2].partition(":")
        return f"{match[1]}{user + ':' if colon else ''}***@"

    return _URL_CREDENTIALS.sub(masked, text)


# Forks per controller core when pycli picks the number itself. An Ansible fork spends nearly
# all its time waiting: on SSH round trips and on the module running on the node, not on the
# controller's CPU. One core keeps about 25 of them busy before the controller, not the nodes,
# becomes what a play waits for (ansible.cfg's old fixed 50 was this on 2 cores).
FORKS_PER_CORE = 25
# Never fewer than Ansible's own default: a run over 1 host still gets the implicit localhost.
MIN_FORKS = 5
FORKS_DEFAULT_HELP = (
    f"the hosts the run targets, at most {FORKS_PER_CORE} per controller core and at least {MIN_FORKS}; "
    "ANSIBLE_FORKS when set"
)


def default_forks(hosts: int, cores: int | None) -> int:
    """Forks for a run over `hosts` hosts on a controller with `cores` cores: one per host, at
    most FORKS_PER_CORE a core, at least MIN_FORKS (`cores` None: os.cpu_count() did not know)."""
    return max(MIN_FORKS, min(hosts, FORKS_PER_CORE * (cores or 1)))


def forks_for(request: RunRequest, environ: Mapping[str, str] = os.environ, cores: int | None = None) -> int | None:
    """The forks a run passes to Ansible: the request's own (--forks); None when ANSIBLE_FORKS
    is set (Ansible reads it: it reaches Ansible through ENV_ALLOWED); else default_forks over
    the hosts the request targets."""
    from pycli.core.errors import BadInput

    if request.forks is not None:
        if request.forks < 1:
            raise BadInput(f"--forks must be at least 1, got {request.forks}")
        return request.forks
    if "ANSIBLE_FORKS" in environ:
        value = environ["ANSIBLE_FORKS"]
        if not value.strip().isdigit() or int(value) < 1:
            raise BadInput(f"ANSIBLE_FORKS={value!r}: expected a whole number of at least 1")
        return None
    from pycli.cluster.ansible_inventory import hosts_targeted  # imports Ansible: only when counting

    return default_forks(len(hosts_targeted(request.inventory, request.pattern, request.limit)), cores or os.cpu_count())


HOST_EVENTS = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
}


@dataclass(frozen=True)
class RunRequest:
    """Everything one ansible-runner call needs; either a module (ad-hoc) or a playbook."""

    inventory: Path
    pattern: str = "all"
    module: str | None = None
    module_args: str = ""
    playbook: Path | None = None
    extravars: Mapping[str, object] = field(default_factory=dict)
    limit: str | None = None
    tags: str | None = None
    skip_tags: str | None = None
    check: bool = False
    forks: int | None = None  # None: run() picks them (forks_for)
    verbosity: int = 0
    # A run of many tasks (pycli provision) takes Mitogen's strategy (strategy_env); a short one
    # (an ad-hoc module, a job's containers) starts sooner with Ansible's own: Mitogen's start
    # costs 2 to 4 s a run.
    many_tasks: bool = False

    def runner_kwargs(self, run_dir: Path, extravars_file: Path | None = None) -> dict[str, object]:
        """The keyword arguments for ansible-runner, writing artifacts under `run_dir`.

        The extra vars are not among them: `run()` writes them to `extravars_file`, named
        here as `-e @file`, so neither the command line nor the run folder holds a value.
        """
        if (self.module is None) == (self.playbook is None):
            raise ValueError("a run takes exactly one of module or playbook")
        if self.extravars and extravars_file is None:
            raise ValueError("extra vars go to Ansible by a file: pass extravars_file")
        cmdline = ["-e", f"@{extravars_file}"] if self.extravars else []
        if self.check:
            cmdline.append("--check")
        if self.tags:
            cmdline += ["--tags", self.tags]
        if self.skip_tags:
            cmdline += ["--skip-tags", self.skip_tags]
        kwargs: dict[str, object] = {
            "private_data_dir": str(run_dir),
            "inventory": str(self.inventory.resolve()),
            "envvars": runner_env(self.many_tasks),
            "suppress_env_files": True,  # else env/envvars, env/cmdline... are written into run_dir
            # Else ansible-runner keeps every host's facts in run_dir (a local host's ansible_env: the
            # controller's environment, real values and all), over ansible.cfg's fact_caching = memory.
            "fact_cache_type": "memory",
            "quiet": self.verbosity == 0,
            "verbosity": self.verbosity or None,
        }
        if self.module:
            kwargs.update(module=self.module, module_args=self.module_args, host_pattern=self.pattern)
        else:
            assert self.playbook is not None  # __post_init__: a module or a playbook
            kwargs.update(playbook=str(self.playbook.resolve()), project_dir=str(PROJECT_ROOT))
        if self.limit:
            kwargs["limit"] = self.limit
        if self.forks:
            kwargs["forks"] = self.forks
        if cmdline:
            kwargs["cmdline"] = shlex.join(cmdline)  # ansible-runner shlex-splits it
        return {key: value for key, value in kwargs.items() if value is not None}


# Which of Ansible's strategies pycli's runs of many tasks (RunRequest.many_tasks: provisioning)
# use: Mitogen's (one Python per node kept for the whole run, instead of a new one for each
# task), or Ansible's own "linear" where this is set so.
# A site.yml with nothing to change on 2 nodes took 71 s and 72 s with linear, 43 s and 44 s with
# mitogen_linear (the controller's CPU 53 s against 39 s), the same cluster, one after another.
STRATEGY_ENV = "PYCLI_ANSIBLE_STRATEGY"
MITOGEN, LINEAR = "mitogen", "linear"


def strategy_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Ansible's settings for the strategy STRATEGY_ENV names (mitogen unless it says linear)."""
    chosen = environ.get(STRATEGY_ENV, MITOGEN).strip().lower() or MITOGEN
    if chosen == LINEAR:
        return {"ANSIBLE_STRATEGY": "linear"}
    if chosen != MITOGEN:
        raise BadInput(f"{STRATEGY_ENV}={chosen!r}: use {MITOGEN} (the default) or {LINEAR}")
    spec = importlib.util.find_spec("ansible_mitogen")
    if spec is None or not spec.submodule_search_locations:
        raise BadInput(f"Mitogen (the ansible_mitogen package) is not installed beside pycli: reinstall pycli, "
                       f"or set {STRATEGY_ENV}={LINEAR}")
    plugins = Path(next(iter(spec.submodule_search_locations))) / "plugins" / "strategy"
    return {"ANSIBLE_STRATEGY_PLUGINS": str(plugins), "ANSIBLE_STRATEGY": "mitogen_linear"}


def runner_env(many_tasks: bool = False) -> dict[str, str]:
    """Environment for Ansible: the project's config, the strategy (Mitogen's for a run of many
    tasks, strategy_env), and this interpreter's tools on PATH."""
    tools = str(Path(sys.executable).parent)
    return {
        # ansible-runner turns host-key checking off unless told otherwise; never here.
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_CONFIG": str(PROJECT_ROOT / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(PROJECT_ROOT / "roles"),
        # The roles' plugins (collection pycli.cluster) from this tree, before any path the environment names.
        **({"ANSIBLE_COLLECTIONS_PATH": os.pathsep.join([str(COLLECTIONS), os.environ["ANSIBLE_COLLECTIONS_PATH"]])}
           if os.environ.get("ANSIBLE_COLLECTIONS_PATH") else {}),
        "PATH": tools + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_FORCE_COLOR": "0",
        # The roles' controller folders are pycli's own, whatever the environment said (empty, say).
        **folders_env(),
        **(strategy_env() if many_tasks else {"ANSIBLE_STRATEGY": LINEAR}),
    }


def confine_env(env: Mapping[str, str], controller: Mapping[str, str] = os.environ) -> dict[str, str]:
    """`env` as ansible-runner prepared it, less what it copied unchanged from the controller's
    environment and ENV_ALLOWED does not name (what pycli or ansible-runner set stays)."""

    def allowed(name: str) -> bool:
        return any(name.startswith(entry) if entry.endswith("_") else name == entry for entry in ENV_ALLOWED)

    return {name: value for name, value in env.items() if allowed(name) or controller.get(name) != value}


def _hide_credentials(command: list[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str], Path | None]:
    """`command` and `env` as the run folder may record them: the variables holding credentials
    in a URL masked, their real values in a private file (0600, outside the folder; None when
    none does) that a shell sources before it execs `command`. The caller removes the file."""
    masked = {name: mask_url_credentials(value) for name, value in env.items()}
    hidden = {name: value for name, value in env.items() if masked[name] != value}
    if not hidden:
        return command, masked, None
    fd, name = tempfile.mkstemp(prefix="pycli-env-", suffix=".sh")
    with os.fdopen(fd, "w") as stream:
        stream.write("".join(f"export {key}={shlex.quote(value)}\n" for key, value in hidden.items()))
    return ["/bin/sh", "-c", '. "$0" && exec "$@"', name, *command], masked, Path(name)


@dataclass
class HostResult:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: bool = False
    messages: list[str] = field(default_factory=list)


@dataclass
class RunResult:
    status: str
    rc: int
    run_dir: Path
    hosts: dict[str, HostResult]

    @property
    def unreachable(self) -> list[str]:
        return sorted(name for name, res in self.hosts.items() if res.unreachable)

    @property
    def failed(self) -> list[str]:
        return sorted(name for name, res in self.hosts.items() if res.failed)


def _message(event_data: Mapping[str, object]) -> str:
    res = event_data.get("res") or {}
    if isinstance(res, Mapping):
        text = res.get("msg") or res.get("stderr") or res.get("module_stderr") or ""
        failed_items = [r for r in res.get("results") or () if isinstance(r, Mapping) and r.get("failed")]
        if failed_items:  # a loop: the first item that failed says why
            text = failed_items[0].get("msg") or text
        if text == "non-zero return code" and str(res.get("stderr") or "").strip():
            # A failed command: what it said is the news, its last line most of all.
            text = str(res["stderr"]).strip().splitlines()[-1]
    else:
        text = str(res)
    task = event_data.get("task") or ""
    return f"{task}: {str(text).strip().splitlines()[0] if str(text).strip() else 'failed'}" if task else str(text)


def collect_host_event(hosts: dict[str, HostResult], event: Mapping[str, object]) -> None:
    """Fold one ansible-runner event into the per-host results. A failure that a block's rescue
    took up is an event like any other failure; the run's closing stats say which were rescued, and
    a host whose failures all were has none."""
    data = event.get("event_data")
    if event.get("event") == "playbook_on_stats" and isinstance(data, Mapping):
        rescued, failures = data.get("rescued") or {}, data.get("failures") or {}
        for name, counted in hosts.items():
            if rescued.get(name):
                counted.failed = int(failures.get(name) or 0)
        return
    kind = HOST_EVENTS.get(str(event.get("event")))
    host = data.get("host") if isinstance(data, Mapping) else None
    if not kind or not host or not isinstance(data, Mapping):
        return
    result = hosts.setdefault(str(host), HostResult())
    res = data.get("res") or {}
    if kind == "ok":
        result.ok += 1
        if isinstance(res, Mapping) and res.get("changed"):
            result.changed += 1
    elif kind == "skipped":
        result.skipped += 1
    elif kind == "failed":
        if not data.get("ignore_errors"):
            result.failed += 1
            result.messages.append(_message(data))
    elif kind == "unreachable":
        result.unreachable = True
        result.messages.append(_message(data))


# How long Ansible gets to end its workers after SIGINT before ansible-runner SIGKILLs it.
CANCEL_GRACE_S = 15

# Set in Ansible's environment to a value of each run's own: every process the run starts on
# this machine (Ansible, its workers, what they run) carries it, even once it has lost its
# parent, so a cancelled run can find what Ansible left behind.
RUN_MARK = "PYCLI_RUN_MARK"


def _processes() -> list[tuple[int, int, bytes, bytes]]:
    """This machine's processes as (pid, ppid, cmdline, environ); those that end while read are left out."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            found.append((int(entry.name), ppid, (entry / "cmdline").read_bytes(), (entry / "environ").read_bytes()))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _ansible_children() -> list[int]:
    """This process's children that run Ansible (ansible-runner starts one per run)."""
    return [pid for pid, ppid, cmdline, _ in _processes() if ppid == os.getpid() and b"ansible" in cmdline]


def _marked(mark: str) -> list[int]:
    """The processes whose environment holds RUN_MARK=`mark`."""
    entry = f"{RUN_MARK}={mark}".encode()
    return [pid for pid, _, _, environ in _processes() if entry in environ.split(b"\0") and pid != os.getpid()]


class _Cancel:
    """ansible-runner's cancel callback, made to stop a run as Ctrl-C stops ansible-playbook.

    ansible-runner cancels by SIGKILL to Ansible's process group, but Ansible's workers run in
    sessions of their own and would finish their tasks unseen. SIGINT first: Ansible ends its
    workers and what they started; SIGKILL only after CANCEL_GRACE_S. Once Ansible has ended,
    `sweep` kills what it left behind all the same (it was killed, or the SIGINT never reached
    its workers): a cancelled run leaves nothing running on this machine."""

    def __init__(self, wanted: Callable[[], bool], mark: str) -> None:
        self.wanted = wanted
        self.mark = mark
        self.since: float | None = None

    def __call__(self) -> bool:
        if self.since is None:
            if not self.wanted():
                return False
            self.since = time.monotonic()
            for pid in _ansible_children():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)
        return time.monotonic() - self.since > CANCEL_GRACE_S

    def sweep(self) -> None:
        if self.since is None:
            return
        for pid in _marked(self.mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def run(
    request: RunRequest,
    run_dir: Path,
    on_event: Callable[[Mapping[str, object]], None] | None = None,
    cancel: Callable[[], bool] | None = None,
) -> RunResult:
    """Run the request through ansible-runner and return what happened on each host.

    `cancel` is polled while Ansible runs; when it returns True the run is stopped
    (status "canceled"). Without one, Ctrl-C stops the run the same way (Ansible and
    what it started on the nodes' side end cleanly) and then raises KeyboardInterrupt.
    """
    from ansible_runner.interface import init_runner  # slow to import; only commands that run Ansible pay for it

    request = replace(request, forks=forks_for(request))  # bad forks refused before the run folder is made
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    hosts: dict[str, HostResult] = {}

    def handler(event: Mapping[str, object]) -> bool:
        collect_host_event(hosts, event)
        if on_event:
            on_event(event)
        return True

    interrupted = threading.Event()
    own_sigint = cancel is None and threading.current_thread() is threading.main_thread()
    if own_sigint:
        previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
        cancel = interrupted.is_set
    stop = _Cancel(cancel, mark=uuid.uuid4().hex) if cancel is not None else None
    extravars_file = env_file = None
    if request.extravars:
        fd, name = tempfile.mkstemp(prefix="pycli-extravars-", suffix=".json")  # 0600
        extravars_file = Path(name)
        with os.fdopen(fd, "w") as stream:
            json.dump(dict(request.extravars), stream)
    try:
        outcome = init_runner(event_handler=handler, cancel_callback=stop, **request.runner_kwargs(run_dir, extravars_file))
        # ansible-runner seeds the job's environment with all of os.environ (and records it,
        # with the command, in artifacts/<ident>/command); this is the one point between
        # preparing and running.
        outcome.config.command, outcome.config.env, env_file = _hide_credentials(
            outcome.config.command, confine_env(outcome.config.env))
        if stop is not None:
            outcome.config.env[RUN_MARK] = stop.mark
        try:
            outcome.run()
        finally:
            if stop is not None:
                stop.sweep()
    finally:
        if own_sigint:
            signal.signal(signal.SIGINT, previous)
        for private in (extravars_file, env_file):
            if private is not None:
                private.unlink(missing_ok=True)
    if interrupted.is_set():
        raise KeyboardInterrupt
    # Ansible that ended by itself on SIGINT reports a failure: the run was still cancelled.
    status = "canceled" if stop is not None and stop.since is not None else outcome.status
    return RunResult(status=status, rc=outcome.rc, run_dir=run_dir, hosts=hosts)
