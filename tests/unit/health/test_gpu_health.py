"""The GPU health gate of `pycli check --deep`: its parsers on what real machines printed
(tests/fixtures/recorded, sources in its README), and the node's side of the probe run by bash."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from pycli.core.errors import BadInput
from pycli.health.gates import FAIL, PASS, SKIP
from pycli.health.gpu_health import MARK, Section, evaluate_gpu_health, evaluate_node, health_command, split_sections
from pycli.health.options import check_options
from pycli_node.gpu_reports import parse_dcgm_diag, parse_nvidia_smi_q, parse_smi_tree, parse_xids
from tests.conftest import ROOT

RECORDED = ROOT / "tests" / "fixtures" / "recorded"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def under_a_gpu(excerpt: str, bus_id: str = "00000000:3B:00.0") -> str:
    """An excerpt published without its `GPU <bus id>` line, put back under one as nvidia-smi prints it."""
    return f"GPU {bus_id}\n" + textwrap.indent(excerpt, "    ")


# --- nvidia-smi -q ---------------------------------------------------------------------------


def test_a_healthy_a10g_has_ecc_on_no_uncorrectable_errors_and_no_slowdown():
    [gpu] = parse_nvidia_smi_q(recorded("nvidia-smi-q-a10g-535.txt"))
    assert (gpu.index, gpu.bus_id, gpu.name, gpu.ecc) == (0, "00000000:00:1E.0", "NVIDIA A10G", "Enabled")
    assert (gpu.volatile_uncorrectable, gpu.volatile_correctable) == (0, 0)
    assert (gpu.aggregate_uncorrectable, gpu.aggregate_correctable) == (0, 1)
    assert not (gpu.remap_pending or gpu.remap_failed or gpu.retirement_pending or gpu.reset_required)
    assert gpu.slowdowns == () and gpu.problems() == []
    assert gpu.notes() == ["1 correctable ECC error(s) in its lifetime"]  # shown, not held against it


def test_a_geforce_without_ecc_reads_as_no_counts_not_as_zero_errors():
    [gpu] = parse_nvidia_smi_q(recorded("nvidia-smi-q-rtx3090-535.txt"))
    assert gpu.ecc == "N/A" and gpu.volatile_uncorrectable is None and gpu.aggregate_correctable is None
    assert gpu.name == "NVIDIA GeForce RTX 3090" and gpu.problems() == [] and gpu.notes() == []
    tree = parse_smi_tree(recorded("nvidia-smi-q-rtx3090-535.txt"))
    assert tree["GPU 00000000:04:00.0"]["Remapped Rows"] == "N/A"  # a section printed as one value


def test_a_pending_row_remap_after_xid_63_is_a_problem_and_the_correctable_errors_a_note():
    [gpu] = parse_nvidia_smi_q(recorded("nvidia-smi-q-a100-remap-pending.txt"))
    assert gpu.name == "NVIDIA A100-SXM4-80GB" and gpu.remap_pending and not gpu.remap_failed
    assert gpu.volatile_correctable == 177 and gpu.volatile_uncorrectable == 0
    assert gpu.problems() == ["a row remap is pending: reset the GPU (or reboot) to apply it"]


def test_a_power_brake_under_the_older_throttle_heading_is_a_slowdown():
    [gpu] = parse_nvidia_smi_q(under_a_gpu(recorded("nvidia-smi-q-v100-power-brake.txt")))
    assert gpu.slowdowns == ("HW Slowdown", "HW Power Brake Slowdown")
    assert gpu.problems() == ["clocks held down by HW Slowdown, HW Power Brake Slowdown"]


def test_idle_and_a_power_cap_are_not_slowdowns():
    text = under_a_gpu("Clocks Event Reasons\n    Idle                              : Active\n"
                       "    SW Power Cap                      : Active\n"
                       "    SW Thermal Slowdown               : Not Active\n")
    assert parse_nvidia_smi_q(text)[0].slowdowns == ()


def test_uncorrectable_errors_of_the_newest_layout_and_the_single_double_bit_layout_are_counted():
    newest = recorded("nvidia-smi-q-a10g-535.txt").replace(
        "            SRAM Uncorrectable SEC-DED    : 0\n            DRAM Correctable              : 0\n"
        "            DRAM Uncorrectable            : 0\n        Aggregate",
        "            SRAM Uncorrectable SEC-DED    : 1\n            DRAM Correctable              : 0\n"
        "            DRAM Uncorrectable            : 2\n        Aggregate")
    assert parse_nvidia_smi_q(newest)[0].volatile_uncorrectable == 3
    older = under_a_gpu(textwrap.dedent("""\
        ECC Errors
            Volatile
                Single Bit
                    Device Memory             : 4
                    Register File             : 0
                    Total                     : 4
                Double Bit
                    Device Memory             : 1
                    Register File             : 0
                    Total                     : 1
        """))
    [gpu] = parse_nvidia_smi_q(older)
    assert (gpu.volatile_uncorrectable, gpu.volatile_correctable) == (1, 4)  # the Totals, not twice
    assert gpu.problems() == ["1 uncorrectable ECC error(s) since the last reset"]


# --- Xid ---------------------------------------------------------------------------------------


def test_xids_are_read_with_their_device_and_the_hardware_ones_named():
    xids = parse_xids("[  12.3] random line\n" + recorded("kernel-log-xid.txt"))
    assert [(x.device, x.code) for x in xids] == [("PCI:0000:10:1c", 63), ("PCI:0000:3b:00", 79)]
    assert xids[0].hardware is None and xids[1].hardware == "GPU has fallen off the bus"
    assert xids[1].detail == "pid=1234, GPU has fallen off the bus."


# --- dcgmi diag -j -----------------------------------------------------------------------------


def test_dcgm_3_json_after_a_stray_line_with_nulls_between_tests_all_pass():
    report = parse_dcgm_diag(recorded("dcgmi-diag-3.1.0-r1.json"))
    assert report.version == "3.1.0" and len(report.results) == 9 + 8
    assert report.against == [] and all(result.passed for result in report.results)
    assert report.results[0].entity == "0,1,2,3,4,5,6,7" and report.results[-1].entity == "7"


def test_dcgm_4_json_names_the_failed_test_with_dcgms_own_words():
    report = parse_dcgm_diag(recorded("dcgmi-diag-4.2.3-r1-gb10.json"))
    assert report.version == "4.2.3"
    [failure] = report.against
    assert (failure.category, failure.test, failure.entity, failure.status) == ("Deployment", "software", "0", "Fail")
    assert failure.describe().startswith("dcgmi software Fail on GPU 0: Persistence Mode: Persistence mode for GPU 0 is disabled.")


@pytest.mark.parametrize("status", ["Inconclusive", "", "aborted"])
def test_a_status_word_dcgm_never_used_is_not_read_as_a_pass(status):
    report = parse_dcgm_diag('{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": '
                             f'[{{"name": "memory", "results": [{{"entity_id": 1, "status": "{status}"}}]}}]}}]}}}}')
    assert [r.test for r in report.against] == ["memory"]


@pytest.mark.parametrize("text", ["", "Error: unable to connect to host engine at localhost.", "{not json", '{"DCGM Diagnostic": {}}'])
def test_output_without_results_is_an_error_never_a_pass(text):
    with pytest.raises(ValueError):
        parse_dcgm_diag(text)


# --- a node and the gate -----------------------------------------------------------------------


def _sections(smi: str, xid: str = "", dcgmi: tuple[str, int] | None = None) -> dict[str, Section]:
    found = {"nvidia-smi": Section(smi, 0), "xid": Section(xid, 0)}
    if dcgmi is not None:
        found["dcgmi"] = Section(*dcgmi)
    return found


def test_the_gate_names_exactly_the_sick_node_with_every_reason():
    healthy = evaluate_node("node1", _sections(recorded("nvidia-smi-q-a10g-535.txt"),
                                               dcgmi=(recorded("dcgmi-diag-3.1.0-r1.json"), 0)), 1)
    sick = evaluate_node("node2", _sections(recorded("nvidia-smi-q-a100-remap-pending.txt"), recorded("kernel-log-xid.txt"),
                                            (recorded("dcgmi-diag-4.2.3-r1-gb10.json"), 226)), 1)
    assert healthy.problems == [] and healthy.notes == ["GPU 0 (NVIDIA A10G, 00000000:00:1E.0): 1 correctable ECC error(s) in its lifetime"]
    assert sick.problems[0] == "GPU 0 (NVIDIA A100-SXM4-80GB, 00000000:10:1C.0): a row remap is pending: reset the GPU (or reboot) to apply it"
    assert sick.problems[1].startswith("Xid 79 x1 this boot (PCI:0000:3b:00: pid=1234, GPU has fallen off the bus.)")
    assert sick.problems[2].startswith("dcgmi software Fail on GPU 0: Persistence Mode")
    assert any(note.startswith("Xid 63 x1") for note in sick.notes)  # a recording event, not a fault
    result, suspects = evaluate_gpu_health([healthy, sick], {}, 1)
    assert result.status == FAIL and list(suspects) == ["node2"] and "node1" not in result.message
    assert result.figure == "2 GPUs on 2 nodes: ECC, row remapping, clock events, Xids; dcgmi diag -r 1 on 2"


def test_without_dcgm_a_gpu_node_passes_with_a_note_and_without_gpus_the_gate_is_skipped():
    node = evaluate_node("node1", _sections(recorded("nvidia-smi-q-rtx3090-535.txt")), 1)
    assert node.problems == [] and node.notes[-1].startswith("DCGM is not installed")
    assert evaluate_gpu_health([node], {}, 1)[0].status == PASS
    assert evaluate_node("node2", {"none": Section("")}, 1) is None
    assert evaluate_gpu_health([], {}, 1)[0].status == SKIP


def test_dcgmi_that_printed_no_document_is_a_problem_saying_how_it_ended():
    node = evaluate_node("node1", _sections(recorded("nvidia-smi-q-a10g-535.txt"), dcgmi=("", 124)), 2)
    assert node.problems == ["dcgmi diag -r 2 gave no results (timed out; dcgmi printed no JSON)"]


def test_dcgm_level_is_checked_before_any_node_is_touched():
    options = dict(busbw_floor_gbps=0, controller="gloo", allreduce_size="64M", controllers="gloo", cuda_image="img")
    assert check_options(**options, deep=True, dcgm_level=3).dcgm_level == 3
    with pytest.raises(BadInput, match="--dcgm-level 5"):
        check_options(**options, deep=True, dcgm_level=5)


# --- the node's side, run by bash ----------------------------------------------------------------


def _tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _run(command: str, path: str) -> str:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True,
                          env={**os.environ, "PATH": path}).stdout


def test_the_probe_splits_what_each_tool_printed_with_its_exit_status(tmp_path):
    """Real bash runs health_command against stand-in tools that print the recorded output."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "nvidia-smi", f"cat {RECORDED / 'nvidia-smi-q-a100-remap-pending.txt'}\n")
    _tool(bin_dir, "sudo", "exit 1\n")
    _tool(bin_dir, "journalctl", f"echo 'kernel: unrelated'; cat {RECORDED / 'kernel-log-xid.txt'}\n")
    _tool(bin_dir, "dcgmi", f"echo 'Successfully ran diagnostic for group.'; cat {RECORDED / 'dcgmi-diag-4.2.3-r1-gb10.json'}; exit 226\n")
    path = f"{bin_dir}:/usr/bin:/bin"
    sections = split_sections(_run(health_command(1), path).replace("\n", "\r\n"))  # as through ssh -tt
    assert set(sections) == {"nvidia-smi", "xid", "dcgmi"}
    assert sections["nvidia-smi"].rc == 0 and sections["dcgmi"].rc == 226
    assert [x.code for x in parse_xids(sections["xid"].text)] == [63, 79]
    assert parse_dcgm_diag(sections["dcgmi"].text).version == "4.2.3"
    assert "dcgmi" not in split_sections(_run(health_command(0), path))  # --dcgm-level 0
    (bin_dir / "nvidia-smi").unlink()
    assert split_sections(_run(health_command(1), path)) == {"none": Section("")}
    assert MARK in health_command(1)


# What an unprivileged login user meets: dmesg with dmesg_restrict=1 says this and exits 1 (run as
# nobody on this project's Debian 12 test machine, 2026-11-26, where journalctl -k also printed
# nothing and exited 0); journalctl -k outside adm/systemd-journal exits 0 with no kernel line and
# systemd's hint on stderr.
NO_SUDO = "echo 'sudo: a password is required' >&2; exit 1\n"
DMESG_DENIED = "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1\n"
JOURNAL_HINT = ("echo 'Hint: You are currently not seeing messages from other users and the system.' >&2; "
                "echo \"      Users in groups 'adm', 'systemd-journal' can see all messages.\" >&2; ")


def _probe_node(tmp_path: Path, journalctl: str, dmesg: str, sudo: str = NO_SUDO) -> tuple[dict[str, Section], str]:
    """health_command run by bash against stand-in tools, stderr merged into stdout as under ssh -tt."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "nvidia-smi", f"cat {RECORDED / 'nvidia-smi-q-h200-580.txt'}\n")
    _tool(bin_dir, "sudo", sudo)
    _tool(bin_dir, "journalctl", journalctl)
    _tool(bin_dir, "dmesg", dmesg)
    out = subprocess.run(["bash", "-c", health_command(0)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         check=True, env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}).stdout
    return split_sections(out.replace("\n", "\r\n")), out


@pytest.mark.parametrize("journal", ["echo '-- No entries --'\n", "\n"], ids=["no-entries", "nothing"])
def test_a_kernel_log_the_login_user_cannot_read_fails_the_gate_without_draining_the_node(tmp_path, journal):
    sections, out = _probe_node(tmp_path, JOURNAL_HINT + journal, DMESG_DENIED)
    node = evaluate_node("gpu1", sections, 0)
    assert node.problems == [] and node.xids == []
    assert node.unread == ["the kernel log could not be read (dmesg: read kernel buffer failed: Operation not permitted): "
                           "its Xids are unknown"], out
    result, suspects = evaluate_gpu_health([node], {}, 0)
    assert result.status == FAIL and suspects == {}  # nothing is known against the node: --fence leaves it
    assert result.message.startswith("gpu1: the kernel log could not be read (dmesg: read kernel buffer failed")
    assert "group adm or systemd-journal" in result.message
    assert node.as_json()["unread"] == node.unread


def _xid(code: int, pid: int, detail: str, device: str = "PCI:0000:3b:00") -> str:
    return f"NVRM: Xid ({device}): {code}, pid={pid}, {detail}"


def test_a_hardware_xid_before_a_flood_of_program_xids_is_counted_over_the_whole_boot(tmp_path):
    log = tmp_path / "kernel.log"
    lines = ["Linux version 6.8.0", _xid(79, 1234, "GPU has fallen off the bus."), _xid(48, 1234, "DBE (0x1,0x2).")]
    lines += [_xid(13, 2000 + i, "Graphics Exception: ESR 0x404600=0x80000002", "PCI:0000:10:1c") for i in range(600)]
    lines += [_xid(31, 3000 + i, "Ch 00000008, intr 00000000. MMU Fault") for i in range(300)] + ["eth0: link up"]
    log.write_text("\n".join(lines) + "\n")
    sections, out = _probe_node(tmp_path, JOURNAL_HINT + f"cat {log}\n", DMESG_DENIED)
    assert len(sections["xid"].text.splitlines()) == 4, out  # a count per device and code comes back, not the flood
    node = evaluate_node("gpu1", sections, 0)
    assert node.unread == []
    assert node.problems == [
        "Xid 48 x1 this boot (PCI:0000:3b:00: pid=1234, DBE (0x1,0x2).): double-bit ECC error",
        "Xid 79 x1 this boot (PCI:0000:3b:00: pid=1234, GPU has fallen off the bus.): GPU has fallen off the bus"]
    assert node.notes == ["Xid 13 x600 this boot (PCI:0000:10:1c: pid=2599, Graphics Exception: ESR 0x404600=0x80000002)",
                          "Xid 31 x300 this boot (PCI:0000:3b:00: pid=3299, Ch 00000008, intr 00000000. MMU Fault)"]
    result, suspects = evaluate_gpu_health([node], {}, 0)
    assert result.status == FAIL and list(suspects) == ["gpu1"]


def test_an_empty_journal_falls_back_to_dmesg_and_the_h200s_boot_log_passes(tmp_path):
    """A journal that holds no kernel line (journald not reading it) is not read as a clean log: dmesg is."""
    sections, out = _probe_node(tmp_path, "echo '-- No entries --'\n", f"cat {RECORDED / 'kernel-log-h200-580.txt'}\n")
    node = evaluate_node("gpu1", sections, 0)
    assert sections["xid"] == Section("", 0), out
    assert node.unread == [] and node.problems == []
    assert evaluate_gpu_health([node], {}, 0)[0].status == PASS


def test_a_probe_output_cut_before_the_kernel_log_is_not_a_pass():
    node = evaluate_node("gpu1", {"nvidia-smi": Section(recorded("nvidia-smi-q-h200-580.txt"), 0)}, 0)
    assert node.unread == ["the kernel log could not be read (the probe printed no kernel log section): its Xids are unknown"]


# --- A real H200 and a real H100, read on machines lent to this project (2026-11-26) ----------

LENT = pytest.mark.parametrize(("machine", "name"), [("h200", "NVIDIA H200"), ("h100", "NVIDIA H100 80GB HBM3")])


@LENT
def test_a_healthy_gpu_on_the_open_kernel_module_has_no_problems_and_no_notes(machine, name):
    [gpu] = parse_nvidia_smi_q(recorded(f"nvidia-smi-q-{machine}-580.txt"))
    assert (gpu.index, gpu.bus_id, gpu.name, gpu.ecc) == (0, "00000000:00:06.0", name, "Enabled")
    assert (gpu.volatile_uncorrectable, gpu.aggregate_uncorrectable) == (0, 0)
    assert not (gpu.remap_pending or gpu.remap_failed or gpu.retirement_pending or gpu.reset_required)
    assert gpu.slowdowns == () and gpu.problems() == [] and gpu.notes() == []


@LENT
def test_the_boot_log_has_driver_lines_but_no_xid(machine, name):
    log = recorded(f"kernel-log-{machine}-580.txt")
    assert "NVRM: loading NVIDIA UNIX Open Kernel Module" in log
    assert parse_xids(log) == []


@LENT
def test_the_node_passes_the_health_gate_without_dcgm(machine, name):
    node = evaluate_node("gpu1", _sections(recorded(f"nvidia-smi-q-{machine}-580.txt")), 0)
    result, suspects = evaluate_gpu_health([node], {}, 0)
    assert result.status == PASS and suspects == {}, result
