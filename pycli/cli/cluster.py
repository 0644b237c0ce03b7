"""`pycli cluster ...`: a local cluster of systemd node containers, the test bed of every test."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from pycli.cli.options import JSON_OPTION, output_option
from pycli.cluster.inventory_writer import PACKAGE_CACHE_FROM_HOSTS, opt_in_groups
from pycli.local import cluster as local_cluster
from pycli.local.image import DEFAULT_MIRROR, DEFAULT_SUITE, ImageSpec, ensure_image
from pycli.local.plan import LOCAL_NODE_SLOTS, validate_name

cluster_app = typer.Typer(help="A local cluster of systemd node containers (no servers needed).", no_args_is_help=True)

NAME = typer.Option("local", "--name", help="Cluster name: containers, network and inventory are named after it.")
CA_BUNDLE = typer.Option(
    None, "--ca-bundle", help="Extra PEM CA bundle to trust inside the nodes (TLS-intercepting proxies).",
    dir_okay=False,
)
MIRROR = typer.Option(DEFAULT_MIRROR, "--mirror", help="Debian mirror for the node image (plain HTTP works behind most proxies).")


def _spec(ca_bundle: Path | None, mirror: str) -> ImageSpec:
    """The node image asked for, checked before anything talks to the Docker engine."""
    spec = ImageSpec(suite=DEFAULT_SUITE, mirror=mirror, ca_bundle=ca_bundle)
    spec.validate()
    return spec


@cluster_app.command("image")
def image_cmd(ca_bundle: Path | None = CA_BUNDLE, mirror: str = MIRROR) -> None:
    """Build the Debian 12 node image (debootstrap + docker import); does nothing when it is built."""
    from pycli.local.dockerapi import connect

    spec = _spec(ca_bundle, mirror)
    ensure_image(connect(), spec)


@cluster_app.command("up")
def up_cmd(
    nodes: int = typer.Option(2, "--nodes", "-n", help="How many nodes."),
    slots: int = typer.Option(
        LOCAL_NODE_SLOTS, "--slots", help="Processes per node that --np fills (ranks share the machine's cores).",
    ),
    name: str = NAME,
    subnet: str | None = typer.Option(
        None, "--subnet", help="IPv4 subnet of the cluster's network, /16 to /28 (default: a free /24 of 172.28.0.0/16)."
    ),
    output: Path | None = output_option("Where to write the inventory (default: inventory/local-NAME.ini under the "
                                        "current folder).", dir_okay=False),
    ca_bundle: Path | None = CA_BUNDLE,
    mirror: str = MIRROR,
    slurm: bool = typer.Option(
        False, "--slurm", help="Opt in to Slurm: node1 in group slurm_controller; provisioning installs Slurm on every node."
    ),
    monitoring: bool = typer.Option(
        False, "--monitoring", help="Opt in to monitoring: node1 in group monitoring; provisioning installs Prometheus and "
        "Alertmanager there and node-exporter on every node."
    ),
    package_cache: bool | None = typer.Option(
        None, "--package-cache/--no-package-cache", help="The package cache: node1 in group package_cache runs it "
        f"(nginx) and every node's apt fetches through it (default: on from {PACKAGE_CACHE_FROM_HOSTS} nodes)."
    ),
) -> None:
    """Start NODES systemd node containers reachable over SSH and write their inventory."""
    local_cluster.up(name, nodes, slots=slots, subnet=subnet, image=_spec(ca_bundle, mirror), inventory=output,
                     opt_in=opt_in_groups(slurm=slurm, monitoring=monitoring, package_cache=package_cache,
                                         hosts=nodes))


@cluster_app.command("down")
def down_cmd(name: str = NAME) -> None:
    """Remove the cluster's containers, network, inventory and keys."""
    local_cluster.down(name)


@cluster_app.command("status")
def status_cmd(
    name: str | None = typer.Option(None, "--name", help="Only this cluster (default: all local clusters)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """List local clusters and the state of their nodes."""
    if name:
        validate_name(name)
    rows = local_cluster.status(name)
    if as_json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return
    if not rows:
        print(f"no local cluster{' named ' + repr(name) if name else ''} is up; start one with 'pycli cluster up'")
        return
    table = Table("cluster", "node", "container", "state", "address", "inventory")
    for row in rows:
        table.add_row(row.cluster, row.hostname, row.container, row.state, row.address, row.inventory)
    Console().print(table)
