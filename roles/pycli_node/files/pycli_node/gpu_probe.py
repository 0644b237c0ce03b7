"""The GPU health probe of one node, on its own: the command that reads what the GPUs say about
themselves and the verdict on its output. Standard library and pycli_node.gpu_reports only, so the
same files run on a node without pycli: `pycli check --deep` sends the command over SSH and
judges here (pycli/health/gpu_health.py); Slurm's health check, prolog and epilog run them on
the node (pycli_node.node_gate, which Slurm runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pycli_node.gpu_reports import DiagReport, GpuState, Xid, parse_dcgm_diag, parse_nvidia_smi_q, parse_xids

MARK = "@@pycli-gpu"
# How long each level may take on an 8-GPU node before the check gives up on it (DCGM's
# documented run times are about 1 min, a few min, 30 min and 1 to 2 hours).
DCGM_TIMEOUT_S = {1: 300, 2: 900, 3: 3600, 4: 3 * 3600}


def health_command(dcgm_level: int) -> str:
    """The node's side: each source after a marker line, each tool's exit status after it."""
    lines = [
        f"if ! command -v nvidia-smi >/dev/null 2>&1; then echo '{MARK} none'; exit 0; fi",
        f"echo '{MARK} nvidia-smi'; nvidia-smi -q; echo \"{MARK} rc $?\"",
        *xid_lines(),
    ]
    if dcgm_level:
        timeout = DCGM_TIMEOUT_S[dcgm_level]
        lines.append(f"if command -v dcgmi >/dev/null 2>&1; then echo '{MARK} dcgmi'; "
                     f"timeout {timeout} dcgmi diag -r {int(dcgm_level)} -j; echo \"{MARK} rc $?\"; fi")
    return "\n".join(lines)


def xid_lines() -> list[str]:
    """The `xid` section: this boot's Xid reports, one line per device and code."""
    return [
        f"echo '{MARK} xid'",
        # This boot's whole kernel log, reduced on the node to one line per device and Xid code
        # ("COUNT<tab>its latest line", parse_xids), so that no flood of one Xid hides another.
        # A source that gave no line at all was not read (journalctl -k exits 0 with nothing for a
        # user outside adm/systemd-journal): the next is tried, and when none gave a line the
        # section ends with rc 1 after the last one's complaint (dmesg with dmesg_restrict=1).
        "xids() { awk '/^-- / { next } { n++ } match($0, /NVRM: Xid \\([^)]*\\): [0-9]+/) {"
        " k = substr($0, RSTART, RLENGTH); if (!(k in c)) o[++m] = k; c[k]++; l[k] = $0 }"
        " END { if (!n) exit 1; for (i = 1; i <= m; i++) print c[o[i]] \"\\t\" l[o[i]] }'; }",
        "{ sudo -n journalctl -q -k -b -o cat --no-pager 2>/dev/null | xids"
        " || journalctl -q -k -b -o cat --no-pager 2>/dev/null | xids"
        " || sudo -n dmesg 2>/dev/null | xids || dmesg | xids; } 2>&1",
        f"echo \"{MARK} rc $?\"",
    ]


@dataclass(frozen=True)
class Section:
    text: str
    rc: int | None = None


def split_sections(stdout: str) -> dict[str, Section]:
    """The command's output by source; `none` alone when the node has no nvidia-smi."""
    sections: dict[str, Section] = {}
    name: str | None = None
    lines: list[str] = []

    def close(rc: int | None = None) -> None:
        if name is not None:
            sections[name] = Section("\n".join(lines), rc)

    for raw in stdout.replace("\r\n", "\n").split("\n"):
        if raw.startswith(MARK + " "):
            word = raw[len(MARK) + 1:].strip()
            if word.startswith("rc "):
                close(int(word[3:]) if word[3:].strip().isdigit() else None)
                name, lines = None, []
            else:
                close()
                name, lines = word, []
        elif name is not None:
            lines.append(raw)
    close()
    return sections


# --- a node, the gate -------------------------------------------------------------------------


@dataclass
class NodeGpuHealth:
    name: str
    gpus: list[GpuState] = field(default_factory=list)
    xids: list[Xid] = field(default_factory=list)
    diag: DiagReport | None = None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # what the probe could not read: unknown, not healthy

    def as_json(self) -> dict[str, object]:
        return {"gpus": len(self.gpus), "problems": self.problems, "notes": self.notes, "unread": self.unread,
                "xids": [{"device": x.device, "code": x.code, "count": x.count, "detail": x.detail} for x in self.xids],
                "dcgm": None if self.diag is None else {
                    "version": self.diag.version, "results": len(self.diag.results),
                    "not_passed": [r.describe() for r in self.diag.results if not r.passed]}}


def evaluate_node(name: str, sections: Mapping[str, Section], dcgm_level: int) -> NodeGpuHealth | None:
    """One node's findings; None when it has no nvidia-smi (not a GPU node)."""
    if "none" in sections or "nvidia-smi" not in sections:
        return None
    node = NodeGpuHealth(name)
    smi = sections["nvidia-smi"]
    if smi.rc != 0:
        last = [line for line in smi.text.splitlines() if line.strip()][-1:] or [f"exit {smi.rc}"]
        node.problems.append(f"nvidia-smi -q failed: {last[0].strip()}")
    node.gpus = parse_nvidia_smi_q(smi.text)
    for gpu in node.gpus:
        node.problems += [f"{gpu.label}: {problem}" for problem in gpu.problems()]
        node.notes += [f"{gpu.label}: {note}" for note in gpu.notes()]
    xid = sections.get("xid")
    if xid is None or xid.rc != 0:
        said = [line.strip() for line in (xid.text if xid else "").splitlines() if line.strip()]
        why = said[-1] if said else "the probe printed no kernel log section" if xid is None else "no line"
        node.unread.append(f"the kernel log could not be read ({why}): its Xids are unknown")
    node.xids = parse_xids(xid.text) if xid is not None else []
    for code in sorted({xid.code for xid in node.xids}):
        seen = [xid for xid in node.xids if xid.code == code]
        count = sum(xid.count for xid in seen)
        line = f"Xid {code} x{count} this boot ({seen[-1].device}: {seen[-1].detail or 'no detail'})"
        (node.problems if seen[0].hardware else node.notes).append(
            line if not seen[0].hardware else f"{line}: {seen[0].hardware}")
    if dcgm_level and "dcgmi" not in sections:
        node.notes.append("DCGM is not installed: dcgmi diag not run ('pycli provision --tags dcgm' installs it)")
    elif "dcgmi" in sections:
        dcgmi = sections["dcgmi"]
        try:
            node.diag = parse_dcgm_diag(dcgmi.text)
        except ValueError as exc:
            why = "timed out" if dcgmi.rc == 124 else f"exit {dcgmi.rc}"
            node.problems.append(f"dcgmi diag -r {dcgm_level} gave no results ({why}; {exc})")
        else:
            node.problems += [result.describe() for result in node.diag.against]
            node.notes += [result.describe() for result in node.diag.results
                           if not result.passed and not result.counts_against]
    return node
