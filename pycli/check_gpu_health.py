"""`pycli check --deep` on GPU nodes: what the GPUs say about themselves.

One SSH command per node reads three sources, each parsed by pycli/gpu_reports.py (tested on
real, recorded output in tests/fixtures/recorded):

- `nvidia-smi -q`: per GPU, the uncorrectable ECC errors since the last reset, pending page
  retirements and row remaps, a failed row remap, a reset the driver asks for, and the clock
  event (throttle) reasons that are slowdowns (thermal, power brake);
- the kernel log of this boot: the driver's `NVRM: Xid` reports, counted over the whole boot
  per device and code, the hardware ones named. A log the login user cannot read is named too:
  the gate fails without naming the node a suspect (nothing is known against it, so `--fence`
  leaves it), because a pass would vouch for Xids nobody looked at;
- `dcgmi diag -r LEVEL -j` where DCGM is installed (role dcgm): every test that did not pass,
  with DCGM's own words. DCGM 3 nests the results under "DCGM GPU Diagnostic", DCGM 4 under
  "DCGM Diagnostic"; both group tests in categories, and both are read.

A node with any of these is a suspect (`--fence` drains it). Correctable errors and Xids that
are not the hardware's are shown, not held against the node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pycli.check_gates import CheckContext, GateResult, failed, passed, skipped
from pycli.gpu_reports import DiagReport, GpuState, Xid, parse_dcgm_diag, parse_nvidia_smi_q, parse_xids

MARK = "@@pycli-gpu"
# How long each level may take on an 8-GPU node before the check gives up on it (DCGM's
# documented run times are about 1 min, a few min, 30 min and 1 to 2 hours).
DCGM_TIMEOUT_S = {1: 300, 2: 900, 3: 3600, 4: 3 * 3600}


def health_command(dcgm_level: int) -> str:
    """The node's side: each source after a marker line, each tool's exit status after it."""
    lines = [
        f"if ! command -v nvidia-smi >/dev/null 2>&1; then echo '{MARK} none'; exit 0; fi",
        f"echo '{MARK} nvidia-smi'; nvidia-smi -q; echo \"{MARK} rc $?\"",
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
    if dcgm_level:
        timeout = DCGM_TIMEOUT_S[dcgm_level]
        lines.append(f"if command -v dcgmi >/dev/null 2>&1; then echo '{MARK} dcgmi'; "
                     f"timeout {timeout} dcgmi diag -r {int(dcgm_level)} -j; echo \"{MARK} rc $?\"; fi")
    return "\n".join(lines)


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

    def as_json(self) -> dict:
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


def evaluate_gpu_health(nodes: Sequence[NodeGpuHealth], unanswered: Mapping[str, str], dcgm_level: int
                        ) -> tuple[GateResult, dict[str, str]]:
    """The gate from every GPU node's findings; the suspects, node -> its first problem."""
    if unanswered:
        return failed("gpu_health", "; ".join(f"{name}: {why}" for name, why in unanswered.items())), {}
    if not nodes:
        return skipped("gpu_health", "no NVIDIA GPU on any node"), {}
    gpus = sum(len(node.gpus) for node in nodes)
    with_dcgm = sum(node.diag is not None for node in nodes)
    dcgm = f"dcgmi diag -r {dcgm_level} on {with_dcgm}" if dcgm_level else "no dcgmi diag (--dcgm-level 0)"
    figure = f"{gpus} GPUs on {len(nodes)} nodes: ECC, row remapping, clock events, Xids; {dcgm}"
    sick = {node.name: node.problems for node in nodes if node.problems}
    unread = {node.name: node.unread for node in nodes if node.unread}
    if not sick and not unread:
        return passed("gpu_health", figure), {}
    messages = []
    if sick:
        named = "; ".join(f"{name}: {', '.join(problems)}" for name, problems in sick.items())
        messages.append(f"{named}. Drain the node and have its GPUs looked at")
    if unread:
        named = "; ".join(f"{name}: {', '.join(what)}" for name, what in unread.items())
        messages.append(f"{named}. Let the login user read the kernel log: add it to group adm or systemd-journal, "
                        "or allow it `sudo -n journalctl`")
    return failed("gpu_health", ". ".join(messages), figure), {name: problems[0] for name, problems in sick.items()}


def gate_gpu_health(ctx: CheckContext) -> GateResult:
    from pycli.nodes import ssh_each

    level = ctx.options.dcgm_level
    command = health_command(level)
    answers = ssh_each([(host, command) for host in ctx.cluster.hosts],
                       timeout_s=120 + (DCGM_TIMEOUT_S[level] if level else 0))
    nodes, unanswered = [], {}
    for host in ctx.cluster.hosts:
        answer = answers[host.name]
        if not answer.ok:
            unanswered[host.name] = f"the GPU health probe did not run ({answer.why()})"
            continue
        node = evaluate_node(host.name, split_sections(answer.stdout), level)
        facts = ctx.facts.get(host.name)
        if node is None and facts is not None and facts.has_gpu_hardware:
            unanswered[host.name] = "NVIDIA GPU(s) on the PCI bus but no nvidia-smi (no driver)"
        elif node is not None:
            nodes.append(node)
    result, suspects = evaluate_gpu_health(nodes, unanswered, level)
    ctx.deep["gpu_health"] = {node.name: node.as_json() for node in nodes}
    ctx.suspects.update({name: why for name, why in suspects.items() if name not in ctx.suspects})
    return result

