"""A planned job through Slurm's queue (`pycli train --scheduler slurm`): the batch script
written into the run folder, submitted with sbatch on the launcher node, its state said while
it waits, its output streamed from the node that runs it, Ctrl-C as scancel, and how it ended
as sacct accounts it.

The job keeps the plan's hosts: Slurm is asked for exactly those nodes (the job's files are
staged there) and as many tasks on each as the plan puts there, so a second job that wants
them waits in the queue until the first ends. Command lines and parsers: pycli.jobs.slurm.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import IO

from pycli.cluster import runner, slurm_nodes
from pycli.cluster.drained import stamp
from pycli.cluster.model import Cluster, Drained, Host
from pycli.cluster.nodes import SSH_TIMEOUT_S, ssh_each, ssh_stream
from pycli.core.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_UNREACHABLE, BadInput, PycliError
from pycli.jobs import containers, slurm
from pycli.jobs import files as job_files
from pycli.jobs.launch import TORCHRUN_RDZV_ENDPOINT_ENV, TORCHRUN_RDZV_ID_ENV, JobPlan, NodeLayout, gpus_short, launch_commands
from pycli.jobs.processes import JobExit
from pycli.jobs.slurm_watch import UNAVAILABLE_GRACE_S, SlurmWatch

SCRIPT_NAME = "job.sbatch"
# sacct can lag slurmctld by a moment (slurmdbd is told asynchronously): how long to ask.
ACCOUNTING_WAIT_S = 20
SUBMIT_TIMEOUT_S = 60


def without_unavailable(cluster: Cluster, states: dict[str, slurm_nodes.NodeState], say: Callable[[str], None]) -> Cluster:
    """The cluster less the nodes Slurm will not start a job on (drained by its health check, down)."""
    out = slurm_nodes.unavailable(states, [host.name for host in cluster.hosts])
    if not out:
        return cluster
    say("pycli: left out, as Slurm will start no job there: "
        + "; ".join(f"{node.node} ({node.state}: {node.reason})" for node in out))
    now = stamp()
    drained = tuple(Drained(node.node, f"Slurm: {node.state}, {node.reason}", now) for node in out)
    return replace(cluster, drained=drained).for_jobs()


def batch_job(plan: JobPlan, states: dict[str, slurm_nodes.NodeState], time_limit_s: float | None) -> slurm.BatchJob:
    """What to ask Slurm for: the plan's nodes, the most ranks on any of them, the GPUs asked for
    (--gpus-per-node; else one per rank on GPU nodes), and the request's account, QOS and partition;
    with --docker, the job's containers started as its first step."""
    tasks = max(host.slots for host in plan.hosts)
    counts = [(h.name, states[h.name].gpus if h.name in states else 0) for h in plan.hosts]
    if (short := gpus_short(plan.request.placement.gpus_per_node, counts, "in Slurm's Gres")) is not None:
        raise BadInput(short)
    gpus = min(gpus for _, gpus in counts)
    asked = plan.request.placement.gpus_per_node
    name = plan.request.launch.workload if "/" not in plan.request.launch.workload else Path(plan.request.launch.workload).stem
    return slurm.BatchJob(
        name=f"{slurm.JOB_NAME_PREFIX}{name}", nodes=tuple(h.name for h in plan.hosts), tasks_per_node=tasks,
        workdir=str(plan.job_dir), output=str(plan.job_dir / "slurm-%j.out"),
        steps=tuple((host.name, line) for host, line in launch_commands(plan)),
        time_limit_s=time_limit_s, gpus_per_node=min(gpus, tasks) if asked is None else asked,
        queue=slurm.queue_options(plan.request.queue.flags, slurm.SLURM), comment=slurm.job_comment(plan.job_id),
        job_id_env=TORCHRUN_RDZV_ID_ENV if plan.launcher == "torchrun" else "",
        rendezvous_env=(TORCHRUN_RDZV_ENDPOINT_ENV, plan.rank0.address) if plan.launcher == "torchrun" else (),
        elastic=plan.elastic_min_np is not None,
        ssh_port_env=containers.SSH_PORT_ENV if plan.request.container and plan.request.container.port(slurm=True) is None
        else "",
        setup="" if plan.request.container is None else containers.slurm_start_line(
            plan.request.container, plan.job_id, plan.job_dir, plan.layout.work_dir),
    )


def submit(plan: JobPlan, script: str) -> str:
    """sbatch on the launcher node, the script on its stdin; the Slurm job id."""
    def send(stdin: IO[bytes]) -> None:
        stdin.write(script.encode())

    # Detached: a Ctrl-C while sbatch runs must not cut it off with the job queued and its id
    # unknown; run_slurm cancels the job once submit has returned it.
    answer = ssh_stream(plan.rank0, slurm.submit_command(str(plan.job_dir)), send=send, timeout_s=SUBMIT_TIMEOUT_S,
                        detached=True)
    if not answer.ok:
        said = slurm.submit_refusal(answer.stderr)
        # An sbatch that timed out (or lost its connection) may have queued the job all the same:
        # found by its comment, it is cancelled, so no job runs that pycli does not watch.
        queued = [] if said else _cancel_queued(plan.rank0, slurm.job_comment(plan.job_id))
        left = f"; Slurm job {', '.join(queued)} it queued meanwhile is cancelled" if queued else ""
        raise PycliError(f"sbatch on {plan.rank0.name} refused the job: {said or answer.why()}{left}")
    return slurm.parse_job_id(answer.stdout)


def _cancel_queued(launcher: Host, comment: str) -> list[str]:
    """The jobs in Slurm's queue with `comment` (pycli's own job id), cancelled; their ids."""
    answer = ssh_each([(launcher, slurm.comments_command())], shared=True)[launcher.name]
    ids = slurm.with_comment(answer.stdout, comment) if answer.ok else []
    if ids:
        ssh_each([(launcher, "; ".join(slurm.cancel_command(job_id) for job_id in ids))], shared=True)
    return ids


def accounted(launcher: Host, job_id: str) -> slurm.AccountedJob | None:
    """The job as Slurm has it once it has finished, asked on `launcher`: sacct's record, else
    (slurmdbd down, or behind) slurmctld's own; what either says unfinished, or None, if neither
    says it ended."""
    deadline = time.monotonic() + ACCOUNTING_WAIT_S
    while True:
        answer = ssh_each([(launcher, slurm.sacct_command([job_id]))], shared=True)[launcher.name]
        found = [job for job in slurm.parse_sacct(answer.stdout) if job.job_id == job_id] if answer.ok else []
        if found and found[0].finished:
            return found[0]
        own = ssh_each([(launcher, slurm.scontrol_job_command(job_id))], shared=True)[launcher.name]
        kept = slurm.parse_scontrol_job(own.stdout, job_id) if own.ok else None
        if kept is not None and kept.finished:
            return kept
        if time.monotonic() > deadline:
            return found[0] if found else kept
        time.sleep(1)


def ending(job: slurm.AccountedJob | None, job_id: str, interrupted: bool, time_limit_s: float | None,
           held: str = "", unavailable: str = "") -> JobExit:
    """How the Slurm job ended, as pycli says it (pycli.jobs.processes.JobExit); `held`: why pycli
    cancelled it, as it would never start (slurm.held_for_good, or its pending reason where it was
    requeued held); `unavailable`: the nodes of its fixed node list that kept it from starting."""
    if slurm.requeued_held(held):
        return JobExit(EXIT_FAILED, f"Slurm job {job_id} was requeued held ({held}) and would wait for an "
                                    "administrator for good, so pycli cancelled it", final=True)
    if held:
        return JobExit(EXIT_BAD_INPUT, f"Slurm job {job_id} would never start as asked ({held}), so pycli cancelled it",
                       final=True)
    if unavailable:
        return JobExit(EXIT_FAILED, f"Slurm job {job_id} could not start: {unavailable}, a node it was submitted to "
                                    f"for {UNAVAILABLE_GRACE_S} s; pycli cancelled it (a new job leaves such a node out)",
                       final=True)
    if job is None:
        return JobExit(EXIT_FAILED, f"neither sacct nor slurmctld has a record of Slurm job {job_id}")
    said = f"Slurm job {job_id} {job.state}"
    if interrupted or job.state == "CANCELLED":
        return JobExit(EXIT_INTERRUPTED, f"{said} (cancelled)") if interrupted else JobExit(EXIT_FAILED, f"{said} by scancel")
    if job.state == "TIMEOUT":
        limit = f"its --time-limit of {time_limit_s:g} s passed" if time_limit_s else "its time limit passed"
        return JobExit(EXIT_FAILED, f"{limit} ({said})", timed_out=True)
    if job.state == "COMPLETED":
        return JobExit(0, said)
    code = job.exit_code or (128 + job.signal if job.signal else EXIT_FAILED)
    return JobExit(code, f"{said}, exit {job.exit_code}" + (f" signal {job.signal}" if job.signal else ""))


def script_name(restart: int) -> str:
    """The batch script's name in the run folder: job.sbatch, then one per restart."""
    return SCRIPT_NAME if not restart else f"job-restart{restart}.sbatch"


def run_slurm(plan: JobPlan, states: dict[str, slurm_nodes.NodeState], run_dir: Path, write: Callable[[str], None] = print,
              time_limit_s: float | None = None, restart: int = 0) -> tuple[JobExit, str]:
    """Submit the job (`restart`: its restart's number), say its state, stream its output, cancel it
    on Ctrl-C; how it ended and its Slurm job id."""
    script = slurm.sbatch_script(batch_job(plan, states, time_limit_s))
    path = run_dir / script_name(restart)
    path.write_text(runner.mask_url_credentials(script))  # the record, as job.txt's; sbatch gets the script
    interrupted = threading.Event()
    # Before sbatch: a Ctrl-C while it submits cancels the job as soon as its id is known.
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    try:
        return _submit_and_watch(plan, script, path, run_dir, write, time_limit_s, interrupted)
    finally:
        signal.signal(signal.SIGINT, previous)


def _submit_and_watch(plan: JobPlan, script: str, path: Path, run_dir: Path, write: Callable[[str], None],
                      time_limit_s: float | None, interrupted: threading.Event) -> tuple[JobExit, str]:
    job_id = submit(plan, script)
    write(f"pycli: Slurm job {job_id} submitted from {plan.rank0.name} (script {path})")
    watched = SlurmWatch(plan.rank0, {host.name: host for host in plan.hosts}, plan.job_dir, job_id, write, interrupted,
                         nodes=[host.name for host in plan.hosts]).run()
    if watched.lost:  # the job goes on in Slurm: nothing of it is touched
        return JobExit(EXIT_UNREACHABLE, watched.lost, lost=True, detached=True), job_id
    ended = ending(accounted(plan.rank0, job_id), job_id, watched.interrupted, time_limit_s, watched.held, watched.unavailable)
    last = watched.last
    if last and last.state == slurm.COMPLETING and (lost := unanswering(plan, slurm_nodes.expand_hostlist(last.nodes))):
        ended = replace(ended, why=f"{ended.why}; {', '.join(lost)} lost (no answer over SSH; Slurm ends the job "
                                   "there once it gives the node up)", lost=True)
    return ended, job_id


def unanswering(plan: JobPlan, nodes: list[str]) -> list[str]:
    """Those of the job's `nodes` (Slurm still cleaning up there) that do not answer over SSH."""
    hosts = [host for host in plan.hosts if host.name in nodes]
    answers = ssh_each([(host, "true") for host in hosts], SSH_TIMEOUT_S, shared=True) if hosts else {}
    return [name for name, answer in answers.items() if not answer.ok]


def _ask(host: Host, command: str, what: str) -> str:
    answer = ssh_each([(host, command)], shared=True)[host.name]
    if not answer.ok:
        raise PycliError(f"{what} on {host.name} failed: {answer.why()}")
    return answer.stdout


def _where(launcher: Host, job_id: str) -> dict[str, str] | None:
    """A job's state, nodes and folder: slurmctld's record while it has the job, else sacct's."""
    own = ssh_each([(launcher, slurm.scontrol_job_command(job_id))], shared=True)[launcher.name]
    if own.ok and (record := slurm.parse_attach_scontrol(own.stdout, job_id)) is not None:
        return record
    return slurm.parse_attach(_ask(launcher, slurm.attach_command(job_id), "asking sacct for the job"), job_id)


def attach(cluster: Cluster, job_id: str, results: Path, write: Callable[[str], None] = print) -> JobExit:
    """`pycli jobs --attach`: follow a job pycli submitted again, from any controller with the
    inventory: its output from its first line, its end, its results fetched into `results`.
    Ctrl-C stops following and leaves the job alone."""
    if not job_id.isdigit():
        raise BadInput(f"--attach {job_id!r}: give a Slurm job id, a number (pycli train printed it)")
    launcher = cluster.launcher_host
    record = _where(launcher, job_id)
    if record is None:
        raise BadInput(f"Slurm has no job {job_id} ('pycli jobs {cluster.inventory_path}' lists the jobs it has)")
    job_dir = PurePosixPath(record["WorkDir"])
    jobs_dir = NodeLayout.from_settings(cluster.settings).jobs_dir
    if job_dir.parent != jobs_dir:
        raise BadInput(f"Slurm job {job_id} is not a job of pycli's: its folder {slurm_nodes.printable(str(job_dir))} "
                       f"is not in {jobs_dir}")
    hosts = {host.name: host for host in cluster.hosts}
    write(f"pycli: following Slurm job {job_id} ({record['State']}), its folder {job_dir}")
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    try:
        watched = SlurmWatch(launcher, hosts, job_dir, job_id, write, interrupted, cancel_on_interrupt=False,
                             submitted=False).run()
    finally:
        signal.signal(signal.SIGINT, previous)
    if watched.lost:
        return JobExit(EXIT_UNREACHABLE, watched.lost, lost=True, detached=True)
    if watched.interrupted:
        return JobExit(EXIT_INTERRUPTED, f"stopped following Slurm job {job_id}", detached=True)
    ended = ending(accounted(launcher, job_id), job_id, False, None)
    final = _where(launcher, job_id)
    nodes = [hosts[name] for name in slurm_nodes.expand_hostlist((final or record)["NodeList"]) if name in hosts]
    if nodes:
        job_files.fetch_results(job_files.holding_metrics(nodes, job_dir), job_dir, results)
    return ended
