"""The steps of scripts/gpu-verify.sh (which prepares the venv this runs in): each one ✓ or ✗
with its reason and its figures, one table at the end, the same as JSON.

Every step runs what a user runs (pycli's own commands, on an inventory of this one machine
with `ansible_connection=local`) and says why when it fails; none stops the others. A step
that needs a GPU says "no GPU" where torch sees none, after running what it can on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from pycli.cluster.node_facts import parse_check_build  # noqa: E402
from pycli.core.paths import WORKLOADS_DIR  # noqa: E402

NO_GPU = "no GPU"
# The roles that make a GPU node, in playbooks/gpu.yml's order, and those this run leaves out.
GPU_TAGS = "preflight,nvidia_driver,cuda,nccl"
# The preflight tags of these roles stop a run on a host without Docker or NVIDIA's repository.
SKIPPED_TAGS = "docker,nvidia_container_toolkit,dcgm"
LEFT_OUT = {
    "docker, nvidia_container_toolkit": "not run: they need Docker's and NVIDIA's repositories (no network) and systemd",
    "dcgm": "not run: DCGM comes from NVIDIA's repository (no network) and runs as a systemd service",
    "common, openmpi, ssh_trust": "not run: the machine's own Python, Open MPI and no second node",
}
# The adopt path's inventory variable (roles/gpu_preflight: a host that comes with its stack).
ADOPT_VAR = "gpu_adopt"
JOB_TIMEOUT_S = 240
HOROVOD_BUILD_TIMEOUT_S = 420


@dataclass
class Step:
    name: str
    ok: bool
    why: str = ""
    seconds: float = 0.0
    figures: dict[str, object] = field(default_factory=dict)

    @property
    def mark(self) -> str:
        return "✓" if self.ok else "✗"


@dataclass
class Context:
    work: Path
    carry: Path
    out: Path
    python: str  # this venv's: the inventory's venv, torch through the machine's Python
    gpu: dict[str, object]
    inventory: Path | None = None
    horovod: Step | None = None
    horovod_done: threading.Event = field(default_factory=threading.Event)
    build_timeout_s: float = HOROVOD_BUILD_TIMEOUT_S

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu.get("cuda"))

    def log(self, name: str) -> Path:
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        return self.work / "logs" / f"{name}.log"


def run(ctx: Context, name: str, argv: Sequence[str], timeout_s: float, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> tuple[int, str, float]:
    """A command, its output kept in logs/NAME.log and echoed; (exit code, output, seconds)."""
    began = time.monotonic()
    log = ctx.log(name)
    with log.open("w") as out:
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        try:
            # A session of its own: on timeout the whole tree goes (a build's make and compilers too).
            proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                    env={**os.environ, **(env or {})}, cwd=cwd or ROOT, stdin=subprocess.DEVNULL)
            try:
                code = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = 124
                out.write(f"\ngpu-verify: stopped after {timeout_s:g} s\n")
        except OSError as error:
            code = 127
            out.write(f"\ngpu-verify: {error}\n")
    text = log.read_text(errors="replace")
    return code, text, time.monotonic() - began


def last_line(text: str, pattern: str = r"error|fail|refus|no |not |cannot|denied|missing|Traceback") -> str:
    """The line that says most about a failure: the last one that sounds like one, else the last."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    telling = [line for line in lines if re.search(pattern, line, re.IGNORECASE)]
    return (telling or lines or ["no output"])[-1][:300]


def step_machine(ctx: Context) -> Step:
    figures = dict(ctx.gpu)
    smi = shutil.which("nvidia-smi")
    if smi:
        code, text, _ = run(ctx, "nvidia-smi-L", [smi, "-L"], 30)
        figures["nvidia_smi_L"] = text.splitlines()[1:3]
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if nvcc:
        code, text, _ = run(ctx, "nvcc", [nvcc, "--version"], 30)
        figures["nvcc"] = next((line.strip() for line in text.splitlines() if "release" in line), "?")
    version = Path("/proc/driver/nvidia/version")
    if version.exists():
        figures["driver"] = version.read_text().splitlines()[0].strip()
    figures["cpus"] = os.cpu_count()
    if not ctx.has_gpu:
        return Step("machine", False, f"{NO_GPU}: torch {ctx.gpu.get('torch')} sees no CUDA device", figures=figures)
    return Step("machine", True, f"{ctx.gpu['name']}, torch {ctx.gpu['torch']}", figures=figures)


def step_inventory(ctx: Context) -> Step:
    inventory = ctx.work / "local.ini"
    venv = Path(ctx.python).parent.parent
    code, text, took = run(ctx, "inventory", [ctx.python, "-m", "pycli", "inventory", "new", "--local", "--venv", str(venv),
                                              "--work-dir", str(ctx.work / "jobs"), "-o", str(inventory)], 60)
    if code != 0 or not inventory.exists():
        return Step("inventory", False, f"pycli inventory new --local: {last_line(text)}", took)
    ctx.inventory = inventory
    return Step("inventory", True, f"{inventory.name}: this machine, ansible_connection=local, venv {venv}", took)


def provision_argv(ctx: Context) -> list[str]:
    return [ctx.python, "-m", "pycli", "provision", "-i", str(ctx.inventory), "--playbook", str(ROOT / "playbooks" / "gpu.yml"),
            "-t", GPU_TAGS, "--skip-tags", SKIPPED_TAGS, "-e", f"{ADOPT_VAR}=true", "-v"]


def recap_changed(text: str) -> dict[str, int]:
    """PLAY RECAP's counts of the host, from Ansible's own output (-v)."""
    found = re.findall(r"^\s*\S+\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)", text, re.M)
    if not found:
        return {}
    ok, changed, unreachable, failed, skipped = (int(n) for n in found[-1])
    return {"ok": ok, "changed": changed, "unreachable": unreachable, "failed": failed, "skipped": skipped}


def adopted_facts(text: str) -> list[str]:
    """What the roles said they found (their debug lines naming versions)."""
    return [line.strip().strip('"')[:200] for line in text.splitlines()
            if re.search(r"(adopt|found|detected).*\d+\.\d+", line, re.IGNORECASE) and "TASK" not in line][:8]


def step_provision(ctx: Context) -> list[Step]:
    if ctx.inventory is None:
        return [Step("provision", False, "no inventory")]
    steps = []
    code, text, took = run(ctx, "provision", provision_argv(ctx), 600)
    counts = recap_changed(text)
    figures: dict[str, object] = {"recap": counts, "found": adopted_facts(text)}
    why = f"tags {GPU_TAGS}, {ADOPT_VAR}=true: ok={counts.get('ok')} changed={counts.get('changed')}"
    if code != 0:
        steps.append(Step("provision", False, f"exit {code}: {last_line(text)}", took, figures))
    else:
        steps.append(Step("provision", True, why, took, figures))
        code, text, took = run(ctx, "provision-again", provision_argv(ctx), 600)
        again = recap_changed(text)
        if code != 0:
            steps.append(Step("provision_idempotent", False, f"second run exit {code}: {last_line(text)}", took))
        else:
            steps.append(Step("provision_idempotent", again.get("changed") == 0,
                              f"second run changed={again.get('changed')}", took, {"recap": again}))
    for roles, why in LEFT_OUT.items():
        steps.append(Step(f"left out: {roles}", True, why))
    return steps


# --- Horovod ---------------------------------------------------------------------------------

def horovod_defaults() -> dict:
    return yaml.safe_load((ROOT / "roles" / "horovod" / "defaults" / "main.yml").read_text())


def nccl_from_wheel(ctx: Context) -> Path | None:
    """The nvidia-nccl-cu* wheel's folder (include/nccl.h, lib/libnccl.so.2) in the machine's torch."""
    code, text, _ = run(ctx, "nccl-wheel", [ctx.python, "-c",
                                            "import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])"], 60)
    folder = Path(text.splitlines()[-1].strip()) if code == 0 else None
    return folder if folder and (folder / "include" / "nccl.h").exists() else None


def horovod_build_env(ctx: Context, cuda_home: Path | None, nccl: Path | None) -> dict[str, str]:
    """The horovod role's build environment (roles/horovod/tasks/preflight.yml), against this machine."""
    env = {"HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_MXNET": "1",
           "HOROVOD_WITH_GLOO": "1", "CMAKE_POLICY_VERSION_MINIMUM": "3.5", "MAKEFLAGS": f"-j{os.cpu_count() or 2}"}
    env.update({"HOROVOD_WITH_MPI": "1"} if shutil.which("mpicxx") else {"HOROVOD_WITHOUT_MPI": "1"})
    if cuda_home is not None and nccl is not None:
        # The wheel ships libnccl.so.2 only; Horovod's CMake looks for libnccl.so.
        link = ctx.work / "nccl-lib"
        link.mkdir(exist_ok=True)
        for name in ("libnccl.so", "libnccl.so.2"):
            target = link / name
            if not target.exists():
                target.symlink_to(nccl / "lib" / "libnccl.so.2")
        env.update({"HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_CUDA_HOME": str(cuda_home),
                    "HOROVOD_NCCL_INCLUDE": str(nccl / "include"), "HOROVOD_NCCL_LIB": str(link),
                    "HOROVOD_NCCL_LINK": "SHARED"})
        capability = ctx.gpu.get("capability")
        if capability:
            env["HOROVOD_BUILD_CUDA_CC_LIST"] = str(capability)  # this GPU's only: a shorter build
    return env


def build_horovod(ctx: Context) -> Step:
    defaults = horovod_defaults()
    version, sha256 = defaults["horovod_version"], defaults["horovod_sdist_sha256"]
    sdist = ctx.carry / "downloads" / f"horovod-{version}.tar.gz"
    began = time.monotonic()
    if not sdist.exists():
        return Step("horovod_build", False, f"{sdist} is missing: run scripts/gpu-verify-prepare.sh")
    code, text, _ = run(ctx, "horovod-sha256", ["sha256sum", str(sdist)], 60)
    if text.split("\n", 1)[1].split()[0] != sha256:
        return Step("horovod_build", False, f"{sdist.name}: sha256 is not the horovod role's {sha256[:12]}…")
    tree = ctx.work / "horovod-src"
    with tarfile.open(sdist) as archive:
        archive.extractall(ctx.work, filter="data")
    (ctx.work / f"horovod-{version}").rename(tree)
    for name in ("CMakeLists.txt", "horovod/torch/CMakeLists.txt"):  # torch >= 2.1 needs C++17 (role: build_start.yml)
        path = tree / name
        path.write_text(path.read_text().replace("set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"))
    for patch in defaults["horovod_source_patches"]:
        code, text, _ = run(ctx, "horovod-patch", ["patch", "-p1", "-i", str(ROOT / "roles" / "horovod" / "files" / patch)],
                            60, cwd=tree)
        if code != 0:
            return Step("horovod_build", False, f"patch {patch}: {last_line(text)}", time.monotonic() - began)
    nvcc = Path(shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    cuda_home = nvcc.resolve().parent.parent if nvcc.exists() else None
    nccl = nccl_from_wheel(ctx)
    env = horovod_build_env(ctx, cuda_home, nccl)
    code, text, _ = run(ctx, "horovod-build", [ctx.python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                                               "--no-index", "--wheel-dir", "dist", "."],
                        ctx.build_timeout_s, env=env, cwd=tree)
    wheels = sorted((tree / "dist").glob("horovod-*.whl"))
    if code != 0 or not wheels:
        why = f"ran past its {ctx.build_timeout_s:g} s" if code == 124 else last_line(text, r"error")
        return Step("horovod_build", False, f"exit {code}: {why}", time.monotonic() - began, {"env": env})
    code, text, _ = run(ctx, "horovod-install", [ctx.python, "-m", "pip", "install", "--no-deps", "--no-index",
                                                 str(wheels[-1])], 120)
    took = time.monotonic() - began
    if code != 0:
        return Step("horovod_build", False, f"installing the wheel: {last_line(text)}", took)
    gpu_ops = env.get("HOROVOD_GPU_OPERATIONS")
    if not gpu_ops:
        why = "no nvcc or no NCCL wheel" if ctx.has_gpu else NO_GPU
        return Step("horovod_build", False, f"{why}: built without GPU operations (CPU only) so the rest runs", took,
                    {"wheel": wheels[-1].name})
    return Step("horovod_build", True, f"{wheels[-1].name} with HOROVOD_GPU_OPERATIONS={gpu_ops}, CUDA {cuda_home}, "
                f"NCCL from {nccl}", took, {"env": env})


def start_horovod_build(ctx: Context) -> None:
    def build() -> None:
        try:
            ctx.horovod = build_horovod(ctx)
        except Exception as error:  # the step says it; the others go on
            ctx.horovod = Step("horovod_build", False, f"{type(error).__name__}: {error}")
        finally:
            ctx.horovod_done.set()

    threading.Thread(target=build, daemon=True).start()


def step_check_build(ctx: Context) -> Step:
    horovodrun = Path(ctx.python).parent / "horovodrun"
    if not horovodrun.exists():
        return Step("horovod_check_build", False, "no horovodrun: the build failed")
    code, text, took = run(ctx, "horovod-check-build", [str(horovodrun), "--check-build"], 120)
    build = parse_check_build(text)
    if code != 0 or build is None:
        return Step("horovod_check_build", False, f"exit {code}: {last_line(text)}", took)
    why = build.describe()
    if "nccl" not in build.operations:
        return Step("horovod_check_build", False, f"{NO_GPU if not ctx.has_gpu else 'no NCCL'}: {why}", took)
    return Step("horovod_check_build", True, why, took)


# --- Training ----------------------------------------------------------------------------------

def newest_results(ctx: Context, after: float) -> Path | None:
    runs = [p for p in (ctx.work / "runs").glob("*-train*") if p.stat().st_mtime >= after - 1]
    return max(runs, key=lambda p: p.stat().st_mtime) / "results" if runs else None


def metrics_of(results: Path | None) -> list[dict]:
    return _records(results / "metrics.jsonl") if results else []


FIGURE_KEYS = ("device", "samples_per_s", "total_img_per_s", "img_per_s_per_rank", "step_time_s", "peak_memory_mb",
               "val_accuracy", "busbw_gbps", "algbw_gbps", "size_bytes", "backend", "amp")


def summarize(records: Sequence[dict]) -> dict[str, object]:
    if not records:
        return {}
    last = records[-1]
    figures = {key: last[key] for key in FIGURE_KEYS if key in last}
    if "busbw_gbps" not in figures:  # allreduce: one record per size; the biggest says most
        sized = [r for r in records if "size_bytes" in r]
        if sized:
            biggest = max(sized, key=lambda r: r["size_bytes"])
            figures.update({key: biggest[key] for key in biggest if key.endswith("gbps") or key in ("size_bytes", "device")})
    return figures


def train_step(ctx: Context, name: str, args: Sequence[str], needs_gpu: bool = True, needs_horovod: bool = False) -> Step:
    if ctx.inventory is None:
        return Step(name, False, "no inventory")
    if needs_horovod:
        ctx.horovod_done.wait(ctx.build_timeout_s + 120)
        if not (Path(ctx.python).parent / "horovodrun").exists():
            return Step(name, False, "no Horovod: its build failed")
    began_at = time.time()
    argv = [ctx.python, "-m", "pycli", "train", "-i", str(ctx.inventory), "--time-limit", str(JOB_TIMEOUT_S), *args]
    code, text, took = run(ctx, name, argv, JOB_TIMEOUT_S + 120)
    figures = summarize(metrics_of(newest_results(ctx, began_at)))
    figures["wall_s"] = round(took, 1)
    command = "pycli train " + " ".join(args)
    if code != 0:
        return Step(name, False, f"{command}: exit {code}: {last_line(text)}", took, figures)
    if needs_gpu and figures.get("device") != "cuda":
        return Step(name, False, f"{NO_GPU}: {command} ran on {figures.get('device', 'an unknown device')}", took, figures)
    return Step(name, True, command, took, figures)


def bare_step(ctx: Context, name: str, script: str, args: Sequence[str], pycli_step: Step) -> Step:
    """The same step loop with no pycli: torchrun straight on this machine; what pycli adds."""
    metrics = ctx.work / (re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") + ".jsonl")
    argv = [str(Path(ctx.python).parent / "torchrun"), "--standalone", "--nproc-per-node", "1",
            str(WORKLOADS_DIR / script), *args, "--metrics", str(metrics)]
    code, text, took = run(ctx, name, argv, JOB_TIMEOUT_S)
    figures = summarize(_records(metrics))
    figures["wall_s"] = round(took, 1)
    if code != 0:
        return Step(name, False, f"exit {code}: {last_line(text)}", took, figures)
    with_pycli = pycli_step.figures.get("total_img_per_s")
    bare = figures.get("total_img_per_s")
    if isinstance(with_pycli, (int, float)) and isinstance(bare, (int, float)) and bare:
        figures["pycli_img_per_s_ratio"] = round(with_pycli / bare, 3)
        figures["pycli_extra_wall_s"] = round(float(pycli_step.figures.get("wall_s", 0.0)) - took, 1)
    if not ctx.has_gpu:
        return Step(name, False, f"{NO_GPU}: ran on {figures.get('device')}", took, figures)
    return Step(name, True, "torchrun " + script + " " + " ".join(args), took, figures)


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().startswith("{")]


# --- pycli check and the recorded output -----------------------------------------------------

GATES_SNIPPET = """
import json, sys
from pathlib import Path
from pycli.health.gates import CheckContext, gate_nvidia_smi, gate_driver_library
from pycli.health.gpu_health import gate_gpu_health
from pycli.health.options import check_options
from pycli.cluster.model import load_cluster
from pycli.cluster.node_facts import gather_node_facts
cluster = load_cluster(sys.argv[1])
run_dir = Path(sys.argv[2]); run_dir.mkdir(parents=True, exist_ok=True)
ctx = CheckContext(cluster, run_dir, check_options(deep=True, dcgm_level=0))
ctx.facts.update(gather_node_facts(cluster, ctx.names, run_dir / "facts"))
for gate in (gate_nvidia_smi, gate_driver_library, gate_gpu_health):
    result = gate(ctx)
    print(json.dumps({"gate": result.name, "status": result.status, "detail": result.message or result.figure}))
"""


def step_gpu_gates(ctx: Context) -> list[Step]:
    if ctx.inventory is None:
        return [Step("check_gpu_gates", False, "no inventory")]
    code, text, took = run(ctx, "check-gpu-gates", [ctx.python, "-c", GATES_SNIPPET, str(ctx.inventory),
                                                    str(ctx.work / "check-gates")], 300)
    results = [json.loads(line) for line in text.splitlines() if line.startswith('{"gate"')]
    if code != 0 or not results:
        return [Step("check_gpu_gates", False, f"exit {code}: {last_line(text)}", took)]
    steps = []
    for result in results:
        passed = result["status"] == "pass" and ctx.has_gpu  # a stand-in nvidia-smi proves nothing
        why = result["detail"] or result["status"]
        if not ctx.has_gpu:
            why = f"{NO_GPU}: {why}"
        steps.append(Step(f"check {result['gate']}", passed, why, took / len(results)))
    # The whole check as a user runs it: every gate's line, for the record (a bare machine has no
    # sshd, no Open MPI of the role's, no Docker: those gates fail here, and that is no finding).
    code, text, took = run(ctx, "check", [ctx.python, "-m", "pycli", "check", "-i", str(ctx.inventory), "--json"], 600)
    try:
        report = json.loads(text[text.index("{"):])
        gates = {g["name"]: g["status"] for g in report["gates"]}
    except (ValueError, KeyError, TypeError):
        gates = {}
    steps.append(Step("pycli check (whole)", True, f"exit {code}; gates: " + ", ".join(f"{k} {v}" for k, v in gates.items()),
                      took, {"gates": gates}))
    return steps


def step_recorded(ctx: Context) -> Step:
    """The machine's real nvidia-smi -q, kernel log (the driver's lines) and driver version, saved
    for the parsers' tests (tests/fixtures/recorded) and parsed here by pycli's parsers."""
    from pycli_node.gpu_reports import parse_nvidia_smi_q, parse_xids

    folder = ctx.out / "recorded"
    folder.mkdir(parents=True, exist_ok=True)
    smi = shutil.which("nvidia-smi")
    figures: dict[str, object] = {}
    if smi is None:
        return Step("recorded_output", False, f"{NO_GPU}: no nvidia-smi")
    code, text, _ = run(ctx, "nvidia-smi-q", [smi, "-q"], 60)
    report = text.split("\n", 1)[1] if text.startswith("$ ") else text
    (folder / "nvidia-smi-q.txt").write_text(report)
    code_log, log, _ = run(ctx, "kernel-log", ["dmesg"], 60)
    driver_lines = "".join(line + "\n" for line in log.splitlines() if "NVRM" in line)
    (folder / "kernel-log-nvrm.txt").write_text(driver_lines)
    version = Path("/proc/driver/nvidia/version")
    if version.exists():
        (folder / "proc-driver-nvidia-version.txt").write_text(version.read_text())
    gpus = parse_nvidia_smi_q(report)
    xids = parse_xids(driver_lines)
    figures.update({"gpus": [g.label for g in gpus], "problems": [p for g in gpus for p in g.problems()],
                    "xids": [x.code for x in xids] if xids else [], "files": sorted(p.name for p in folder.iterdir())})
    if not version.exists() or not ctx.has_gpu:
        return Step("recorded_output", False, f"{NO_GPU}: no /proc/driver/nvidia/version; parsed {len(gpus)} GPU(s) from "
                    f"{smi}", figures=figures)
    if code != 0 or not gpus:
        return Step("recorded_output", False, f"nvidia-smi -q exit {code}, {len(gpus)} GPU(s) parsed", figures=figures)
    return Step("recorded_output", True, f"{len(gpus)} GPU(s) parsed, {len(xids)} Xid(s); saved in {folder}", figures=figures)


# --- The run --------------------------------------------------------------------------------------

GPU_PROBE = """
import json, torch
cuda = torch.cuda.is_available()
info = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda": cuda}
if cuda:
    major, minor = torch.cuda.get_device_capability(0)
    info.update(name=torch.cuda.get_device_name(0), capability=f"{major}{minor}", count=torch.cuda.device_count(),
                nccl=".".join(map(str, torch.cuda.nccl.version())))
print(json.dumps(info))
"""


def table(steps: Sequence[Step]) -> str:
    width = max(len(step.name) for step in steps)
    lines = [f"{'step':<{width}}  ok  {'seconds':>7}  what it found"]
    for step in steps:
        shown = {k: v for k, v in step.figures.items() if k in FIGURE_KEYS or k.startswith(("pycli_", "wall"))}
        figures = "; ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items())
        tail = f" [{figures}]" if figures else ""
        lines.append(f"{step.name:<{width}}  {step.mark}   {step.seconds:7.1f}  {step.why}{tail}")
    return "\n".join(lines)


def plan(ctx: Context, horovod: bool) -> list[Callable[[], Step | list[Step]]]:
    gpu = ctx.has_gpu
    nccl = "nccl" if gpu else "gloo"  # NCCL needs a GPU; on a CPU the same path runs over Gloo
    # A GPU gets a ResNet-18-wide model on 224-pixel images; a CPU a small one, to see the path run.
    synthetic = (["--batch-size", "128", "--width", "64", "--image-size", "224", "--num-iters", "5",
                  "--num-batches-per-iter", "10"] if gpu else
                 ["--batch-size", "8", "--image-size", "32", "--num-iters", "2", "--num-batches-per-iter", "2"])
    steps: list[Callable[[], Step | list[Step]]] = [
        lambda: step_inventory(ctx),
        lambda: step_provision(ctx),
        lambda: step_recorded(ctx),
        lambda: step_gpu_gates(ctx),
        lambda: train_step(ctx, "train ddp " + nccl, ["ddp", "--np", "1", "--", "--backend", nccl, "--epochs", "3"]),
        lambda: train_step(ctx, "train allreduce " + nccl, [str(WORKLOADS_DIR / "allreduce.py"), "--launcher", "torchrun",
                                                            "--np", "1", "--", "--comm", "torch", "--backend", nccl,
                                                            "--sizes", "1M:256M"]),
    ]
    pycli_synthetic: list[Step] = []

    def synthetic_with_pycli() -> Step:
        step = train_step(ctx, "train synthetic (torchrun)", ["synthetic", "--launcher", "torchrun", "--np", "1", "--",
                                                              "--comm", "ddp", *synthetic])
        pycli_synthetic.append(step)
        return step

    steps += [
        synthetic_with_pycli,
        lambda: bare_step(ctx, "bare synthetic (no pycli)", "synthetic.py", ["--comm", "ddp", *synthetic], pycli_synthetic[0]),
    ]
    if horovod:
        steps += [
            lambda: (ctx.horovod_done.wait(ctx.build_timeout_s + 120), ctx.horovod)[1]
            or Step("horovod_build", False, "did not end in time"),
            lambda: step_check_build(ctx),
            lambda: train_step(ctx, "train mnist", ["mnist", "--np", "1"], needs_horovod=True),
            lambda: train_step(ctx, "train mnist --amp", ["mnist", "--np", "1", "--", "--amp"], needs_horovod=True),
            lambda: train_step(ctx, "train synthetic (horovod)", ["synthetic", "--np", "1", "--", *synthetic],
                               needs_horovod=True),
        ]
    return steps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--carry", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-horovod", action="store_true", help="leave out the Horovod build and the jobs that need it")
    parser.add_argument("--build-timeout", type=float, default=HOROVOD_BUILD_TIMEOUT_S,
                        help="seconds the Horovod build may take")
    parser.add_argument("--budget", type=float, default=0.0,
                        help="seconds after which no new step starts (the table is still written)")
    args = parser.parse_args(argv)
    out = args.out or args.work / "out"
    out.mkdir(parents=True, exist_ok=True)
    probe = subprocess.run([sys.executable, "-c", GPU_PROBE], capture_output=True, text=True)
    gpu = json.loads(probe.stdout) if probe.returncode == 0 else {"torch": None, "cuda": False, "error": probe.stderr[-300:]}
    ctx = Context(work=args.work, carry=args.carry, out=out, python=sys.executable, gpu=gpu,
                  build_timeout_s=args.build_timeout)
    began = time.monotonic()
    steps = [step_machine(ctx)]
    print(f"gpu-verify: {steps[0].mark} machine: {steps[0].why}", flush=True)
    if not args.no_horovod:
        start_horovod_build(ctx)  # beside the jobs that do not need it
    for action in plan(ctx, not args.no_horovod):
        if args.budget and time.monotonic() - began > args.budget:
            steps.append(Step("the rest", False, f"not run: the run's --budget of {args.budget:g} s was spent"))
            break
        try:
            made = action()
        except Exception as error:  # one step's bug must not hide the others' findings
            made = Step(getattr(action, "__name__", "step"), False, f"{type(error).__name__}: {error}")
        for step in made if isinstance(made, list) else [made]:
            steps.append(step)
            print(f"gpu-verify: {step.mark} {step.name} ({step.seconds:.0f} s): {step.why}", flush=True)
    took = time.monotonic() - began
    text = table(steps)
    failed = [step.name for step in steps if not step.ok]
    summary = f"gpu-verify: {len(steps) - len(failed)} of {len(steps)} steps ✓ in {took:.0f} s" + (
        f"; ✗: {', '.join(failed)}" if failed else "")
    print("\n" + text + "\n" + summary)
    (out / "gpu-verify.txt").write_text(text + "\n" + summary + "\n")
    document = {"version": 1, "seconds": round(took, 1), "machine": gpu, "steps": [asdict(step) for step in steps]}
    (out / "gpu-verify.json").write_text(json.dumps(document, indent=1, default=str) + "\n")
    print(f"gpu-verify: the table and JSON are in {out}; each step's output in {ctx.work / 'logs'}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
