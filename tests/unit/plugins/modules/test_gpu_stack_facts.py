"""The parsers of gpu_preflight's gpu_stack_facts module (the adopt path, gpu_adopt), on the
output recorded on a real GPU host for issue #29 (Ubuntu 24.04, driver 580.159.04 open kernel
module, CUDA 13.0, torch's nvidia-nccl-cu13 2.28.9), and the module run on a stand-in root."""

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.conftest import PLUGINS, ROOT

MODULE = PLUGINS / "modules" / "gpu_stack_facts.py"
spec = importlib.util.spec_from_file_location("gpu_stack_facts", MODULE)
assert spec and spec.loader
facts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(facts)

REAL_PROC_VERSION = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \n"
    "GCC version:  gcc version 15.3.0 (GCC) \n"
)
REAL_NVCC = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""
REAL_LDCONFIG = """\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libnvidia-ml.so.1
\tlibnvidia-ml.so.1 (libc6,x86-64) => /lib/libnvidia-ml.so.1
\tlibnvidia-ml.so (libc6,x86-64) => /usr/local/nvidia/lib64/libnvidia-ml.so
\tlibnccl.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libnccl.so.2
\tlibnccl.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libnccl.so
\tlibcuda.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so.1
"""


@pytest.mark.parametrize(("text", "expected"), [
    (REAL_PROC_VERSION, ("580.159.04", "open")),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Wed Jan 22 22:27:03 UTC 2025\n", ("570.86.15", "proprietary")),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  550.54.14  Release Build\n", ("550.54.14", "open")),
    ("", ("", "")),
    ("garbage\n", ("", "")),
])
def test_the_driver_version_file(text, expected):
    assert facts.parse_driver_version_file(text) == expected


def test_nvcc_release_and_full_version():
    assert facts.parse_nvcc_version(REAL_NVCC) == ("13.0", "13.0.88")
    assert facts.parse_nvcc_version("Cuda compilation tools, release 12.8\n") == ("12.8", "")
    assert facts.parse_nvcc_version("command not found") == ("", "")


def test_nccl_header_defines():
    assert facts.parse_nccl_header("#define NCCL_MAJOR 2\n#define NCCL_MINOR 28\n#define NCCL_PATCH 9\n") == "2.28.9"
    # The stand-in repository's header names only the major: no version rather than a wrong one.
    assert facts.parse_nccl_header("#define NCCL_MAJOR 2\n") == ""


@pytest.mark.parametrize(("path", "stem", "expected"), [
    ("/usr/local/nvidia/lib64/libnvidia-ml.so.580.159.04", "libnvidia-ml.so.", "580.159.04"),
    ("/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.9", "libnccl.so.", "2.28.9"),
    ("/usr/lib/x86_64-linux-gnu/libnccl.so.2", "libnccl.so.", ""),
    ("/usr/local/nvidia/lib64/libcuda.so.1", "libcuda.so.", ""),
])
def test_versions_in_library_file_names(path, stem, expected):
    assert facts.parse_library_version(path, stem) == expected


def test_ldconfig_cache_in_the_loaders_order():
    assert facts.parse_ldconfig(REAL_LDCONFIG, "libnvidia-ml.so.1") == [
        "/usr/local/nvidia/lib64/libnvidia-ml.so.1", "/lib/libnvidia-ml.so.1"]
    assert facts.parse_ldconfig(REAL_LDCONFIG, "libnccl.so.2") == ["/lib/x86_64-linux-gnu/libnccl.so.2"]
    assert facts.parse_ldconfig(REAL_LDCONFIG, "libnccl.so") == ["/lib/x86_64-linux-gnu/libnccl.so"]


def test_the_nccl_wheel_dist_info():
    assert facts.parse_wheel_dist_info("nvidia_nccl_cu13-2.28.9.dist-info") == ("nvidia-nccl-cu13", "2.28.9", "13")
    assert facts.parse_wheel_dist_info("nvidia_nccl_cu12-2.26.2.post1.dist-info") == ("nvidia-nccl-cu12", "2.26.2.post1", "12")
    assert facts.parse_wheel_dist_info("nvidia_cublas-13.1.0.3.dist-info") == ("", "", "")


def test_the_nvidia_smi_query():
    assert facts.parse_smi_query("580.159.04\n") == "580.159.04"
    assert facts.parse_smi_query("Failed to initialize NVML: Driver/library version mismatch\n") == ""


def test_the_module_finds_the_stand_in_wheel_and_reports_a_host_without_a_driver(tmp_path):
    """The module as Ansible runs it, on this machine (no NVIDIA driver): the driver is not loaded
    when the version file is missing, and a wheel in an extra site-packages folder is found."""
    script = ROOT / "tests/fixtures/preinstalled_gpu/make_root.sh"
    subprocess.run(["sh", str(script), str(tmp_path)], check=True, capture_output=True)
    args = {"ANSIBLE_MODULE_ARGS": {
        "driver_version_file": str(tmp_path / "nonexistent"), "module_version_file": str(tmp_path / "nonexistent"),
        "pythons": [], "site_packages_globs": [str(tmp_path / "opt/*/.venv/lib/python3*/site-packages")]}}
    out = subprocess.run([sys.executable, str(MODULE)], input=json.dumps(args), capture_output=True, text=True, timeout=120)
    result = json.loads(out.stdout)
    assert not result.get("failed"), result
    stack = result["gpu_stack"]
    assert stack["driver"]["loaded"] is False and stack["driver"]["version"] == ""
    assert stack["driver"]["version_file"] == str(tmp_path / "nonexistent")
    wheels = [w for w in stack["nccl"]["wheels"] if w["path"].startswith(str(tmp_path))]
    assert [(w["distribution"], w["version"], w["cuda_major"]) for w in wheels] == [("nvidia-nccl-cu13", "2.28.9", "13")]
    assert wheels[0]["header"].endswith("nvidia/nccl/include/nccl.h")
    assert stack["nccl"]["found"] is True
