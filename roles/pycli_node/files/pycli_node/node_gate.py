"""pycli's quick node gate, run on the node itself by Slurm (role pycli_node installs it with
pycli_node.gpu_probe and pycli_node.gpu_reports; standard library only, no pycli needed there):

- `health` (slurm.conf HealthCheckProgram, every HealthCheckInterval): the GPU health probe of
  `pycli check --deep` (ECC, row remaps, Xids, nvidia-smi answering), free disk space and munge.
  A node that fails is drained with the gate's reason ("pycli health: ..."); a node this gate
  drained that passes again is resumed. A drain with any other reason (an admin's, pycli's
  own drained list, the epilog's) is never undone here, nor its reason overwritten.
- `prolog` (Prolog, on every node of a job as it is allocated): the GPU probe alone, inside the
  hard time limit the role gives it. A failure drains the node with the reason and exits 1, and
  Slurm puts the job back in the queue. With `--job-mapping-dir`, a job that passes is written
  into dcgm-exporter's job mapping files, so the metrics of its GPUs carry `hpc_job`.
- `epilog` (Epilog, on every node of a job as it ends): every container started for the job
  (`pycli train --docker` through Slurm labels them SLURM_JOB_LABEL=<job id>) is removed with
  the job's private keys in its job folder, then every process the job left behind (its
  environment names the job's SLURM_JOB_ID) is stopped, TERM and then KILL; a container that
  cannot be removed or a process that survives drains the node, so no next job shares it with
  a stuck rank. With `--job-mapping-dir`, the
  job's id is taken out of the mapping files.

dcgm-exporter's job mapping (its --hpc-job-mapping-dir): one file per GPU, named by the GPU's
index on the node, holding the ids of the jobs that hold it, one a line. The exporter repeats
each series of that GPU once per id with the label hpc_job; a GPU without a file has no such
label, and a file with no id hides the GPU's series, so the last id out removes the file. A
metrics label must never stop a job or drain a node: a mapping that cannot be written is said
on stderr (slurmd's log) and the gate's answer stays what the GPU probe and the processes say.

Run as `python3 -m pycli_node.node_gate MODE --node NAME ...`; each mode prints one line and exits 0
(healthy) or 1.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress

from pycli_node.gpu_probe import evaluate_node, health_command, split_sections

# How the gate runs a command on the node: (command, timeout in s) -> (exit code, output).
Run = Callable[[str, float], tuple[int, str]]

# The reasons this gate gives Slurm start so; `health` resumes only nodes drained with them.
HEALTH_PREFIX = "pycli health: "
PROLOG_PREFIX = "pycli prolog: "
EPILOG_PREFIX = "pycli epilog: "
# Slurm keeps a reason of up to this many characters readable in sinfo.
MAX_REASON = 200
KILL_WAIT_S = 10
# The label of every container started for a Slurm job, its value the job's id: the job's first
# step starts them (pycli/jobs/containers.py), the epilog removes them.
SLURM_JOB_LABEL = "io.pycli.slurm-job"
# The job's private keys in a job container's folder (pycli/jobs/containers.py's PRIVATE_FILES).
CONTAINER_KEYS = ("ssh_host_ed25519_key", "id_ed25519")
# Taken by every prolog and epilog that changes the mapping files: jobs start and end at once.
# The name is not a GPU index, so dcgm-exporter skips it (and the temporary files).
MAPPING_LOCK = ".pycli-lock"


def gpu_problems(run: Run, node: str,
                 probe_timeout_s: float) -> tuple[list[str], list[str]]:
    """(problems, notes) of the GPU probe, given probe_timeout_s seconds; none on a node without
    nvidia-smi."""
    rc, out = run(health_command(0), probe_timeout_s)
    found = evaluate_node(node, split_sections(out), 0)
    if found is None:
        return ([], []) if rc == 0 else ([f"the GPU probe failed (exit {rc})"], [])
    # The kernel log unread is unknown, not unhealthy: said, never a reason to drain.
    return list(found.problems), list(found.unread)


def disk_problems(paths: Sequence[str], min_free_gib: float) -> list[str]:
    problems = []
    for path in paths:
        try:
            free = shutil.disk_usage(path).free / 2**30
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror or exc}")
            continue
        if free < min_free_gib:
            problems.append(f"{path}: {free:.1f} GiB free, below {min_free_gib:g} GiB")
    return problems


def munge_problems(run: Run) -> list[str]:
    rc, out = run("munge -n | unmunge", 10)
    if rc == 0:
        return []
    last = [line.strip() for line in out.splitlines() if line.strip()][-1:] or [f"exit {rc}"]
    return [f"munge does not work: {last[0]}"]


def reason(prefix: str, problems: Sequence[str]) -> str:
    """Slurm's reason: the prefix, the problems in one line, shortened to MAX_REASON."""
    text = prefix + "; ".join(" ".join(problem.split()) for problem in problems)
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 3].rstrip() + "..."


def node_reason(run: Run, node: str) -> tuple[bool, str]:
    """(drained, its reason) as slurmctld has the node now."""
    rc, out = run(f"scontrol show node -o {node}", 15)
    if rc != 0:
        return False, ""
    words = out.strip()
    drained = any(word.startswith("State=") and "DRAIN" in word for word in words.split())
    said = words.split(" Reason=", 1)[1] if " Reason=" in words else ""
    return drained, said.rsplit(" [", 1)[0].strip()  # "Reason=why [root@2026-11-26T10:00:00]"


def shell(command: str, timeout_s: float) -> tuple[int, str]:
    try:
        done = subprocess.run(["/bin/sh", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout_s:g} s"
    return done.returncode, done.stdout.decode(errors="replace")


def set_state(run: Run, node: str, state: str, why: str = "") -> None:
    words = ["scontrol", "update", f"nodename={node}", f"state={state}"]
    if why:
        words.append(f"reason={why}")
    rc, out = run(" ".join(_quote(word) for word in words), 15)
    if rc != 0:
        print(f"pycli node gate: {' '.join(words[:4])} failed: {out.strip()}", file=sys.stderr)


def _quote(word: str) -> str:
    return "'" + word.replace("'", "'\"'\"'") + "'"


def health(node: str, paths: Sequence[str], min_free_gib: float, *, probe_timeout_s: float, run: Run = shell) -> int:
    problems, notes = gpu_problems(run, node, probe_timeout_s)
    problems += disk_problems(paths, min_free_gib) + munge_problems(run)
    drained, said = node_reason(run, node)
    if problems:
        why = reason(HEALTH_PREFIX, problems)
        if drained and not said.startswith(HEALTH_PREFIX):
            # A person's drain (pycli drain, an administrator), or the prolog's or epilog's: its
            # reason stays, and with it the node's way back, which is theirs, not this gate's.
            print(f"{why} (drained already: {said or 'no reason'}; left so)")
            return 1
        if not (drained and said == why):
            set_state(run, node, "drain", why)
        print(why)
        return 1
    if drained and said.startswith(HEALTH_PREFIX):
        set_state(run, node, "resume")
        print(f"pycli health: healthy again; resumed (was: {said})")
        return 0
    print("pycli health: healthy" + (f" ({'; '.join(notes)})" if notes else ""))
    return 0


def prolog(node: str, *, probe_timeout_s: float, run: Run = shell, job_id: str = "", mapping_dir: str = "",
           environ: Mapping[str, str] = os.environ) -> int:
    problems, _ = gpu_problems(run, node, probe_timeout_s)
    if not problems:
        if mapping_dir:
            record_job_gpus(mapping_dir, job_id, environ)
        return 0
    why = reason(PROLOG_PREFIX, problems)
    set_state(run, node, "drain", why)
    print(why, file=sys.stderr)
    return 1


def job_processes(job_id: str, spare: set[int]) -> list[int]:
    """Processes whose environment names SLURM_JOB_ID=job_id, but those in `spare`."""
    wanted = f"SLURM_JOB_ID={job_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in spare:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if wanted in environ.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:  # gone meanwhile, or a kernel thread
            continue
    return found


def _ancestors() -> set[int]:
    """This process and its parents: the epilog's own chain carries the job's id too."""
    chain, pid = set(), os.getpid()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return chain


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def remove_job_containers(job_id: str, run: Run) -> list[str]:
    """Remove the job's containers (SLURM_JOB_LABEL) and the private keys in their job folders;
    what could not be removed, for the drain reason: a dockerd that does not answer `docker ps`
    too, as it may keep them. A node without Docker has none."""
    code, out = run(f"docker ps -aq --filter label={SLURM_JOB_LABEL}={job_id}", 30)
    if code == 127:  # no docker command
        return []
    if code != 0:  # a hung or stopped dockerd may keep the job's containers, and their GPUs, into the next job
        return [f"cannot list the containers of job {job_id} (docker ps: {out.strip()[-120:] or f'exit {code}'})"]
    ids = out.split()
    if not ids:
        return []
    code, folders = run("docker inspect -f '{{.Config.WorkingDir}}' " + " ".join(ids), 30)
    for folder in folders.splitlines() if code == 0 else ():
        keys = os.path.join(folder, "container")
        # The folder is the job's, and so is what is in it: a link in the path (to /etc, say) is
        # never followed, so only the job's own key files go.
        if not folder.startswith("/") or os.path.realpath(keys) != os.path.normpath(keys):
            continue
        for key in CONTAINER_KEYS:
            with suppress(OSError):
                os.unlink(os.path.join(keys, key))
    code, out = run("docker rm -f " + " ".join(ids), 60)
    if code != 0:
        return [f"container(s) of job {job_id} not removed: {out.strip()[-120:]}"]
    return []


def epilog(node: str, job_id: str, run: Run = shell, wait_s: float = KILL_WAIT_S, mapping_dir: str = "") -> int:
    if mapping_dir:
        forget_job(mapping_dir, job_id)
    problems = remove_job_containers(job_id, run)
    spare = _ancestors()
    left = job_processes(job_id, spare)
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            with suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + wait_s
        while (left := [pid for pid in left if _alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not left:
            break
    if left:
        problems.append(f"{len(left)} process(es) of job {job_id} survive SIGKILL: {' '.join(map(str, left[:10]))}")
    if not problems:
        return 0
    why = reason(EPILOG_PREFIX, problems)
    set_state(run, node, "drain", why)
    print(why, file=sys.stderr)
    return 1


def parse_gpu_ids(value: str) -> list[str]:
    """Slurm's list of a job's GPUs ("0,2", "0-3", "1,4-5") as GPU indexes, in order, once each."""
    found: list[str] = []
    for item in value.split(","):
        item = item.strip()
        low, dash, high = item.partition("-")
        if low.isdigit() and (not dash or high.isdigit()):
            for index in range(int(low), int(high if dash else low) + 1):
                if str(index) not in found:
                    found.append(str(index))
        elif item:
            raise ValueError(f"{value!r} is not a list of GPU indexes")
    return found


def job_gpus(environ: Mapping[str, str]) -> list[str]:
    """The node's GPUs Slurm gave the job: SLURM_JOB_GPUS, which Slurm's prolog and epilog guide
    documents for the Prolog, else CUDA_VISIBLE_DEVICES, which it sets there too with the node's
    own indexes (the prolog runs outside the job's cgroup). Neither: the job has no GPU here."""
    for name in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = environ.get(name, "").strip()
        if value:
            try:
                return parse_gpu_ids(value)
            except ValueError as exc:
                raise ValueError(f"{name}={exc}") from None
    return []


@contextmanager
def _mapping_locked(directory: str) -> Iterator[None]:
    with open(os.path.join(directory, MAPPING_LOCK), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _read_jobs(path: str) -> list[str]:
    try:
        with open(path) as mapping:
            return [line.strip() for line in mapping if line.strip()]
    except FileNotFoundError:
        return []


def _write_jobs(directory: str, gpu: str, jobs: Sequence[str]) -> None:
    """The GPU's file holds exactly `jobs`; removed when none. dcgm-exporter reads whole files:
    a temporary file renamed over the old one, never a half-written file."""
    path = os.path.join(directory, gpu)
    if not jobs:
        with suppress(FileNotFoundError):
            os.unlink(path)
        return
    temporary = os.path.join(directory, f".{gpu}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w") as mapping:
            mapping.write("".join(f"{job}\n" for job in jobs))
            mapping.flush()
            os.fsync(mapping.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def map_job(directory: str, job_id: str, gpus: Sequence[str]) -> None:
    """Add the job to the mapping file of each of its GPUs (the folder is made when missing)."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    with _mapping_locked(directory):
        for gpu in gpus:
            jobs = _read_jobs(os.path.join(directory, gpu))
            if job_id not in jobs:
                _write_jobs(directory, gpu, [*jobs, job_id])


def unmap_job(directory: str, job_id: str) -> list[str]:
    """Take the job out of every mapping file (the epilog need not know its GPUs); the GPUs it
    was taken from."""
    if not os.path.isdir(directory):
        return []
    freed = []
    with _mapping_locked(directory):
        for gpu in sorted(name for name in os.listdir(directory) if name.isdigit()):
            jobs = _read_jobs(os.path.join(directory, gpu))
            if job_id in jobs:
                _write_jobs(directory, gpu, [job for job in jobs if job != job_id])
                freed.append(gpu)
    return freed


def record_job_gpus(directory: str, job_id: str, environ: Mapping[str, str]) -> None:
    """The prolog's part: never raises, says on stderr what it could not do."""
    try:
        gpus = job_gpus(environ)
        if gpus and not job_id.isdigit():
            raise ValueError("no SLURM_JOB_ID in the environment")
        if gpus:
            map_job(directory, job_id, gpus)
    except (OSError, ValueError) as exc:
        print(f"{PROLOG_PREFIX}dcgm-exporter job mapping not written in {directory}: {exc}; "
              "the job runs, its GPU metrics have no hpc_job label", file=sys.stderr)


def forget_job(directory: str, job_id: str) -> None:
    """The epilog's part: never raises, says on stderr what it could not do."""
    try:
        unmap_job(directory, job_id)
    except OSError as exc:
        print(f"{EPILOG_PREFIX}job {job_id} not taken out of dcgm-exporter's job mapping in {directory}: {exc}",
              file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pycli_node.node_gate", description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("health", "prolog", "epilog"))
    parser.add_argument("--node", required=True, help="this node's Slurm name (NodeName)")
    parser.add_argument("--path", action="append", default=[], help="health: a file system that must have free space")
    parser.add_argument("--min-free-gib", type=float, default=1.0, help="health: the least free space on each --path")
    # The slurm role's slurm_prolog_timeout, its one home: the wrappers pass it.
    parser.add_argument("--probe-timeout", type=float, default=None, metavar="S",
                        help="health, prolog: seconds the GPU probe may take (required for both)")
    parser.add_argument("--job-mapping-dir", default="",
                        help="prolog, epilog: dcgm-exporter's --hpc-job-mapping-dir, kept up to date with the jobs' GPUs")
    args = parser.parse_args(argv)
    if args.mode in ("health", "prolog") and (args.probe_timeout is None or args.probe_timeout <= 0):
        parser.error(f"{args.mode} needs --probe-timeout S, a number of seconds above 0")
    if args.mode == "health":
        return health(args.node, args.path, args.min_free_gib, probe_timeout_s=args.probe_timeout)
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if args.mode == "prolog":
        return prolog(args.node, probe_timeout_s=args.probe_timeout, job_id=job_id, mapping_dir=args.job_mapping_dir)
    if not job_id.isdigit():
        print("pycli epilog: no SLURM_JOB_ID in the environment; Slurm runs the epilog with it", file=sys.stderr)
        return 2
    return epilog(args.node, job_id, mapping_dir=args.job_mapping_dir)


if __name__ == "__main__":
    sys.exit(main())
