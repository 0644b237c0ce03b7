"""The openmpi role's preflight: which installed packages clash with the Open MPI it builds."""

import re

import yaml

from tests.conftest import ROOT

ROLE = ROOT / "roles" / "openmpi"


def clashes(packages):
    patterns = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__openmpi_conflict_patterns"]
    return sorted(name for name in packages if re.match("|".join(patterns), name))


def test_a_distro_mpi_clashes_and_the_systems_hwloc_that_slurmd_needs_does_not():
    installed = ["openmpi-bin", "libopenmpi3", "mpich", "libmpich12", "libhwloc15", "libhwloc-plugins", "hwloc",
                 "slurmd", "openmpi-common"]
    assert clashes(installed) == ["libmpich12", "libopenmpi3", "mpich", "openmpi-bin"]


def test_the_build_embeds_its_own_hwloc():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert "--with-hwloc=internal" in defaults["openmpi_configure_flags"]
