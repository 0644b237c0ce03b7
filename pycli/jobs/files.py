"""A job's files on its nodes, over OpenSSH: staging before it, its results and the sweep after it.

Every command here goes over one shared SSH connection per node (pycli.cluster.nodes, `shared`):
the first opens it, the rest reuse it, so the seconds a job spends outside its own processes
are a few round trips rather than an Ansible run each. On a local host (ansible_connection=local)
the same commands and streams run here, without SSH (pycli.cluster.nodes.node_argv).

Staging is content-addressed: every file pycli stages is named on the nodes by a digest of
what it holds (`content_digest`) and kept in the node's store (NodeLayout.store); a job
hard-links its workload from there, and reads its data in place. A node is sent only what
its store lacks, in one tar stream. The node's side is one script, pycli_node/stage-job.sh.
"""

from __future__ import annotations

import hashlib
import shlex
import tarfile
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import IO

from pycli.cluster.model import Host
from pycli.cluster.nodes import SSH_FAILED, SSH_TIMEOUT_S, NodeOutput, ssh_each, ssh_stream
from pycli.core.errors import BadInput, PycliError, Unreachable, warn
from pycli.core.paths import NODE_PACKAGE, WORKLOADS_DIR
from pycli.jobs import trust as job_trust
from pycli.jobs.launch import AUTOTUNE_LOG, METRICS_FILE, JobPlan, gpus_short, stray_sweep_line

STAGE_SCRIPT = NODE_PACKAGE / "stage-job.sh"
# What a digest covers of a folder: every file but Python's byte-code caches.
SKIPPED_NAMES = ("__pycache__",)
SKIPPED_SUFFIXES = (".pyc",)
# Items up to this size are named by their contents; bigger ones (datasets) by each file's
# size and modification time, as rsync's quick check compares them, so a job does not read
# gigabytes on the controller before it starts.
CONTENT_HASH_LIMIT = 64 * 2**20
DIGEST_CHARS = 32
# How long staging may take on one node: its store may lack a dataset.
STAGE_TIMEOUT_S = 30 * 60
DEFAULT_JOBS_KEPT = 20
# Tar streams sent at once, one per node that lacks something.
SENDS_AT_ONCE = 32
# What the stage script's lines start with (pycli_node/stage-job.sh).
KINDS = ("tree", "file", "data", "direct")


@dataclass(frozen=True)
class StageItem:
    """One thing a job needs on its nodes: `src` on the controller, placed as `how` says (KINDS)."""

    src: Path
    how: str
    dest: PurePosixPath | None  # None for data, which the job reads in the store
    digest: str

    @property
    def word(self) -> str:
        """The item as the stage script takes it: DIGEST:HOW:DEST."""
        return f"{self.digest}:{self.how}:{self.dest or ''}"


def folder_files(src: Path) -> list[tuple[str, Path]]:
    """(name in the item, file) for every file of a folder, sorted; a file is its own "file"."""
    if not src.is_dir():
        return [("file", src)]
    found = []
    for path in src.rglob("*"):
        rel = path.relative_to(src)
        if any(part in SKIPPED_NAMES for part in rel.parts) or path.suffix in SKIPPED_SUFFIXES or not path.is_file():
            continue
        found.append((rel.as_posix(), path))
    return sorted(found)


def content_digest(src: Path) -> str:
    """The name of `src` (a file, or a folder's files) on the nodes: the same content, the same name."""
    files = folder_files(src)
    quick = sum(path.stat().st_size for _, path in files) > CONTENT_HASH_LIMIT
    digest = hashlib.sha256(b"quick" if quick else b"content")
    for name, path in files:
        stat = path.stat()
        digest.update(f"{name}\0{stat.st_mode & 0o777:o}\0{stat.st_size}\0".encode())
        if quick:
            digest.update(f"{stat.st_mtime_ns}\0".encode())
        else:
            with path.open("rb") as handle:
                digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()[:DIGEST_CHARS]


def jobs_kept(value: object) -> int:
    """pycli_jobs_kept from the inventory: how many job folders (and store entries) a node keeps."""
    if value is None or value == "":
        return DEFAULT_JOBS_KEPT
    text = str(value).strip()
    if not text.isdigit():
        raise BadInput(f"pycli_jobs_kept is {text!r}: give how many job folders a node keeps, a whole number (0: all)")
    return int(text)


def stage_items(plan: JobPlan, container_files: Path | None = None, discovery: Path | None = None,
                slurm_ssh: Path | None = None) -> list[StageItem]:
    """What a job needs on its nodes: its workload (the built-in folder, or the user's script),
    its data, the checkpoint it resumes from, and its container files, host discovery script and
    own ssh (a folder), which are its own and never stored."""
    workloads = plan.job_dir / "workloads"
    script = plan.script.resolve()
    if script.parent == WORKLOADS_DIR:  # the built-in workloads import their shared library
        items = [StageItem(WORKLOADS_DIR, "tree", workloads, content_digest(WORKLOADS_DIR))]
    else:
        items = [StageItem(script, "file", workloads / script.name, content_digest(script))]
    if plan.data_dir is not None:
        assert plan.data_digest, "plan_job names the data by its digest"
        items.append(StageItem(plan.data_dir.resolve(), "data", None, plan.data_digest))
    if plan.resume is not None:
        resume = plan.resume.resolve()
        items.append(StageItem(resume, "file", plan.job_dir / "resume.pt", content_digest(resume)))
    # Private keys and a per-job script: sent to this job's folder only, never kept in a store.
    own = ((container_files, plan.job_dir / "container"), (discovery, plan.discovery_script), (slurm_ssh, plan.slurm_ssh_dir))
    for path, dest in own:
        if path is not None:
            items.append(StageItem(path.resolve(), "direct", dest, hashlib.sha256(str(dest).encode()).hexdigest()[:DIGEST_CHARS]))
    return items


def stage_command(plan: JobPlan, mode: str, items: Sequence[StageItem], *, port: bool) -> str:
    """The command line that runs the stage script on a node (over SSH, in its login shell)."""
    args = [mode, str(plan.job_dir), str(plan.layout.store), str(plan.jobs_kept), "1" if port else "0"]
    return shlex.join(["bash", "-c", STAGE_SCRIPT.read_text(), "stage-job.sh", *args, *(i.word for i in items)])


@dataclass(frozen=True)
class NodeStage:
    """What the stage script said on one node (parse_stage)."""

    cpus: int = 0
    gpus: int = 0
    port: int | None = None
    needs: frozenset[str] = frozenset()
    removed: tuple[str, ...] = ()
    kept_back: tuple[str, ...] = ()


def parse_stage(stdout: str) -> NodeStage:
    cpus, gpus, port, needs, removed, kept_back = 0, 0, None, set(), [], []
    for line in stdout.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "cpus" and rest.isdigit():
            cpus = int(rest)
        elif word == "gpus" and rest.isdigit():
            gpus = int(rest)
        elif word == "port" and rest.isdigit():
            port = int(rest)
        elif word == "need" and rest:
            needs.add(rest)
        elif word == "removed":
            removed.append(rest)
        elif word == "kept-back":
            kept_back.append(rest)
    return NodeStage(cpus, gpus, port, frozenset(needs), tuple(removed), tuple(kept_back))


def _tar_members(items: Sequence[StageItem]) -> Iterator[tuple[Path, str]]:
    for item in items:
        top = f"direct-{item.digest}" if item.how == "direct" else item.digest
        if item.src.is_dir():
            for name, path in folder_files(item.src):
                yield path, f"{top}/{name}"
        elif item.how == "direct":
            yield item.src, top
        else:
            yield item.src, f"{top}/file"


def write_tar(items: Sequence[StageItem], out: IO[bytes]) -> None:
    """The items as the stage script unpacks them: top folders named by digest (direct-DIGEST for direct items)."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, dereference=True) as tar:
        for path, name in _tar_members(items):
            tar.add(path, arcname=name, recursive=False)


def _failure(what: str, answers: dict[str, NodeOutput]) -> PycliError | None:
    """One error for the hosts that failed (unreachable ones first), or None."""
    lost = sorted(name for name, out in answers.items() if out.rc == SSH_FAILED)
    if lost:
        return Unreachable(f"{what}: cannot reach {', '.join(lost)} ({answers[lost[0]].why()})")
    failed = sorted(name for name, out in answers.items() if not out.ok)
    if failed:
        return PycliError(f"{what} failed: " + "; ".join(f"{name}: {answers[name].why()}" for name in failed))
    return None


def _receive(host: Host, command: str, items: Sequence[StageItem]) -> NodeOutput:
    """Run the stage script's receive mode on `host`, the items' tar stream on its stdin. Sent
    again whole if the kept connection was dead: the node unpacks into a fresh folder each time."""
    return ssh_stream(host, command, send=lambda stdin: write_tar(items, stdin), timeout_s=STAGE_TIMEOUT_S)


def stage(plan: JobPlan, run_dir: Path, container_files: Path | None = None, discovery: Path | None = None,
          slurm_ssh: Path | None = None) -> JobPlan:
    """Put the job's files at the same paths on every node of the job; what a node's store
    holds already is not sent again. Returns the plan completed with what the nodes said:
    their cores (threads per rank) and GPUs (Horovod's settings), and, over SSH, torchrun's
    rendezvous port, free on the first node."""
    items = stage_items(plan, container_files, discovery, slurm_ssh)
    rendezvous = plan.launcher == "torchrun" and not plan.slurm  # through Slurm the batch script picks the port
    peers = job_trust.peers(plan)

    def check(host: Host) -> str:
        line = stage_command(plan, "check", items, port=rendezvous and host == plan.rank0)
        return f"{line} && {job_trust.probe_line(peers)}" if peers and host == plan.rank0 else line

    checks = ssh_each([(host, check(host)) for host in plan.hosts], timeout_s=SSH_TIMEOUT_S * 6, shared=True)
    if (error := _failure("staging the job", checks)) is not None:
        raise error
    if peers and (untrusted := job_trust.parse_probe(checks[plan.rank0.name].stdout)):
        raise job_trust.Untrusted(plan, untrusted)
    said = {name: parse_stage(out.stdout) for name, out in checks.items()}
    # Over SSH pycli gives the GPUs out, from what staging counts; through Slurm, Slurm does, from its
    # Gres (pycli.jobs.slurm_queue.batch_job checks that, before sbatch).
    counted = [(h.name, said[h.name].gpus) for h in plan.hosts]
    if not plan.slurm and (short := gpus_short(plan.request.placement.gpus_per_node, counted,
                                               "as staging counted them")) is not None:
        raise BadInput(short)
    log = [f"{name}: cores {s.cpus}, GPUs {s.gpus}; lacked {', '.join(sorted(s.needs)) or 'nothing'}; removed old job folders "
           f"{', '.join(s.removed) or 'none'}" for name, s in said.items()]
    receive = {host: [i for i in items if i.digest in said[host.name].needs] for host in plan.hosts}
    receive = {host: wanted for host, wanted in receive.items() if wanted}
    if receive:
        command = stage_command(plan, "receive", items, port=False)
        with ThreadPoolExecutor(max_workers=min(SENDS_AT_ONCE, len(receive))) as pool:
            sent = pool.map(lambda pair: _receive(pair[0], command, pair[1]), receive.items())
            answers = {out.host: out for out in sent}
        if (error := _failure("staging the job", answers)) is not None:
            raise error
    (run_dir / "stage.txt").write_text("".join(line + "\n" for line in log))
    for name, s in sorted(said.items()):
        for why in s.kept_back:
            warn(f"{name} keeps old job folders it cannot remove (pycli_jobs_kept): {why}")
    if rendezvous:
        port = said[plan.rank0.name].port
        if port is None:
            raise PycliError(f"staging the job: {plan.rank0.name} named no free port for torchrun")
        plan = replace(plan, rendezvous_port=port)
    return replace(plan, node_cpus=tuple((host.name, said[host.name].cpus) for host in plan.hosts),
                   node_gpus=tuple((host.name, said[host.name].gpus) for host in plan.hosts))


# The files a job leaves for the controller: rank 0's metrics and checkpoints (not the one it
# resumed from), and what horovodrun --autotune tried.
RESULTS_LINE = (
    f"{{ find . checkpoints -maxdepth 1 -type f \\( -name {METRICS_FILE} -o -name '*.pt' -o -name "
    f"{AUTOTUNE_LOG} \\) ! -name resume.pt 2>/dev/null; true; }} | tar -c -f - --no-recursion -T -"
)


def rank0_host(plan: JobPlan, gone: Collection[str] = ()) -> Host:
    """The node rank 0 ran on: the plan's first, unless torchrun's rendezvous numbered the nodes;
    then the one whose job folder holds rank 0's metrics (the first node when none does). Nodes
    in `gone` (the sweep after the job found them unreachable) are not asked: each would cost an
    SSH connect timeout."""
    return holding_metrics(plan.hosts, plan.job_dir, gone) if plan.ranks_by_rendezvous else plan.rank0


def holding_metrics(hosts: Sequence[Host], job_dir: PurePosixPath, gone: Collection[str] = ()) -> Host:
    """The first of `hosts` whose job folder holds rank 0's metrics; the first of them when none does."""
    probe = f"test -f {shlex.quote(str(job_dir / METRICS_FILE))}"
    asked = [host for host in hosts if host.name not in gone]
    answers = ssh_each([(host, probe) for host in asked], shared=True)
    return next((host for host in asked if answers[host.name].ok), hosts[0])


def collect(plan: JobPlan, results: Path, gone: Collection[str] = ()) -> None:
    """Fetch rank 0's metrics and checkpoints into `results`; `gone`: nodes known not to answer (rank0_host)."""
    fetch_results(rank0_host(plan, gone), plan.job_dir, results)


def fetch_results(host: Host, job_dir: PurePosixPath, results: Path) -> None:
    """The job's metrics and checkpoints from its folder on `host` into `results`, one tar stream
    over the shared connection."""
    command = f"cd {shlex.quote(str(job_dir))} && {RESULTS_LINE}"
    results.mkdir(parents=True, exist_ok=True)

    def unpack(stdout: IO[bytes]) -> None:  # a second try writes the same files again
        with tarfile.open(fileobj=stdout, mode="r|") as tar:
            tar.extractall(results, filter="data")

    answer = ssh_stream(host, command, receive=unpack, timeout_s=STAGE_TIMEOUT_S)
    if not answer.ok:
        error = Unreachable if answer.rc == SSH_FAILED else PycliError
        raise error(f"fetching the results from {host.name}: {answer.why()}")


# What stop_strays says of a node it could not reach.
UNSWEPT = "unreachable, not checked"


def stop_strays(plan: JobPlan) -> dict[str, str]:
    """After the job, no process of it may be left on any node (their command lines name the job).

    Returns what is left, by host: the survivors' `pid command` lines, or why the host could not be swept."""
    answers = ssh_each([(host, stray_sweep_line(plan.job_dir)) for host in plan.hosts], shared=True)
    left = {}
    for name, out in answers.items():
        if out.rc == SSH_FAILED:
            left[name] = UNSWEPT
        elif not out.ok:
            left[name] = out.stderr.strip() or out.why()
    return left
