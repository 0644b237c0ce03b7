"""`pycli train`: a distributed training job on the cluster's nodes."""

from __future__ import annotations

from pathlib import Path

import typer

from pycli.cli.options import INVENTORY_OPTION
from pycli.jobs.containers import DEFAULT_JOB_SSH_PORT
from pycli.jobs.request import DEFAULT_CONTROLLER


def train_cmd(
    workload: str | None = typer.Argument(
        None, help="mnist (Horovod, the default), ddp (torchrun), synthetic, or a path to a .py script; "
        "an inventory may come before it.", show_default=False,
    ),
    script_args: list[str] = typer.Argument(None, help="Arguments for the workload, after '--'."),
    np: int = typer.Option(..., "--np", help="Number of processes (ranks) in all."),
    inventory: Path | None = INVENTORY_OPTION,
    launcher: str | None = typer.Option(None, "--launcher", help="horovod (horovodrun), mpirun or torchrun."),
    controller: str = typer.Option(DEFAULT_CONTROLLER, "--controller", help="horovodrun's controller: gloo or mpi."),
    network_interface: str | None = typer.Option(
        None, "--network-interface", help="NIC the ranks talk over (default: inventory's pycli_network_interface)."
    ),
    data_dir: Path | None = typer.Option(None, "--data-dir", help="Folder of MNIST IDX files (default: the 8x8 digits)."),
    resume: Path | None = typer.Option(None, "--resume", help="Checkpoint (from an earlier run's results) to continue from."),
    time_limit: float | None = typer.Option(
        None, "--time-limit", metavar="SECONDS",
        help="The job's wall-clock limit: stop it on every node after this long (staging and results not counted)."
    ),
    max_restarts: int = typer.Option(
        0, "--max-restarts", help="pycli starts a failed job again up to N times, from the newest checkpoint on the nodes."
    ),
    elastic_restarts: int | None = typer.Option(
        None, "--elastic-restarts", metavar="N", help="With --elastic under torchrun: how often its agents start the "
        "ranks again (default 3).", show_default=False,
    ),
    min_np: int | None = typer.Option(
        None, "--min-np", help="With --max-restarts or --elastic: go on with this few ranks when nodes are lost (default: --np)."
    ),
    elastic: bool = typer.Option(
        False, "--elastic", help="The launcher's elastic mode: horovodrun's (mnist) goes on with the ranks left "
        "from the last epoch; torchrun's (ddp) agents start the ranks again on the nodes left, up to "
        "--elastic-restarts times.",
    ),
    threads_per_rank: int | None = typer.Option(
        None, "--threads-per-rank", metavar="N",
        help="CPU threads of each rank (OMP_NUM_THREADS). Default: each node's cores shared out between its ranks "
        "(between all ranks when the nodes share one machine, pycli_nodes_share_cpus).",
    ),
    env: list[str] = typer.Option(
        None, "--env", metavar="NAME=VALUE",
        help="Set for every rank (repeatable), over pycli's own settings, e.g. --env HOROVOD_CYCLE_TIME=5.",
    ),
    autotune: bool = typer.Option(
        False, "--autotune",
        help="horovodrun's autotuning of its run settings; what it tried is fetched to results/autotune.csv.",
    ),
    docker: str | None = typer.Option(
        None, "--docker", metavar="IMAGE",
        help="Run every rank inside a container of IMAGE on its node (--gpus all --ipc=host, host network); "
        "IMAGE needs python, the launcher and sshd, like horovod/horovod.",
    ),
    docker_ssh_port: int | None = typer.Option(
        None, "--docker-ssh-port", help=f"Port of the sshd in each job container (the nodes' network is shared). Default: "
        f"{DEFAULT_JOB_SSH_PORT} over SSH; through Slurm a port of the job's own, so that jobs sharing a node never collide.",
        show_default=False,
    ),
    scheduler: str | None = typer.Option(
        None, "--scheduler", help="slurm: submit through Slurm's queue (sbatch; the default where the inventory has "
        "a [slurm_controller]); ssh: start the ranks over SSH, outside any queue.", show_default=False,
    ),
    gpus_per_node: int | None = typer.Option(
        None, "--gpus-per-node", metavar="N",
        help="GPUs the job gets on each of its nodes (through Slurm its --gres; over SSH the first N, as "
        "CUDA_VISIBLE_DEVICES). Default: one per rank on nodes that have GPUs.", show_default=False,
    ),
    account: str | None = typer.Option(None, "--account", help="Slurm account to charge the job to (sbatch --account).",
                                       show_default=False),
    qos: str | None = typer.Option(None, "--qos", help="Slurm QOS of the job (sbatch --qos).", show_default=False),
    partition: str | None = typer.Option(None, "--partition", help="Slurm partition to queue the job in (sbatch --partition).",
                                         show_default=False),
    docker_opt: list[str] = typer.Option(
        None, "--docker-opt", metavar="OPTIONS",
        help="More 'docker run' options for the job containers, e.g. --docker-opt='-v /data:/data' (repeatable).",
    ),
) -> None:
    """Run WORKLOAD on --np processes across the inventory's nodes, started from the launcher node.

    The inventory may come first (pycli train INVENTORY [WORKLOAD]) or with -i."""
    from pycli.cli.options import leading_inventory, load_inventory
    from pycli.cluster.drained import for_jobs
    from pycli.core.errors import BadInput, notice
    from pycli.jobs.containers import parse_job_container
    from pycli.jobs.launch import check_controller
    from pycli.jobs.request import Data, JobRequest, Launch, Placement, Queue, Recovery
    from pycli.jobs.train import WORKLOADS, run_job

    if workload is not None and workload.startswith("-"):  # `train --np 8 -- --epochs 1`: no workload named
        script_args = [workload, *(script_args or [])]
        workload = None
    free: list[str] = [workload, *(script_args or [])] if workload is not None else []
    positional, rest = leading_inventory(free, tuple(WORKLOADS), option_given=inventory is not None)
    if positional is not None:  # the workload, if named, follows the inventory; script arguments start with '-'
        workload = rest.pop(0) if rest and not rest[0].startswith("-") else None
        script_args = rest
    check_controller(controller)
    if np < 1:
        raise BadInput(f"--np {np}: the number of processes must be at least 1")
    cluster = for_jobs(load_inventory(positional, inventory), notice)
    from pycli.core.errors import warn
    from pycli.jobs.slurm import SSH, choose_scheduler

    if choose_scheduler(scheduler, cluster.has_slurm) == SSH and cluster.has_slurm:
        warn("--scheduler ssh: this job bypasses Slurm's queue; its ranks share the nodes with whatever Slurm runs there")
    container = None
    if docker is not None:
        container = parse_job_container(docker, docker_ssh_port, docker_opt or [], cluster.hosts)
    request = JobRequest(
        placement=Placement(np=np, gpus_per_node=gpus_per_node, network_interface=network_interface),
        launch=Launch(workload=workload or "mnist", launcher=launcher, controller=controller,
                      script_args=tuple(script_args or ()), env=tuple(env or ()), threads_per_rank=threads_per_rank,
                      autotune=autotune),
        queue=Queue(scheduler=scheduler, account=account, qos=qos, partition=partition, time_limit_s=time_limit),
        recovery=Recovery(max_restarts=max_restarts, elastic_restarts=elastic_restarts, min_np=min_np, elastic=elastic),
        container=container, data=Data(data_dir=data_dir, resume=resume),
    )
    raise typer.Exit(run_job(cluster, request).code)
