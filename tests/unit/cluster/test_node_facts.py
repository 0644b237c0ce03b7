"""What pycli reads from the nodes: facts.yml's probe (NodeFacts and its parsers), Ansible's per-host answers.

The fixtures here (PROBE, GPU_PROBE, facts) are the recorded nodes the gates' tests judge too.
"""

import json

from pycli.cluster.node_facts import (
    NodeFacts,
    first_version,
    node_facts_from_json,
    parse_check_build,
    parse_cuda,
    parse_nvidia_smi,
    parse_nvml_library,
    parse_probe,
)
from pycli.cluster.nodes import NodeOutput, node_output_from_event
from tests.conftest import ROOT

CHECK_BUILD = """\
Horovod v0.28.1:

Available Frameworks:
    [ ] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [X] MPI
    [X] Gloo

Available Tensor Operations:
    [ ] NCCL
    [ ] DDL
    [ ] CCL
    [X] MPI
    [X] Gloo
"""

PROBE = f"""### python
3.11.2
### torch
2.13.0+cpu
### torch_cuda

### torch_nccl

### horovod
0.28.1
### horovod_check_build
{CHECK_BUILD}
### mpirun
/opt/openmpi-4.1.4/bin/mpirun
### openmpi
mpirun (Open MPI) 4.1.4
### iperf3
/usr/bin/iperf3
### gpu_pci
### nvidia_smi
/bin/bash: line 24: nvidia-smi: command not found
rc=127
### nvidia_module
### nvml_library
### nvlink
### cuda
### nccl
### docker
Docker version 27.5.1, build 9f9e405
"""

GPU_PROBE = PROBE.replace("### gpu_pci\n", "### gpu_pci\n0000:17:00.0\n0000:65:00.0\n").replace(
    "/bin/bash: line 24: nvidia-smi: command not found\nrc=127",
    "NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB\nNVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB\nrc=0",
).replace("### nvidia_module\n", "### nvidia_module\nNVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:29 UTC 2025\n").replace(
    "### nvml_library\n", "### nvml_library\n/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\n/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.65.06\n"
).replace("### cuda\n", "### cuda\nCuda compilation tools, release 12.8, V12.8.93\nBuild cuda_12.8.r12.8/compiler.35583870_0\n")


def facts(host="node1", probe=PROBE, **extra) -> NodeFacts:
    data = {"host": host, "hostname": host, "os": "Debian 12.15", "kernel": "6.1.0", "cpu_model": "AMD EPYC", "cpus": 2,
            "memory_mb": 4096, "nic": {"interface": "eth0", "driver": "", "speed_mbps": 10000, "mtu": 1500,
                                       "address": "10.0.0.1"}, "probe": probe, **extra}
    return node_facts_from_json(json.loads(json.dumps(data)))


# --- reading the nodes' answers ------------------------------------------------------------


def test_probe_sections_and_a_cpu_node_read_back():
    assert parse_probe("### a\n1\n2\n### b\n### c\nx\n") == {"a": "1\n2", "b": "", "c": "x"}
    node = facts()
    assert (node.python, node.torch, node.horovod, node.openmpi) == ("3.11.2", "2.13.0+cpu", "0.28.1", "4.1.4")
    assert node.mpirun == "/opt/openmpi-4.1.4/bin/mpirun" and node.iperf3 == "/usr/bin/iperf3"
    assert node.horovod_build.controllers == {"mpi", "gloo"} and node.horovod_build.frameworks == {"pytorch"}
    assert node.horovod_build.operations == {"mpi", "gloo"}
    assert node.nvidia_smi_rc is None and node.gpu_count == 0 and not node.has_gpu_hardware
    assert node.docker == "27.5.1" and node.cuda == "" and node.nic_speed_mbps == 10000


def test_a_gpu_node_reads_back_with_driver_module_library_and_cuda():
    node = facts(probe=GPU_PROBE)
    assert node.gpus == ("NVIDIA H100 80GB HBM3",) * 2 and node.gpu_count == 2 and len(node.gpu_pci) == 2
    assert (node.driver, node.kernel_module, node.nvml_library, node.cuda) == ("580.65.06",) * 3 + ("12.8.93",)


def test_missing_software_reads_as_empty_not_as_an_error_text():
    empty = "".join(f"### {name}\n" for name in ("python", "torch", "horovod", "horovod_check_build", "openmpi"))
    node = facts(probe=empty)
    assert (node.python, node.torch, node.horovod, node.openmpi, node.horovod_build) == ("", "", "", "", None)


def test_nvidia_smi_answers():
    assert parse_nvidia_smi("bash: nvidia-smi: command not found\nrc=127") == (None, (), "", "")
    rc, gpus, driver, error = parse_nvidia_smi(
        "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.82\nrc=18")
    assert rc == 18 and gpus == () and "Driver/library version mismatch" in error
    assert parse_nvml_library("/usr/lib/x/libnvidia-ml.so.1\n/usr/lib/x/libnvidia-ml.so.570.1.2") == "570.1.2"
    assert parse_cuda("Cuda compilation tools, release 12.8, V12.8.93") == "12.8.93"
    assert parse_cuda("") == ""


def test_check_build_without_horovod_is_none():
    assert parse_check_build("") is None
    assert parse_check_build(CHECK_BUILD).describe() == "frameworks pytorch; controllers gloo/mpi; ops gloo/mpi"


def test_ansible_events_become_node_outputs():
    ok = {"event": "runner_on_ok", "event_data": {"host": "node1", "res": {"rc": 0, "stdout": "hi", "stderr": ""}}}
    bad = {"event": "runner_on_failed", "event_data": {"host": "node2", "res": {"rc": 3, "stdout": "", "stderr": "boom\n"}}}
    gone = {"event": "runner_on_unreachable", "event_data": {"host": "node3", "res": {"msg": "Connection refused"}}}
    assert node_output_from_event(ok) == NodeOutput("node1", 0, "hi", "", "")
    assert node_output_from_event(bad).why() == "boom"
    assert node_output_from_event(gone).rc is None and node_output_from_event(gone).why() == "Connection refused"
    assert node_output_from_event({"event": "playbook_on_start"}) is None


def test_the_open_kernel_modules_version_line_of_a_real_h200_gives_its_version():
    text = (ROOT / "tests" / "fixtures" / "recorded" / "proc-driver-nvidia-version-h200-580.txt").read_text()
    assert "Kernel Module" in text and first_version(text) == "580.159.04"  # not the GCC line's 15.3.0


def test_the_probe_finds_the_nvml_library_where_the_loader_does_outside_usr_lib(tmp_path):
    # As on a cloud GPU VM: the driver's libraries in /usr/local/nvidia/lib64, known to ldconfig only.
    import subprocess

    import yaml

    plays = yaml.safe_load((ROOT / "playbooks" / "facts.yml").read_text())
    script = next(play["vars"]["facts_probe_script"] for play in plays if "facts_probe_script" in play.get("vars", {}))
    section = script.split("echo '### nvml_library'", 1)[1].split("echo '###", 1)[0]
    lib = tmp_path / "nvidia" / "lib64"
    lib.mkdir(parents=True)
    (lib / "libnvidia-ml.so.580.159.04").write_bytes(b"")
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.580.159.04")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ldconfig").write_text(f"#!/bin/sh\necho '\tlibnvidia-ml.so.1 (libc6,x86-64) => {lib}/libnvidia-ml.so.1'\n")
    (bin_dir / "ldconfig").chmod(0o755)
    out = subprocess.run(["bash", "-c", section], capture_output=True, text=True,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"}).stdout
    assert parse_nvml_library(out) == "580.159.04", out
