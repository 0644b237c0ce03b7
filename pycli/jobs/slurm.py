"""The one place that knows Slurm's command lines and output for jobs: what pycli asks of
slurmctld (sbatch, salloc, squeue, sacct, scontrol, scancel) and how it reads the answers; the
nodes' side (sinfo's states, drain and resume, hostlists) is pycli.cluster.slurm_nodes. Pure: the
commands run on a node over SSH (pycli.jobs.slurm_queue, pycli.cli.jobs, pycli.cluster.drained's callers),
and the parsers are tested on Slurm 22.05's own output.

pycli's node names are Slurm's: the slurm role writes one NodeName per inventory host, named
as the inventory names it (roles/slurm).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pycli.cluster.slurm_nodes import expand_hostlist, printable
from pycli.core.errors import BadInput

# `pycli train --scheduler`: through Slurm's queue, or started over SSH as without Slurm.
SLURM, SSH = "slurm", "ssh"
SCHEDULERS = (SLURM, SSH)
# --elastic: how long the batch script waits for the other nodes' launchers after the first one's has ended.
ELASTIC_GRACE_S = 30
# The job name every job pycli submits carries (squeue, sacct): "pycli-<workload>".
JOB_NAME_PREFIX = "pycli-"
# sacct's fields `pycli jobs` shows, in this order (-P: separated by '|', no padding).
# A job's name is whatever its owner gave sbatch (a "|" or an escape sequence too): it comes last
# in both, so a "|" in it stays in it, and it is made printable (printable) before anyone sees it.
SACCT_FIELDS = ("JobID", "User", "State", "ExitCode", "Submit", "Start", "Elapsed", "NodeList", "Reason", "JobName")
SQUEUE_FORMAT = "%i|%u|%T|%r|%D|%N|%B|%j"
FINISHED_STATES = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "TIMEOUT")
# The job's own processes have ended, and Slurm cleans up after them (the epilog on each node). On
# a node that stopped answering that takes until Slurm gives the node up (minutes); the job's
# result is known before: pycli's watch ends here.
COMPLETING = "COMPLETING"


def choose_scheduler(asked: str | None, has_slurm: bool) -> str:
    """The scheduler a job goes through: the one asked for, else Slurm where the inventory has it."""
    if asked is None:
        return SLURM if has_slurm else SSH
    if asked not in SCHEDULERS:
        raise BadInput(f"unknown --scheduler {asked!r}; use one of {', '.join(SCHEDULERS)}")
    if asked == SLURM and not has_slurm:
        raise BadInput("--scheduler slurm: this inventory has no Slurm; add a [slurm_controller] group naming one node "
                       "(or write it with 'pycli inventory new --slurm' / 'pycli cluster up --slurm') and run "
                       "'pycli provision' again")
    return asked


# `pycli train`'s flags that only Slurm has, each with what Slurm calls the thing it names.
QUEUE_FLAGS = {"account": "account", "qos": "QOS", "partition": "partition"}
# A name sacctmgr and slurm.conf take as it is: no quoting, no list or option separators.
SLURM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def queue_options(asked: Mapping[str, str | None], scheduler: str) -> tuple[tuple[str, str], ...]:
    """--account, --qos and --partition as sbatch takes them, each checked to be a Slurm name;
    refused in one line where the job does not go through Slurm's queue."""
    given = {flag: value for flag, value in asked.items() if value is not None}
    if given and scheduler != SLURM:
        flags = " ".join(f"--{flag} {value}" for flag, value in given.items())
        raise BadInput(f"{flags}: Slurm's, and this job starts over SSH, outside any queue; drop "
                       f"{'them' if len(given) > 1 else 'it'} or run the job through Slurm (--scheduler slurm)")
    for flag, value in given.items():
        if not SLURM_NAME.fullmatch(value):
            raise BadInput(f"--{flag} {value!r}: give a Slurm {QUEUE_FLAGS[flag]} name (letters, digits, '_', '.', '-')")
    return tuple(given.items())


def time_limit(seconds: float) -> str:
    """sbatch --time as hours:minutes:seconds, rounded up to a whole second."""
    whole = max(1, math.ceil(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


# A port a job listens on that another job on the same node must not: torchrun's rendezvous.
# Picked as the job starts, from its Slurm job id, in a range of its own below Linux's ephemeral
# ports (32768 and up, where outgoing connections get theirs): two jobs running on a node at once
# get the same one only if their ids are a multiple of the range apart. Picked while the job is
# staged instead, two jobs queued at once were given the same free port, and the second to start
# failed on it (and a port free at staging may be taken hours later, when the job starts).
RENDEZVOUS_PORTS = (20000, 5000)  # (first, count)
# The same for the sshd of a --docker job's containers, which share their node's network.
CONTAINER_SSH_PORTS = (25000, 5000)


def job_port_expression(ports: tuple[int, int]) -> str:
    """The shell arithmetic, in a batch script, of the job's port in `ports` ((first, count))."""
    first, count = ports
    return f"$(({first} + SLURM_JOB_ID % {count}))"


@dataclass(frozen=True)
class BatchJob:
    """What one sbatch script asks Slurm for and runs: built by pycli.jobs.slurm_queue from a job's plan."""

    name: str  # the job's name in the queue
    nodes: tuple[str, ...]  # exactly these nodes, the plan's (the job's files are staged there)
    tasks_per_node: int  # the most ranks the plan puts on one node: what Slurm reserves on each
    workdir: str  # the job's folder on every node
    output: str  # where the batch step writes the job's output, on the first node of the allocation
    steps: tuple[tuple[str, str], ...]  # (node, shell line): one line, or one per node (torchrun)
    time_limit_s: float | None = None
    gpus_per_node: int = 0  # gres gpu per node: --gpus-per-node, else one per rank on GPU nodes
    queue: tuple[tuple[str, str], ...] = ()  # (flag, value): --account, --qos, --partition as given (queue_options)
    comment: str = ""  # the pycli job id, kept in Slurm's accounting (sacct -o Comment)
    job_id_env: str = ""  # a variable the script sets to the Slurm job id for its steps (torchrun's rendezvous id)
    # (variable, address): the script sets the variable to ADDRESS:PORT, PORT the job's own (job_port_expression),
    # for its steps (torchrun's rendezvous endpoint)
    rendezvous_env: tuple[str, str] | tuple[()] = ()
    ssh_port_env: str = ""  # a variable the script sets to the job's own sshd port (--docker: its containers')
    elastic: bool = False  # --elastic: the job keeps its allocation when a node fails; the launcher goes on without it
    setup: str = ""  # a shell line run first, as a step of one task on every node (--docker: the job's containers)


def sbatch_script(job: BatchJob) -> str:
    """The batch script: readable, and submittable by hand (`sbatch FILE` on a node)."""
    options = [
        f"--job-name={job.name}",
        f"--nodes={len(job.nodes)}",
        f"--nodelist={','.join(job.nodes)}",
        f"--ntasks-per-node={job.tasks_per_node}",
        f"--chdir={job.workdir}",
        f"--output={job.output}",
    ]
    if job.gpus_per_node:
        options.append(f"--gres=gpu:{job.gpus_per_node}")
    options += [f"--{flag}={value}" for flag, value in job.queue]
    if job.time_limit_s is not None:
        options.append(f"--time={time_limit(job.time_limit_s)}")
    if job.comment:
        options.append(f"--comment={job.comment}")
    if job.elastic:
        options.append("--no-kill")
    # pycli owns a job's restarts (--max-restarts): Slurm must never run it a second time by itself
    # (a node lost under it, a prolog that drained a node), into the same job folder, unwatched.
    options.append("--no-requeue")
    lines = [
        "#!/bin/bash",
        "# Written by 'pycli train'; submit it again by hand from any node with 'sbatch THIS_FILE'.",
        "# The job's files are in its folder on each node listed (pycli staged them there).",
        *(f"#SBATCH {shlex.quote(option)}" for option in options),
        "set -u",
    ]
    if job.job_id_env:
        lines.append(f'export {job.job_id_env}="slurm-$SLURM_JOB_ID"')
    if job.ssh_port_env:
        lines.append(f'export {job.ssh_port_env}="{job_port_expression(CONTAINER_SSH_PORTS)}"')
    if len(job.rendezvous_env) == 2:
        variable, address = job.rendezvous_env
        lines.append(f'export {variable}={shlex.quote(address)}:"{job_port_expression(RENDEZVOUS_PORTS)}"')
    if job.setup:  # a failure on any node ends the job with its code, before the launcher
        lines.append(f"srun --ntasks-per-node=1 --ntasks={len(job.nodes)} --kill-on-bad-exit=1 "
                     f"bash -c {shlex.quote(job.setup)} || exit $?")
    if len(job.steps) == 1:
        lines.append(job.steps[0][1])
        return "\n".join(lines) + "\n"
    # One launcher per node (torchrun): one task per node, each running its node's own line,
    # with every CPU the job has on the node (a task gets one by default, and where Slurm
    # confines tasks to their CPUs the launcher's ranks would all share it), unbound: the
    # launcher's ranks share them as they do when started over SSH.
    task = '--cpus-per-task="$SLURM_CPUS_ON_NODE" --cpu-bind=none'
    if not job.elastic:
        cases = "".join(f"  {shlex.quote(node)}) {line} ;;\n" for node, line in job.steps)
        per_node = f'case "$SLURMD_NODENAME" in\n{cases}  *) echo "no line for $SLURMD_NODENAME" >&2; exit 2 ;;\nesac'
        lines.append(f"srun --ntasks-per-node=1 --ntasks={len(job.steps)} {task} --kill-on-bad-exit=1 "
                     f"bash -c {shlex.quote(per_node)}")
        return "\n".join(lines) + "\n"
    # --elastic: a step of its own on each node, so that a node's failure ends only its step; the
    # job ends as the launcher on the first node (the rendezvous host) does, as over SSH. The
    # others get a moment to finish with it.
    step = f"srun --nodes=1 --ntasks=1 {task} --no-kill --kill-on-bad-exit=0 --nodelist"
    lines += [f"{step}={shlex.quote(node)} bash -c {shlex.quote(line)} &" for node, line in job.steps[1:]]
    first, line = job.steps[0]
    lines += [
        f"{step}={shlex.quote(first)} bash -c {shlex.quote(line)}",
        "code=$?",
        f"for _ in $(seq {ELASTIC_GRACE_S}); do [ -z \"$(jobs -rp)\" ] && break; sleep 1; done",
        "exit $code",
    ]
    return "\n".join(lines) + "\n"


def submit_command(workdir: str) -> str:
    """sbatch reading the script from stdin, in the job's folder; prints the job id alone."""
    return f"cd {shlex.quote(workdir)} && sbatch --parsable"


def parse_job_id(stdout: str) -> str:
    """The job id from `sbatch --parsable` ("ID" or "ID;CLUSTER")."""
    for line in stdout.splitlines():
        first = line.strip().split(";")[0]
        if first.isdigit():
            return first
    raise ValueError(f"sbatch printed no job id: {stdout.strip()[:200]!r}")


def submit_refusal(stderr: str) -> str:
    """Why sbatch refused a job, in one line: its error lines joined, without their "sbatch: error: "
    (over a QOS or association limit, Slurm's reason, QOSMaxGRESPerUser say, comes on the line
    before "Batch job submission failed: ..."); empty where sbatch printed no error line."""
    said = [line.strip()[len("sbatch: error:"):].strip() for line in stderr.splitlines()
            if line.strip().startswith("sbatch: error:")]
    return ": ".join(line for line in said if line)


def job_comment(pycli_job_id: str) -> str:
    """The comment every job pycli submits carries (sacct -o Comment, squeue %k): pycli's own job id."""
    return f"pycli job {pycli_job_id}"


def comments_command() -> str:
    """squeue's job ids with their comments, '|'-separated, every user's."""
    return "squeue -h -a -o '%i|%k'"


def with_comment(stdout: str, comment: str) -> list[str]:
    """The ids of comments_command's jobs whose comment is `comment`."""
    return [job_id for job_id, _, said in (line.partition("|") for line in stdout.splitlines())
            if said.strip() == comment and job_id.strip().isdigit()]


def cancel_command(job_id: str) -> str:
    return f"scancel {shlex.quote(job_id)}"


# What squeue says when slurmctld no longer knows a job (purged after MinJobAge): the job is gone.
# Any other failure (slurmctld restarting, not answering) says nothing of the job.
UNKNOWN_JOB = "Invalid job id specified"


def _while_queued(job_id: str, fields: str, on_state: str, on_error: str, interval_s: float) -> str:
    """A shell loop that runs while the job's processes have not ended: each answer of squeue (`-t
    all`, so a finished job is seen with its final state) is in $s for `on_state`; a failed squeue
    is in $s for `on_error`, and the loop goes on. It ends only on an answer: the job listed in one
    of FINISHED_STATES or COMPLETING, not listed, or unknown to slurmctld (UNKNOWN_JOB). What squeue
    says on stderr (a warning beside an answer) is kept out of the answer ($e, read on a failure)."""
    quoted = shlex.quote(job_id)
    return ("e=$(mktemp) || exit 1; trap 'rm -f \"$e\"' EXIT; "
            f"while :; do if s=$(squeue -h -t all -j {quoted} -o '{fields}' 2>\"$e\"); then [ -z \"$s\" ] && break; {on_state}; "
            f"case ${{s%%|*}} in {'|'.join((*FINISHED_STATES, COMPLETING))}) break;; esac; "
            f"else s=$(cat \"$e\"); case $s in *{shlex.quote(UNKNOWN_JOB)}*) break;; esac; {on_error}; fi; "
            f"sleep {interval_s:g}; done")


def watch_command(job_id: str, interval_s: float = 1.0) -> str:
    """On a node: a line "@@slurm STATE|REASON|BATCHHOST|NODES" at every change while the job's
    processes run, "@@slurm-unanswered WHAT-SQUEUE-SAID" when squeue fails (slurmctld restarting:
    the watch goes on), then "@@slurm gone". Only an answer of Slurm's ends it (_while_queued): a
    job is never taken for ended, and its processes swept, while slurmctld is away. Its last line
    before "gone" is COMPLETING where Slurm still cleans up, NODES the nodes it waits for."""
    return ("last=; " + _while_queued(
        job_id, "%T|%r|%B|%N",
        on_state='[ "$s" != "$last" ] && echo "@@slurm $s" && last=$s',
        on_error='[ "$s" != "$last" ] && echo "@@slurm-unanswered $(printf \'%s\\n\' "$s" | tail -n 1)" && last=$s',
        interval_s=interval_s) + "; echo '@@slurm gone'")


def unanswered(line: str) -> str | None:
    """What squeue said in a watch_command line that reports a failed squeue; None for any other line."""
    return line[len("@@slurm-unanswered "):].strip() if line.startswith("@@slurm-unanswered ") else None


# A job's pending reason that is a limit of its QOS or association (AccountingStorageEnforce
# with limits): QOSMaxGRESPerUser, AssocGrpGRES, QOSMaxWallDurationPerJobLimit, ...
LIMIT_NOTE = "held by a limit of its QOS or account"


def held_by_limit(reason: str) -> bool:
    return reason.startswith(("QOS", "Assoc")) and reason not in ("QOSNotAllowed", "AssocNotAllowed")


def never_starts(reason: str) -> bool:
    """A pending reason that holds the job for good: it alone is over a per-job limit of its QOS or
    association, or its partition's time or node limit, so no other job's end lets it start (a QOS
    with the DenyOnLimit flag refuses such a job at sbatch instead)."""
    return (held_by_limit(reason) and "PerJob" in reason) or reason in ("PartitionTimeLimit", "PartitionNodeLimit")


def requeued_held(reason: str) -> bool:
    """Slurm put the job back in the queue held (a prolog that failed: "launch failed requeued
    held"); it waits for an administrator's release, for good. pycli's jobs ask for --no-requeue,
    so only a job requeued by hand gets here."""
    return "requeued held" in reason.replace("_", " ").lower()


def held_for_good(reason: str, alone: bool = False) -> str | None:
    """Why a pending job with `reason` will never start, for the line that says it was cancelled;
    None where it may yet. `alone`: no other job of its user runs, so a per-user limit of its QOS
    or association (QOSMaxGRESPerUser, ...) that it is over is over by this job alone."""
    if never_starts(reason):
        return f"{reason}: over a per-job limit of its QOS, account or partition"
    if alone and held_by_limit(reason) and "PerUser" in reason:
        return f"{reason}: over a per-user limit of its QOS or account by itself, no other job of its user running"
    return None


def users_running_command(job_id: str) -> str:
    """The ids of the running jobs of `job_id`'s user (none: a per-user limit it waits on is its own)."""
    return f"squeue -h -t running,completing -u \"$(squeue -h -j {shlex.quote(job_id)} -o %u)\" -o %i"


@dataclass(frozen=True)
class QueueState:
    state: str  # PENDING, RUNNING, COMPLETING, ...
    reason: str  # why pending (Resources, Priority, ReqNodeNotAvail, ...) or "None"
    batch_host: str  # the node running the batch script (empty while pending)
    nodes: str  # the allocation (empty while pending)


def parse_watch_line(line: str) -> QueueState | None:
    """A watch_command line; None for "gone" or anything else."""
    if not line.startswith("@@slurm ") or line.strip() == "@@slurm gone":
        return None
    parts = line[len("@@slurm "):].strip().split("|")
    if len(parts) != 4:
        return None
    state, reason, batch_host, nodes = parts
    return QueueState(state, printable(reason), "" if batch_host in ("n/a", "(null)") else batch_host, nodes)


def output_command(path: str, job_id: str, interval_s: float = 1.0, from_line: int = 1) -> str:
    """On the batch host: the job's output file from line `from_line` (a watch that lost its
    connection goes on where it was), followed while Slurm has the job (_while_queued: a moment
    without slurmctld does not end it), and a moment more for the last lines."""
    return (f"tail -n +{max(1, from_line)} -F {shlex.quote(path)} 2>/dev/null & t=$!; "
            + _while_queued(job_id, "%T", on_state=":", on_error=":", interval_s=interval_s)
            + "; sleep 1; kill $t; wait $t 2>/dev/null; exit 0")


def sacct_command(job_ids: Sequence[str] = (), *, since: str | None = None, all_users: bool = True) -> str:
    """sacct's allocations (no steps), '|'-separated, the fields of SACCT_FIELDS."""
    words = ["sacct", "-X", "-n", "-P", "-o", ",".join(SACCT_FIELDS)]
    if job_ids:
        words += ["-j", ",".join(job_ids)]
    if since:
        words += ["-S", since]
    if all_users:
        words.append("-a")
    return " ".join(shlex.quote(word) for word in words)


@dataclass(frozen=True)
class AccountedJob:
    """One job as sacct keeps it."""

    job_id: str
    name: str
    user: str
    state: str  # COMPLETED, FAILED, CANCELLED, TIMEOUT, ...; "CANCELLED by 0" shortened to CANCELLED
    exit_code: int
    signal: int
    submit: str
    start: str
    elapsed: str
    nodes: str
    reason: str

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    def as_json(self) -> dict[str, object]:
        return {"job_id": self.job_id, "name": self.name, "user": self.user, "state": self.state,
                "exit_code": self.exit_code, "signal": self.signal, "submit": self.submit, "start": self.start,
                "elapsed": self.elapsed, "nodes": self.nodes, "reason": self.reason}


def parse_sacct(stdout: str) -> list[AccountedJob]:
    """Lines of sacct_command's output; lines that are not a job's are left out."""
    jobs = []
    for line in stdout.splitlines():
        parts = line.split("|", len(SACCT_FIELDS) - 1)
        if len(parts) != len(SACCT_FIELDS) or not re.match(r"^\d+", parts[0]):
            continue
        values = dict(zip(SACCT_FIELDS, parts, strict=True))
        code, _, signal = values["ExitCode"].partition(":")
        jobs.append(AccountedJob(
            job_id=values["JobID"], name=printable(values["JobName"]), user=values["User"],
            state=values["State"].split()[0] if values["State"] else "", exit_code=int(code) if code.isdigit() else 0,
            signal=int(signal) if signal.isdigit() else 0, submit=values["Submit"], start=values["Start"],
            elapsed=values["Elapsed"], nodes=values["NodeList"], reason=values["Reason"],
        ))
    return jobs


def scontrol_job_command(job_id: str) -> str:
    """slurmctld's own record of a job (kept MinJobAge after it ends): where sacct has none."""
    return f"scontrol show job -o {shlex.quote(job_id)}"


def parse_scontrol_job(stdout: str, job_id: str) -> AccountedJob | None:
    """The job of a scontrol_job_command answer, in sacct's terms; None where it is not there.
    A COMPLETING job (its processes ended, Slurm's clean-up not yet) is COMPLETED or FAILED by its
    exit code, as sacct will have it."""
    for line in stdout.splitlines():
        values = dict(re.findall(r"(\w+)=(\S*)", line))
        if values.get("JobId") != job_id:
            continue
        code, _, signal = values.get("ExitCode", "").partition(":")
        exit_code, signal_number = int(code) if code.isdigit() else 0, int(signal) if signal.isdigit() else 0
        state = values.get("JobState", "")
        if state == COMPLETING:
            state = "FAILED" if exit_code or signal_number else "COMPLETED"
        return AccountedJob(
            job_id=job_id, name=printable(values.get("JobName", "")), user=values.get("UserId", "").split("(")[0],
            state=state, exit_code=exit_code, signal=signal_number, submit=values.get("SubmitTime", ""),
            start=values.get("StartTime", ""), elapsed=values.get("RunTime", ""), nodes=values.get("NodeList", ""),
            reason=values.get("Reason", ""))
    return None


# What `pycli jobs --attach` reads of a job it follows again: where it runs and from which folder.
ATTACH_FIELDS = ("JobID", "State", "NodeList", "WorkDir")


def attach_command(job_id: str) -> str:
    """sacct's allocation line of one job, '|'-separated, the fields of ATTACH_FIELDS."""
    return shlex.join(["sacct", "-X", "-n", "-P", "-a", "-j", job_id, "-o", ",".join(ATTACH_FIELDS)])


def parse_attach(stdout: str, job_id: str) -> dict[str, str] | None:
    """The ATTACH_FIELDS of `job_id` in an attach_command answer; None where sacct does not have
    it, or not its folder yet (slurmdbd hears of a started job a moment after slurmctld)."""
    for line in stdout.splitlines():
        parts = line.strip().split("|", len(ATTACH_FIELDS) - 1)
        if len(parts) == len(ATTACH_FIELDS) and parts[0] == job_id and parts[3]:
            return dict(zip(ATTACH_FIELDS, parts, strict=True))
    return None


def parse_attach_scontrol(stdout: str, job_id: str) -> dict[str, str] | None:
    """The ATTACH_FIELDS of `job_id` from slurmctld's own record (scontrol_job_command), which a
    queued or running job has before sacct has its folder; None where it is not there."""
    for line in stdout.splitlines():
        values = dict(re.findall(r"(\w+)=(\S*)", line))
        if values.get("JobId") == job_id and values.get("WorkDir"):
            return {"JobID": job_id, "State": values.get("JobState", ""), "NodeList": values.get("NodeList", ""),
                    "WorkDir": values["WorkDir"]}
    return None


def squeue_command() -> str:
    return f"squeue -h -o {shlex.quote(SQUEUE_FORMAT)}"


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    name: str
    user: str
    state: str
    reason: str
    node_count: int
    nodes: str
    batch_host: str

    def as_json(self) -> dict[str, object]:
        return {"job_id": self.job_id, "name": self.name, "user": self.user, "state": self.state, "reason": self.reason,
                "node_count": self.node_count, "nodes": self.nodes}


def parse_squeue(stdout: str) -> list[QueuedJob]:
    jobs = []
    for line in stdout.splitlines():
        parts = line.split("|", 7)
        if len(parts) != 8 or not parts[0].strip():
            continue
        job_id, user, state, reason, count, nodes, batch, name = parts
        jobs.append(QueuedJob(job_id, printable(name), user, state, printable(reason), int(count) if count.isdigit() else 0,
                              nodes, batch))
    return jobs


def running_jobs_by_node(jobs: Sequence[QueuedJob]) -> dict[str, list[str]]:
    """Node name -> the ids of the RUNNING jobs on it (squeue's nodes expanded)."""
    on: dict[str, list[str]] = {}
    for job in jobs:
        if job.state.upper() == "RUNNING":
            for node in expand_hostlist(job.nodes):
                on.setdefault(node, []).append(job.job_id)
    return on


# `pycli check` on a cluster with Slurm holds the idle nodes it measures for its whole run: one
# exclusive allocation without a shell (no job of anyone else's starts there meanwhile), given
# this long to be granted and at most this long to last (a check that dies releases them then).
HOLD_NAME_PREFIX = f"{JOB_NAME_PREFIX}check-"
HOLD_GRANT_S = 30
HOLD_LIMIT_S = 3600


def hold_command(nodes: Sequence[str], name: str, limit_s: float = HOLD_LIMIT_S, grant_s: int = HOLD_GRANT_S,
                 what: str = "check", partition: str | None = None) -> str:
    """salloc of exactly `nodes`, whole (--exclusive), returning once granted (--no-shell), or
    failing after `grant_s` seconds where the nodes are not free by then; `what` holds them
    (pycli check, pycli bench). In `partition`, which holds them all (None: the default one)."""
    where = [f"--partition={partition}"] if partition else []
    return shlex.join(["salloc", "--no-shell", "--exclusive", *where, f"--nodes={len(nodes)}",
                       f"--nodelist={','.join(nodes)}", f"--job-name={name}", f"--time={time_limit(limit_s)}",
                       f"--immediate={grant_s}", f"--comment=pycli {what}: the nodes it measures, held"])


def parse_granted(text: str) -> str | None:
    """The job id of salloc's "Granted job allocation N" (it says so on stderr); None without it."""
    found = re.search(r"Granted job allocation (\d+)", text)
    return found.group(1) if found else None


def cancel_by_name_command(name: str) -> str:
    """scancel of the jobs named `name`: a hold whose id pycli never read (Ctrl-C while salloc ran)."""
    return f"scancel --name={shlex.quote(name)}"
