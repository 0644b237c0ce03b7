"""scripts/gpu-verify.sh's steps (scripts/gpu_verify.py): what they read of the tools' output,
the Horovod build they start, and how they say what they found."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def _load():
    spec = importlib.util.spec_from_file_location("gpu_verify", ROOT / "scripts" / "gpu_verify.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_verify"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gv = _load()


def context(tmp_path: Path, gpu: dict | None = None):
    return gv.Context(work=tmp_path, carry=tmp_path / "carry", out=tmp_path / "out", python="/venv/bin/python",
                      gpu=gpu if gpu is not None else {"torch": "2.13.0+cpu", "cuda": False})


def test_the_play_recap_of_the_host_is_read_from_ansibles_own_output():
    text = ("PLAY RECAP *********\n"
            "localhost                  : ok=42   changed=1    unreachable=0    failed=0    skipped=17   rescued=0\n")
    assert gv.recap_changed(text) == {"ok": 42, "changed": 1, "unreachable": 0, "failed": 0, "skipped": 17}
    assert gv.recap_changed("no recap at all") == {}


def test_a_failure_is_said_with_its_most_telling_line():
    text = "$ cmd\nbuilding\nerror: nccl.h: No such file\nmake: *** [all] Error 2\ncleaning up\n"
    assert gv.last_line(text, r"error") == "make: *** [all] Error 2"
    assert gv.last_line("just output\nthe end\n", r"error") == "the end"
    assert gv.last_line("") == "no output"


def _role_build_keys() -> set[str]:
    """Every variable the horovod role's build sets (its preflight's env, its build start's)."""
    preflight = (ROOT / "roles" / "horovod" / "tasks" / "preflight.yml").read_text()
    build = (ROOT / "roles" / "horovod" / "tasks" / "build_start.yml").read_text()
    return set(re.findall(r"'((?:HOROVOD|CMAKE)_[A-Z_]+)'", preflight + build)) | {"MAKEFLAGS"}


def test_the_build_sets_what_the_horovod_role_sets_with_nccl_from_the_wheel(tmp_path):
    nccl = tmp_path / "site" / "nvidia" / "nccl"
    (nccl / "lib").mkdir(parents=True)
    (nccl / "lib" / "libnccl.so.2").write_bytes(b"")
    ctx = context(tmp_path, {"torch": "2.11.0+cu130", "cuda": True, "capability": "90"})
    env = gv.horovod_build_env(ctx, Path("/usr/local/cuda-13.0"), nccl)
    # Either side of each with/without pair: the role chooses by its variables, this by the machine.
    role = {key.replace("WITHOUT_", "WITH_") for key in _role_build_keys()}
    mine = {key.replace("WITHOUT_", "WITH_") for key in env}
    assert role <= mine, role - mine
    assert env["HOROVOD_GPU_OPERATIONS"] == "NCCL" and env["HOROVOD_CUDA_HOME"] == "/usr/local/cuda-13.0"
    assert env["HOROVOD_NCCL_INCLUDE"] == str(nccl / "include") and env["HOROVOD_BUILD_CUDA_CC_LIST"] == "90"
    # The wheel has libnccl.so.2 only: the build gets the name CMake looks for beside it.
    assert (Path(env["HOROVOD_NCCL_LIB"]) / "libnccl.so").resolve() == (nccl / "lib" / "libnccl.so.2").resolve()


def test_without_nvcc_or_nccl_the_build_has_no_gpu_operations(tmp_path):
    env = gv.horovod_build_env(context(tmp_path), None, None)
    assert "HOROVOD_GPU_OPERATIONS" not in env and env["HOROVOD_WITH_PYTORCH"] == "1"


def test_the_role_patch_and_cxx17_line_the_build_applies_are_the_roles():
    defaults = gv.horovod_defaults()
    for patch in defaults["horovod_source_patches"]:
        assert (ROOT / "roles" / "horovod" / "files" / patch).is_file()
    build = (ROOT / "roles" / "horovod" / "tasks" / "build_start.yml").read_text()
    assert r"set\(CMAKE_CXX_STANDARD 14\)" in build and "set(CMAKE_CXX_STANDARD 17)" in build


def test_allreduce_figures_come_from_its_biggest_message():
    records = [{"size_bytes": 2**20, "busbw_gbps": 1.0, "algbw_gbps": 2.0, "device": "cuda"},
               {"size_bytes": 2**28, "busbw_gbps": 300.0, "algbw_gbps": 400.0, "device": "cuda"}]
    assert gv.summarize(records) == {"device": "cuda", "busbw_gbps": 300.0, "algbw_gbps": 400.0, "size_bytes": 2**28}


def test_the_table_marks_each_step_and_shows_its_figures():
    steps = [gv.Step("machine", True, "NVIDIA H200, torch 2.11.0+cu130"),
             gv.Step("train mnist", False, "no GPU: ran on cpu", 12.34, {"device": "cpu", "samples_per_s": 877.123})]
    text = gv.table(steps)
    assert "machine      ✓       0.0  NVIDIA H200" in text
    assert "train mnist  ✗      12.3  no GPU: ran on cpu [device cpu; samples_per_s 877.1]" in text


@pytest.mark.parametrize("args", [["--bogus"], ["--python", "/no/such/python"]])
def test_bad_arguments_get_one_line_and_exit_2(args, tmp_path):
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-verify.sh"), *args, "--work", str(tmp_path / "w")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("gpu-verify: ")


@pytest.mark.parametrize("kind", ["folder", "link"])
def test_a_work_folder_no_earlier_run_made_is_refused_and_left_as_it_is(kind, tmp_path):
    # It is removed and made anew: a folder someone else made first (a shared /tmp), a link, or
    # one of the user's own that holds other things must never be.
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep").write_text("mine")
    work = theirs if kind == "folder" else tmp_path / "link"
    if kind == "link":
        work.symlink_to(theirs)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-verify.sh"), "--work", str(work)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"gpu-verify: --work {work} exists") and (theirs / "keep").read_text() == "mine"


def test_the_prepare_script_refuses_a_python_ansible_cannot_run_on():
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-verify-prepare.sh"), "--python", "3.9"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "3.11 or newer" in done.stderr
