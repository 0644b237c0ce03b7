"""`pycli check --deep` on GPU nodes: what the GPUs say about themselves.

One SSH command per node reads three sources, each parsed by pycli_node.gpu_reports (tested on
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

from pycli.health.gates import CheckContext, GateResult, failed, passed, skipped
from pycli_node.gpu_probe import (  # noqa: F401 (Section, MARK: the probe's words, read by the tests from here too)
    DCGM_TIMEOUT_S,
    MARK,
    NodeGpuHealth,
    Section,
    evaluate_node,
    health_command,
    split_sections,
)


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
    from pycli.cluster.nodes import ssh_each

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

