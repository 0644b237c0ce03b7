"""`pycli train`: a distributed job across the cluster's nodes, started on the launcher node.

`plan_job` checks a `JobRequest` against the cluster and decides every host and path (pure;
the command lines come from pycli.jobs.launch); staging, containers and collecting results
go through playbooks and the one runner adapter; the job itself runs over OpenSSH
(pycli.cluster.nodes) with the inventory's own connection settings, its output streamed line by line.
`run_job` does all of it: `pycli train`, the allreduce gate of `pycli check` and every run of
`pycli bench` call it, each with a `JobRequest` (pycli/jobs/request.py).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from pycli.cluster import runner
from pycli.cluster.hostfiles import fill_slots, render_hostfile
from pycli.cluster.model import INTERFACE_VAR, JOBS_KEPT_VAR, NODE_GATE_VAR, Cluster, interface_problem
from pycli.core.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    BadInput,
    PycliError,
    notice,
    renamed_line,
    warn,
)
from pycli.core.paths import WORKLOADS_DIR, cache_dir, new_run_dir
from pycli.jobs import containers
from pycli.jobs import files as job_files
from pycli.jobs import trust as job_trust
from pycli.jobs.files import content_digest, jobs_kept
from pycli.jobs.launch import (
    LAUNCHERS,
    METRICS_FILE,
    JobPlan,
    NodeLayout,
    check_controller,
    host_discovery_script,
    job_process_pattern,
    launch_commands,
    slurm_ssh_script,
)
from pycli.jobs.processes import JobExit
from pycli.jobs.request import JobRequest
from pycli.jobs.restarts import plan_restart
from pycli.jobs.runners import runner_for
from pycli.jobs.slurm import SLURM, choose_scheduler, queue_options

# Built-in workloads: script, the launchers that can start it, whether it reads IDX data.
WORKLOADS = {
    "mnist": ("mnist.py", ("horovod", "mpirun"), True),
    "ddp": ("ddp.py", ("torchrun",), True),
    "synthetic": ("synthetic.py", ("horovod", "mpirun", "torchrun"), False),
}
DEFAULT_LAUNCHER = {"mnist": "horovod", "ddp": "torchrun", "synthetic": "horovod"}
# What --env may set: an environment variable's name as the shell takes it.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The built-in workloads that go on through lost ranks (workloads/elastic.py).
ELASTIC_WORKLOADS = ("mnist", "ddp")


def new_job_id(now: datetime | None = None) -> str:
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{os.getpid()}"


def plan_job(cluster: Cluster, request: JobRequest, *, layout: NodeLayout, job_id: str) -> JobPlan:
    """Check the request against the cluster and decide every path and host: no side effects."""
    np, workload, launcher = request.placement.np, request.launch.workload, request.launch.launcher
    data_dir, resume = request.data.data_dir, request.data.resume
    check_controller(request.launch.controller)
    if launcher is not None and launcher not in LAUNCHERS:
        raise BadInput(f"unknown --launcher {launcher!r}; use one of {', '.join(LAUNCHERS)}")
    if workload in WORKLOADS:
        script_name, launchers, needs_data = WORKLOADS[workload]
        script = WORKLOADS_DIR / script_name
        launcher = launcher or DEFAULT_LAUNCHER[workload]
        if launcher not in launchers:
            hint = " (use the ddp workload for torchrun)" if workload == "mnist" else ""
            raise BadInput(f"workload {workload!r} runs under {' or '.join(launchers)}, not {launcher}{hint}")
    elif workload.endswith(".py") or "/" in workload:
        script = Path(workload)
        if not script.is_file():
            raise BadInput(f"script {workload} does not exist")
        needs_data = data_dir is not None
        launcher = launcher or "horovod"
    else:
        raise BadInput(f"unknown workload {workload!r}; use one of {', '.join(WORKLOADS)} or a path to a .py script")
    if data_dir is not None and not data_dir.is_dir():
        raise BadInput(f"--data-dir {data_dir} is not a folder")
    if request.queue.time_limit_s is not None and request.queue.time_limit_s <= 0:
        raise BadInput(f"--time-limit {request.queue.time_limit_s:g}: give the job's time limit in seconds, more than 0")
    if request.recovery.max_restarts < 0:
        raise BadInput(f"--max-restarts {request.recovery.max_restarts}: give how often a failed job starts again, 0 or more")
    if request.recovery.min_np is not None and not (request.recovery.max_restarts or request.recovery.elastic):
        raise BadInput("--min-np says how few ranks a job may go on with; it needs --max-restarts or --elastic")
    if request.recovery.elastic:
        if launcher == "mpirun" or (launcher == "horovod" and request.launch.controller != "gloo"):
            raise BadInput("--elastic is horovodrun's elastic mode (with its gloo controller) or torchrun's; "
                           "mpirun jobs go on after a loss with --max-restarts --min-np")
        if workload in WORKLOADS and workload not in ELASTIC_WORKLOADS:
            raise BadInput(f"--elastic works with the {' and '.join(ELASTIC_WORKLOADS)} workloads or a script that "
                           f"keeps its state in hvd.elastic objects (horovodrun) or its own checkpoint (torchrun), "
                           f"not {workload}")
        if request.container is not None:
            raise BadInput("--elastic does not work with --docker yet")
    request = _elastic_restarts(request, launcher)
    if request.recovery.min_np is not None and not 1 <= request.recovery.min_np <= np:
        raise BadInput(f"--min-np {request.recovery.min_np}: give a number of ranks from 1 to --np {np}")
    if request.recovery.max_restarts and request.container is not None:
        raise BadInput("--max-restarts does not work with --docker yet: restart the job with --resume")
    scheduler = choose_scheduler(request.queue.scheduler, cluster.has_slurm)
    queue_options(request.queue.flags, scheduler)
    if request.placement.gpus_per_node is not None and request.placement.gpus_per_node < 0:
        raise BadInput(f"--gpus-per-node {request.placement.gpus_per_node}: give the GPUs the job gets on each node, 0 or more")
    if scheduler == SLURM and request.container is not None and (wider := containers.wider_than_slurm(request.container)):
        raise BadInput(wider)
    if scheduler == SLURM and request.container is not None and not cluster.slurm_node_gate:
        raise BadInput(f"--docker through Slurm needs pycli's node gate, whose epilog removes a job's containers as "
                       f"the job ends, and this inventory sets {NODE_GATE_VAR} off; add --scheduler ssh, or turn it on "
                       "and run 'pycli provision --tags slurm'")
    if request.launch.threads_per_rank is not None and request.launch.threads_per_rank < 1:
        raise BadInput(f"--threads-per-rank {request.launch.threads_per_rank}: give the CPU threads of each rank, 1 or more")
    for setting in request.launch.env:
        name, equals, _ = setting.partition("=")
        if not equals or not ENV_NAME.fullmatch(name):
            raise BadInput(f"--env {setting!r}: give NAME=VALUE, NAME of letters, digits and '_' not starting with a digit")
    if request.launch.autotune and launcher != "horovod":
        raise BadInput(f"--autotune is horovodrun's; this job runs under {launcher}")
    if resume is not None and not resume.is_file():
        raise BadInput(f"--resume {resume} does not exist")
    if resume is not None and workload not in ("mnist", "ddp"):
        raise BadInput("--resume works with the mnist and ddp workloads")
    network_interface, interface_source = request.placement.network_interface, "--network-interface"
    if not network_interface:
        network_interface, interface_source = cluster.settings.get(INTERFACE_VAR) or None, INTERFACE_VAR
    if network_interface is not None and (why := interface_problem(str(network_interface))) is not None:
        raise BadInput(f"{interface_source} {why}")
    hosts = fill_slots(cluster, np)
    # The launcher node starts the job and rank 0 lives there: put it first.
    launcher_host = cluster.launcher_host
    if any(h.name == launcher_host.name for h in hosts):
        hosts = (next(h for h in hosts if h.name == launcher_host.name),
                 *(h for h in hosts if h.name != launcher_host.name))
    if launcher == "horovod":
        render_hostfile(hosts, "horovod")  # refuses what horovodrun would misread
    job_process_pattern(layout.work_dir / job_id)  # refuses a work folder a pattern cannot name
    return JobPlan(
        # Frozen all the way down: a caller's lists become tuples.
        request=request.with_(script_args=tuple(request.launch.script_args), env=tuple(request.launch.env)),
        job_id=job_id, launcher=launcher, np=np, hosts=hosts, script=script, layout=layout,
        network_interface=network_interface,
        data_dir=data_dir if needs_data else None, resume=resume,
        elastic_min_np=(request.recovery.min_np or np) if request.recovery.elastic else None,
        data_digest=content_digest(data_dir) if needs_data and data_dir is not None else None,
        jobs_kept=jobs_kept(cluster.settings.get(JOBS_KEPT_VAR)),
        nodes_share_cpus=cluster.nodes_share_cpus, slurm=scheduler == SLURM,
    )


def _elastic_restarts(request: JobRequest, launcher: str) -> JobRequest:
    """--max-restarts is pycli's restarts and --elastic-restarts torchrun's agents' ones. For one release
    (NEXT_RELEASE), --max-restarts with --elastic under torchrun still means the agents', with a notice."""
    agents = request.recovery.elastic and launcher == "torchrun"
    if request.recovery.elastic_restarts is not None:
        if not agents:
            raise BadInput("--elastic-restarts is how often torchrun's agents start the ranks again under --elastic; "
                           f"this job runs under {launcher}{'' if request.recovery.elastic else ' without --elastic'}: "
                           "pycli's own restarts are --max-restarts")
        if request.recovery.elastic_restarts < 0:
            raise BadInput(f"--elastic-restarts {request.recovery.elastic_restarts}: give how often the agents start the ranks "
                           "again, 0 or more")
    if agents and request.recovery.max_restarts:
        if request.recovery.elastic_restarts is not None:
            raise BadInput("--max-restarts with --elastic under torchrun: its agents restart the ranks "
                           "(--elastic-restarts) and pycli does not start the job again on top; leave out --max-restarts")
        notice(renamed_line("train --max-restarts with --elastic under torchrun", "--elastic-restarts (its agents' restarts)"))
        return request.with_(max_restarts=0, elastic_restarts=request.recovery.max_restarts)
    return request


def stage(plan: JobPlan, run_dir: Path, container_files: Path | None = None) -> JobPlan:
    """The job's files on every node of it (pycli.jobs.files); --elastic jobs get their host
    discovery script too, and horovodrun through Slurm its own ssh."""
    discovery = slurm_ssh = None
    if plan.elastic_min_np is not None:
        discovery = run_dir / plan.discovery_script.name
        discovery.write_text(host_discovery_script(plan))
        discovery.chmod(0o755)  # staged with its mode
    if plan.logins_as_steps:
        slurm_ssh = run_dir / plan.slurm_ssh_dir.name
        slurm_ssh.mkdir(exist_ok=True)
        (slurm_ssh / "ssh").write_text(slurm_ssh_script(plan))
        (slurm_ssh / "ssh").chmod(0o755)
    return job_files.stage(plan, run_dir, container_files, discovery, slurm_ssh)


def strays_line(left: dict[str, str]) -> str:
    """What pycli says of the job's processes after it: none left, or which are left where."""
    if not left:
        return "no process of it is left on any node"
    return "processes of it may be left: " + "; ".join(
        f"{host}: {' | '.join(text.splitlines()) or 'not checked'}" for host, text in sorted(left.items()))


def workload_needs_data(workload: str) -> bool:
    return workload in WORKLOADS and WORKLOADS[workload][2]


def read_metrics(results: Path) -> list[dict[str, Any]]:
    """The job's metrics records (rank 0's metrics.jsonl), oldest first."""
    metrics = results / METRICS_FILE
    if not metrics.exists():
        return []
    records, skipped = [], []
    for number, line in enumerate(metrics.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:  # a rank killed mid-write leaves half a line
            skipped.append(number)
    if skipped:
        warn(f"{metrics}: skipped {len(skipped)} line(s) that are not a JSON record (first: line {skipped[0]})")
    return records


def summary_line(records: Sequence[Mapping[str, Any]]) -> str | None:
    """The last metrics record of the job, as one line."""
    if not records:
        return None
    last = records[-1]
    keys = ("epoch", "train_loss", "val_loss", "val_accuracy", "samples_per_s", "total_img_per_s")
    return ", ".join(f"{k} {last[k]:.4g}" if isinstance(last[k], float) else f"{k} {last[k]}" for k in keys if k in last)


@dataclass(frozen=True)
class TrainOutcome:
    code: int  # the design's exit code: 0 ok, 1 the job failed, 130 interrupted
    run_dir: Path
    results: Path
    records: tuple[dict[str, Any], ...]
    plan: JobPlan


def layout_of(cluster: Cluster) -> NodeLayout:
    """Where the roles put the venv and the work folder on this cluster's nodes."""
    return NodeLayout.from_settings(cluster.settings)


def job_record(plan: JobPlan) -> str:
    """The run folder's job.txt: the job, its hosts, and the line each launching node runs, the
    credentials of any URL in them (an --env proxy's password) masked."""
    lines = [f"job {plan.job_id}", f"hosts {','.join(h.name for h in plan.hosts)}",
             *(f"{host.name}: {line}" for host, line in launch_commands(plan))]
    return "".join(runner.mask_url_credentials(line) + "\n" for line in lines)


def run_job(
    cluster: Cluster,
    request: JobRequest,
    *,
    write: Callable[[str], None] = print,
    run_dir: Path | None = None,
) -> TrainOutcome:
    """Plan, stage, run and collect one job on `cluster`; `run_dir` defaults to a new runs/<time>-train/.

    `cluster` may be one changed in memory (fewer slots, no network interface): the plan
    follows its hosts, and playbooks run against the inventory it was read from."""
    from pycli.jobs.datasets import digits_dataset

    if request.data.data_dir is None and workload_needs_data(request.launch.workload):
        request = request.with_(data_dir=digits_dataset(cache_dir()))
    plan = plan_job(cluster, request, layout=layout_of(cluster), job_id=new_job_id())  # bad input before any node
    run_dir = run_dir or new_run_dir("train")
    run_dir.mkdir(parents=True, exist_ok=True)
    runs = runner_for(cluster, request, run_dir, write)  # over SSH or through Slurm, asked nothing else of the mode
    if (usable := runs.nodes(cluster)) is not cluster:
        plan = plan_job(usable, request, layout=layout_of(usable), job_id=plan.job_id)
    inventory = cluster.inventory_path
    container = plan.request.container
    how = f"horovodrun --{plan.request.launch.controller}" if plan.launcher == "horovod" else plan.launcher
    if plan.elastic_min_np is not None:
        how += f" --elastic (going on with at least {plan.elastic_min_np} rank(s))"
    inside = f" inside {container.image} containers" if container else ""
    inside += " through Slurm's queue" if plan.slurm else ""
    write(f"pycli: job {plan.job_id}: {plan.np} process(es) on {', '.join(h.name for h in plan.hosts)} "
          f"via {how}{inside}; run folder {run_dir}")
    container_files = None
    if container is not None:
        container_files = run_dir / "container"
        containers.write_container_files(container_files, plan.hosts, container, plan.job_id, plan.slurm)
    try:
        plan = stage(plan, run_dir, container_files)
    except job_trust.Untrusted as error:
        raise PycliError(error.line(inventory)) from None  # before any rank: no restart spent on it
    except BaseException:
        if container is not None:
            runs.containers_down(plan)  # the job's keys may be on some nodes already
        raise
    finally:
        if container_files is not None:
            containers.forget_private_keys(container_files)
    (run_dir / "job.txt").write_text(job_record(plan))
    ended: JobExit | None = None
    try:
        if container is not None:
            write(runs.containers_up(plan))
        started = time.monotonic()  # the job's own time, as without containers
        ended = runs.attempt(plan, request.queue.time_limit_s, 0)
        for number in range(1, 0 if plan.restarts_by_agents else request.recovery.max_restarts + 1):
            if ended.code in (0, EXIT_INTERRUPTED) or ended.timed_out or ended.final or ended.detached:
                break
            # Ask first, so a node that is gone costs one SSH timeout, not an Ansible one too.
            after = plan_restart(plan)
            if isinstance(after, str):
                write(f"pycli: no restart: {after}")
                break
            job_files.stop_strays(replace(plan, hosts=after.answering))  # what the failed attempt left
            write(after.line(number, request.recovery.max_restarts, ended.why))
            plan = after.plan
            limit_s = request.queue.time_limit_s
            left_s = None if limit_s is None else max(1.0, limit_s - (time.monotonic() - started))
            ended = runs.attempt(plan, left_s, number)
        code = ended.code
    finally:
        # A job pycli lost sight of goes on (in Slurm): its containers and processes are its own.
        if ended is None or not ended.detached:
            if container is not None:
                runs.containers_down(plan)
            left = job_files.stop_strays(plan)
    took = time.monotonic() - started
    if ended.detached:  # the runner lost sight of its newest attempt, which goes on
        write(f"pycli: {ended.why}: {runs.follow_line()}")
        return TrainOutcome(code, run_dir, run_dir / "results", (), plan)
    results = run_dir / "results"
    if code == EXIT_INTERRUPTED:
        write(f"pycli: job interrupted after {took:.0f} s; {strays_line(left)}")
        return TrainOutcome(code, run_dir, results, (), plan)
    if left:
        write(f"pycli: {strays_line(left)}")
    job_files.collect(plan, results, gone={name for name, why in left.items() if why == job_files.UNSWEPT})
    records = tuple(read_metrics(results))
    summary = summary_line(records)
    if code == 0:
        write(f"pycli: job finished in {took:.0f} s{': ' + summary if summary else ''}; results in {results}")
    else:
        write(f"pycli: job failed (exit {code}{'; ' + ended.why if ended.why else ''}) after {took:.0f} s; "
              f"output above, partial results in {results}")
        code = EXIT_FAILED
    return TrainOutcome(code, run_dir, results, records, plan)
