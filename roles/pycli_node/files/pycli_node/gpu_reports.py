"""Parsers of what NVIDIA's tools print, one home each: `nvidia-smi -L` (the GPUs listed),
`nvidia-smi -q` (per GPU: ECC counts, row remapping, page retirement, a reset asked for,
slowdown clock events), the driver's
`NVRM: Xid` kernel log lines, and `dcgmi diag -j` of DCGM 3 ("DCGM GPU Diagnostic") and DCGM 4
("DCGM Diagnostic"). Pure functions over text; tests/unit/health/test_gpu_health.py runs them on
output recorded on real machines (tests/fixtures/recorded). The gate that uses them:
pycli/health/gpu_health.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The driver's Xid codes that mean the hardware, not the program, went wrong (NVIDIA's Xid
# catalogue); any other Xid (13, 31, 43: a program's fault) is shown but passes.
HARDWARE_XIDS = {
    48: "double-bit ECC error",
    64: "row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


# --- nvidia-smi -L ------------------------------------------------------------------------------


def count_listed_gpus(text: str) -> int:
    """The GPUs `nvidia-smi -L` lists, one "GPU N: NAME (UUID: ...)" line each (MIG devices are
    indented beneath theirs and not counted), as the job stage script counts them."""
    return sum(1 for line in text.splitlines() if line.startswith("GPU "))


# --- nvidia-smi -q ------------------------------------------------------------------------------

_KEY_VALUE = re.compile(r"^(?P<key>\S.*?)\s+:\s?(?P<value>.*)$")
_BUS_ID = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])$")


def parse_smi_tree(text: str) -> dict[str, Any]:
    """`nvidia-smi -q` as nested dicts: a line without " : " opens a section holding the lines
    indented under it; a value that is a section's only content (`Remapped Rows : N/A`) stays a string."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for line in text.replace("\r\n", "\n").split("\n"):
        stripped = line.strip()
        if not stripped or stripped.startswith("====="):
            continue
        indent = len(line) - len(line.lstrip())
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if match := _KEY_VALUE.match(stripped):
            parent[match["key"]] = match["value"].strip()
        else:
            section: dict[str, Any] = {}
            parent[stripped] = section
            stack.append((indent, section))
    return root


@dataclass(frozen=True)
class GpuState:
    """What one GPU's `nvidia-smi -q` block says about its health."""

    index: int
    bus_id: str
    name: str
    ecc: str  # Enabled, Disabled or N/A
    volatile_uncorrectable: int | None
    volatile_correctable: int | None
    aggregate_uncorrectable: int | None
    aggregate_correctable: int | None
    retirement_pending: bool
    remap_pending: bool
    remap_failed: bool
    reset_required: bool
    slowdowns: tuple[str, ...]  # clock event reasons that are slowdowns, active now

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.name}, {self.bus_id})"

    def problems(self) -> list[str]:
        found = []
        if self.volatile_uncorrectable:
            found.append(f"{self.volatile_uncorrectable} uncorrectable ECC error(s) since the last reset")
        if self.remap_failed:
            found.append("a row remapping failed: the GPU needs replacing")
        if self.remap_pending:
            found.append("a row remap is pending: reset the GPU (or reboot) to apply it")
        if self.retirement_pending:
            found.append("a page retirement is pending: reset the GPU (or reboot) to apply it")
        if self.reset_required:
            found.append("the driver asks for a GPU reset")
        if self.slowdowns:
            found.append(f"clocks held down by {', '.join(self.slowdowns)}")
        return found

    def notes(self) -> list[str]:
        counts = [(self.volatile_correctable, "correctable ECC error(s) since the last reset"),
                  (self.aggregate_uncorrectable, "uncorrectable ECC error(s) in its lifetime"),
                  (self.aggregate_correctable, "correctable ECC error(s) in its lifetime")]
        return [f"{count} {what}" for count, what in counts if count]


def _number(value: object) -> int | None:
    return int(value) if isinstance(value, str) and value.strip().isdigit() else None


def _ecc_counts(section: object) -> tuple[int | None, int | None]:
    """(uncorrectable, correctable) of an `ECC Errors > Volatile|Aggregate` section; None where
    the GPU has no ECC (N/A). Older drivers split by Single/Double Bit with a Total each."""
    if not isinstance(section, dict):
        return None, None
    uncorrectable = correctable = None

    def add(total: int | None, count: int | None) -> int | None:
        return total if count is None else (total or 0) + count

    for key, value in section.items():
        lowered = key.lower()
        if isinstance(value, dict):  # Single Bit / Double Bit: their Total, else every location
            count = _number(value.get("Total")) if "Total" in value else None
            if count is None and "Total" not in value:
                numbers = [n for n in (_number(v) for v in value.values()) if n is not None]
                count = sum(numbers) if numbers else None
            if "double" in lowered:
                uncorrectable = add(uncorrectable, count)
            elif "single" in lowered:
                correctable = add(correctable, count)
        elif "uncorrectable" in lowered:
            uncorrectable = add(uncorrectable, _number(value))
        elif "correctable" in lowered:
            correctable = add(correctable, _number(value))
    return uncorrectable, correctable


def _yes(section: object, key: str) -> bool:
    return isinstance(section, dict) and str(section.get(key, "")).strip().lower() == "yes"


def gpu_state(index: int, bus_id: str, block: Mapping[str, Any]) -> GpuState:
    errors = block.get("ECC Errors") or {}
    volatile = _ecc_counts(errors.get("Volatile") if isinstance(errors, dict) else None)
    aggregate = _ecc_counts(errors.get("Aggregate") if isinstance(errors, dict) else None)
    ecc_mode = block.get("ECC Mode")
    reasons = block.get("Clocks Event Reasons") or block.get("Clocks Throttle Reasons") or {}
    slowdowns = tuple(key for key, value in reasons.items()
                      if isinstance(value, str) and "slowdown" in key.lower() and value.strip().lower() == "active") \
        if isinstance(reasons, dict) else ()
    reset = block.get("GPU Reset Status")
    return GpuState(
        index=index, bus_id=bus_id, name=str(block.get("Product Name", "GPU")),
        ecc=str(ecc_mode.get("Current", "N/A")) if isinstance(ecc_mode, dict) else "N/A",
        volatile_uncorrectable=volatile[0], volatile_correctable=volatile[1],
        aggregate_uncorrectable=aggregate[0], aggregate_correctable=aggregate[1],
        retirement_pending=_yes(block.get("Retired Pages"), "Pending Page Blacklist")
        or _yes(block.get("Retired Pages"), "Pending Page Retirement"),
        remap_pending=_yes(block.get("Remapped Rows"), "Pending"),
        remap_failed=_yes(block.get("Remapped Rows"), "Remapping Failure Occurred"),
        reset_required=_yes(reset, "Reset Required") or _yes(reset, "Drain and Reset Recommended"),
        slowdowns=slowdowns,
    )


# NVML's clock event reasons that are slowdowns, by bit (nvmlClocksEventReason*; the bitmask
# `nvidia-smi --query-gpu=clocks_throttle_reasons.active` prints and dcgm-exporter's
# DCGM_FI_DEV_CLOCKS_EVENT_REASONS holds), named as `nvidia-smi -q` names them. The other bits
# (GPU idle, application clocks, the software power cap, sync boost) are no fault.
SLOWDOWN_BITS = {0x8: "HW Slowdown", 0x20: "SW Thermal Slowdown", 0x40: "HW Thermal Slowdown", 0x80: "HW Power Brake Slowdown"}


def slowdowns_of(mask: int) -> tuple[str, ...]:
    """The slowdowns active in a clock event reasons bitmask."""
    return tuple(name for bit, name in SLOWDOWN_BITS.items() if mask & bit)


def parse_nvidia_smi_q(text: str) -> list[GpuState]:
    """Every GPU of an `nvidia-smi -q` report, in its order (the index nvidia-smi gives it)."""
    tree = parse_smi_tree(text)
    states: list[GpuState] = []
    for key, block in tree.items():
        if (match := _BUS_ID.match(key)) and isinstance(block, dict):
            states.append(gpu_state(len(states), match[1], block))
    return states


# --- kernel log: Xid --------------------------------------------------------------------------

_XID = re.compile(r"NVRM: Xid \((?P<device>[^)]*)\): (?P<code>\d+)(?:, (?P<detail>.*))?")
_COUNTED = re.compile(r"^(?P<count>\d+)\s+(?=\S)")


@dataclass(frozen=True)
class Xid:
    device: str
    code: int
    detail: str  # of the latest report
    count: int = 1  # reports of this code from this device

    @property
    def hardware(self) -> str | None:
        return HARDWARE_XIDS.get(self.code)


def parse_xids(text: str) -> list[Xid]:
    """Kernel log lines, or the GPU health probe's "COUNT<tab>latest line" per device and code."""
    xids = []
    for line in text.splitlines():
        if match := _XID.search(line):
            counted = _COUNTED.match(line)
            xids.append(Xid(match["device"], int(match["code"]), (match["detail"] or "").strip(),
                            int(counted["count"]) if counted else 1))
    return xids


# --- dcgmi diag -j ----------------------------------------------------------------------------

PASS_WORDS = {"pass", "passed"}
HARMLESS_WORDS = {"skip", "skipped", "not run", "notrun", "warn", "warning"}


@dataclass(frozen=True)
class DiagResult:
    category: str
    test: str
    entity: str  # the GPU(s) it is about, as DCGM names them
    status: str  # DCGM's word, as printed
    warnings: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.status.strip().lower() in PASS_WORDS

    @property
    def counts_against(self) -> bool:
        """Failed, or a word this parser does not know (never read as a pass)."""
        return not self.passed and self.status.strip().lower() not in HARMLESS_WORDS

    def describe(self) -> str:
        said = f": {'; '.join(self.warnings)}" if self.warnings else ""
        return f"dcgmi {self.test} {self.status} on GPU {self.entity}{said}"


@dataclass(frozen=True)
class DiagReport:
    version: str
    results: tuple[DiagResult, ...]

    @property
    def against(self) -> list[DiagResult]:
        return [result for result in self.results if result.counts_against]


def _warning_text(item: object) -> str:
    if isinstance(item, dict):
        return str(item.get("warning") or item.get("message") or json.dumps(item))
    return str(item)


def _entity(result: Mapping[str, Any]) -> str:
    if "entity_id" in result:
        group = result.get("entity_group", "GPU")
        return str(result["entity_id"]) if group == "GPU" else f"{group} {result['entity_id']}"
    return str(result.get("gpu_ids", result.get("gpu_id", "?")))


def parse_dcgm_diag(text: str) -> DiagReport:
    """`dcgmi diag -j` of DCGM 3 or 4, after whatever lines dcgmi printed before its JSON.

    ValueError when there is no such document: the caller says dcgmi failed, it never passes."""
    start = text.find("{")
    if start < 0:
        raise ValueError("dcgmi printed no JSON")
    try:
        document, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        raise ValueError(f"dcgmi's JSON does not parse: {exc}") from None
    root = document.get("DCGM GPU Diagnostic") or document.get("DCGM Diagnostic") or document
    categories = root.get("test_categories") if isinstance(root, dict) else None
    if categories is None and isinstance(root, dict) and isinstance(root.get("tests"), list):
        categories = [{"category": "", "tests": root["tests"]}]
    if not isinstance(categories, list):
        raise ValueError("dcgmi's JSON holds no test results")
    results = []
    for category in categories:
        if not isinstance(category, dict):
            continue
        for test in category.get("tests") or []:
            if not isinstance(test, dict):  # DCGM 3 printed null between tests
                continue
            for result in test.get("results") or []:
                if isinstance(result, dict):
                    results.append(DiagResult(
                        str(category.get("category", "")), str(test.get("name", "?")), _entity(result),
                        str(result.get("status", "")),
                        tuple(_warning_text(w) for w in result.get("warnings") or [] if w),
                    ))
    if not results:
        raise ValueError("dcgmi's JSON holds no test results")
    metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
    version = str(metadata.get("version") or (root.get("version") if isinstance(root, dict) else "") or "")
    return DiagReport(version, tuple(results))
