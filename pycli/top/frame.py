"""`pycli top`: one frame of the whole cluster, read from Prometheus where the inventory has a
monitoring host, else over SSH (one round per refresh); with Slurm, its node states and the jobs
it runs, asked on the launcher node in the same round. A node that does not answer within the
request's timeout is down in the frame: a frame never waits longer than that.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from pycli.cluster import slurm_nodes
from pycli.cluster.model import Cluster
from pycli.cluster.nodes import ssh_each
from pycli.core.errors import BadInput
from pycli.jobs import slurm
from pycli.jobs.launch import NodeLayout
from pycli.top.model import ClusterSide, Frame, NodeSample, node_views
from pycli.top.probe import probe_command, samples_from_answers
from pycli.top.prometheus import PrometheusUnavailable, parse_answers, query_command
from pycli_node.gpu_probe import MARK, Section, split_sections

AUTO, PROMETHEUS, SSH = "auto", "prometheus", "ssh"
SOURCES = (AUTO, PROMETHEUS, SSH)
REFRESH_S = 2.0
ANSWER_S = 5.0


@dataclass(frozen=True)
class TopRequest:
    source: str = AUTO
    timeout_s: float = ANSWER_S

    def check(self, cluster: Cluster) -> None:
        if self.source not in SOURCES:
            raise BadInput(f"--source {self.source!r}: give one of {', '.join(SOURCES)}")
        if not 0 < self.timeout_s <= 120:
            raise BadInput(f"--timeout {self.timeout_s:g}: give seconds above 0, at most 120")
        if self.source == PROMETHEUS and cluster.monitoring_host is None:
            raise BadInput("--source prometheus: this inventory has no [monitoring] group "
                           "('pycli inventory new --monitoring' writes one; docs/monitoring.md), or use --source ssh")

    def uses_prometheus(self, cluster: Cluster) -> bool:
        return self.source != SSH and cluster.monitoring_host is not None


def slurm_sections() -> str:
    """Slurm's node states and queue, as two more sections of a node's answer."""
    return (f"echo '{MARK} sinfo'; {slurm_nodes.SINFO_NODES_COMMAND} 2>&1; echo \"{MARK} rc $?\"\n"
            f"echo '{MARK} squeue'; {slurm.squeue_command()} 2>&1; echo \"{MARK} rc $?\"")


def cluster_side(sections: dict[str, Section], where: str, notes: list[str]) -> ClusterSide:
    sinfo, squeue = sections.get("sinfo"), sections.get("squeue")
    if sinfo is None or sinfo.rc != 0 or squeue is None or squeue.rc != 0:
        failed = sinfo if sinfo is not None and sinfo.rc != 0 else squeue
        why = failed.text.strip().splitlines()[-1] if failed is not None and failed.text.strip() else "no answer"
        notes.append(f"Slurm: asking on {where} failed: {why}")
        return ClusterSide()
    return ClusterSide(slurm_nodes.parse_sinfo_nodes(sinfo.text), slurm.running_jobs_by_node(slurm.parse_squeue(squeue.text)))


def take_frame(cluster: Cluster, request: TopRequest) -> Frame:
    """Every node now, in inventory order."""
    started = time.monotonic()
    layout = NodeLayout.from_settings(cluster.settings)
    notes: list[str] = []
    side = ClusterSide()
    samples = None
    source, source_line = SSH, "SSH, one round per refresh"
    extra = slurm_sections() if cluster.has_slurm else ""
    if request.uses_prometheus(cluster):
        # The monitoring host asks Prometheus; every other node answers `true` in the same round
        # over its kept connection, so a node that stopped is down in this frame, not only once
        # Prometheus's next scrape has failed.
        host = next(h for h in cluster.hosts if h.name == cluster.monitoring_host)
        query = query_command() + ("\n" + extra if extra else "")
        answers = ssh_each([(h, query if h.name == host.name else "true") for h in cluster.hosts], request.timeout_s,
                           shared=True)
        answer = answers[host.name]
        head, _, _ = answer.stdout.partition(MARK)
        try:
            samples = parse_answers(head, [h.name for h in cluster.hosts])
        except PrometheusUnavailable as exc:
            reason = str(exc) if answer.stdout.strip() else f"{host.name}: {answer.why()}"
            notes.append(f"{reason}; read over SSH this time")
        else:
            source, source_line = PROMETHEUS, f"Prometheus on {host.name}"
            samples.update({name: NodeSample(name, False, a.why()) for name, a in answers.items() if not a.ok})
            if extra:
                side = cluster_side(split_sections(answer.stdout), host.name, notes)
    if samples is None:
        launcher = cluster.launcher_host
        commands = [(h, probe_command(layout.jobs_dir, extra if h.name == launcher.name else "")) for h in cluster.hosts]
        answers = ssh_each(commands, request.timeout_s, shared=True)
        samples = samples_from_answers(answers, layout.jobs_dir)
        if extra:
            side = cluster_side(split_sections(answers[launcher.name].stdout), launcher.name, notes)
    return Frame(source, source_line, node_views(cluster, samples, side), tuple(notes),
                 time.monotonic() - started, datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
