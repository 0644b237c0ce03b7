#!/usr/bin/env bash
# Prepare, on a machine with PyPI, the folder that scripts/gpu-verify.sh needs on a GPU machine
# that has no registry: wheels of Ansible, ansible-runner and pycli's own dependencies (not
# torch: the GPU machine's own is used), the collections the roles load, the Horovod sdist
# (checked against the horovod role's sha256) and the digits dataset the mnist workload reads.
#
#   scripts/gpu-verify-prepare.sh [FOLDER] [--python 3.12]
#
# FOLDER defaults to gpu-carry/ in the repository (git ignores it). Copy the repository and the
# folder to the GPU machine, then run scripts/gpu-verify.sh there (docs/gpu.md, "Verify the GPU path on one GPU machine").
# The folder must stay under 60 MiB; this script says its size and fails above that.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/gpu-carry
PYVER=3.12
LIMIT_MIB=60
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PYVER=${2:?--python needs a version such as 3.12}; shift 2 ;;
    --python=*) PYVER=${1#--python=}; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu-verify-prepare: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) OUT=$1; shift ;;
  esac
done
case "$PYVER" in 3.1[1-9]) ;; *) echo "gpu-verify-prepare: --python $PYVER: ansible-core 2.19 needs Python 3.11 or newer" >&2; exit 2 ;; esac

PY=${PYCLI_PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || { echo "gpu-verify-prepare: $PY is missing: run 'make venv' first" >&2; exit 2; }

# The pins are pycli's own (pyproject.toml) and the horovod role's: one home each.
mapfile -t PINS < <("$PY" - "$ROOT" <<'EOF'
import sys, tomllib
from pathlib import Path
root = Path(sys.argv[1])
deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
# torch, scikit-learn and matplotlib come with the GPU machine's Python (the dataset travels
# made); the `ansible` bundle is replaced by the two collections the roles load.
skip = ("ansible==", "scikit-learn==", "matplotlib==")
for dep in deps:
    if not dep.startswith(skip):
        print(dep)
EOF
)
read -r HVD_VERSION HVD_SHA256 < <("$PY" - "$ROOT" <<'EOF'
import sys, yaml
from pathlib import Path
d = yaml.safe_load((Path(sys.argv[1]) / "roles/horovod/defaults/main.yml").read_text())
print(d["horovod_version"], d["horovod_sdist_sha256"])
EOF
)

rm -rf "$OUT.new"
mkdir -p "$OUT.new/wheels" "$OUT.new/downloads"
PLATFORMS=()
for p in manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  PLATFORMS+=(--platform "$p")
done
echo "gpu-verify-prepare: wheels for Python $PYVER: ${PINS[*]}"
# Dependencies included: the GPU machine's pip picks what it lacks from here (--find-links).
"$PY" -m pip download -q --only-binary=:all: --python-version "$PYVER" --implementation cp "${PLATFORMS[@]}" \
  -d "$OUT.new/wheels" "${PINS[@]}"
# What a machine with torch already has: dropped, so the folder stays small.
for big in torch nvidia_ triton sympy networkx numpy; do rm -f "$OUT.new/wheels/$big"*.whl; done

# What Horovod's build and horovodrun need beside torch and Ansible's own (PyYAML, packaging),
# pinned and hashed as the horovod role's lock has them (these wheels fit every Python 3).
grep -hE '^(setuptools|wheel|cloudpickle|psutil)==' "$ROOT/roles/horovod/files/wheelhouse/cp311-x86_64.txt" \
  > "$OUT.new/horovod-requirements.txt"
"$PY" -m pip download -q --no-deps --require-hashes --only-binary=:all: --python-version "$PYVER" --implementation cp \
  "${PLATFORMS[@]}" -d "$OUT.new/wheels" -r "$OUT.new/horovod-requirements.txt"

echo "gpu-verify-prepare: horovod $HVD_VERSION sdist"
"$PY" -m pip download -q --no-deps --no-binary=:all: --no-build-isolation -d "$OUT.new/downloads" "horovod==$HVD_VERSION" \
  || "$PY" -m pip download -q --no-deps --no-binary=:all: -d "$OUT.new/downloads" "horovod==$HVD_VERSION"
SDIST=$OUT.new/downloads/horovod-$HVD_VERSION.tar.gz
echo "$HVD_SHA256  $SDIST" | sha256sum -c --quiet - \
  || { echo "gpu-verify-prepare: $SDIST does not have the sha256 the horovod role pins" >&2; exit 1; }

echo "gpu-verify-prepare: collections ansible.posix, community.general (from the ansible bundle)"
SITE=$("$PY" -c 'import ansible_collections, os; print(os.path.dirname(list(ansible_collections.__path__)[0]))')
tar -czf "$OUT.new/collections.tar.gz" -C "$SITE" --exclude='*/tests' --exclude='*/docs' --exclude='__pycache__' \
  ansible_collections/ansible/posix ansible_collections/community/general

echo "gpu-verify-prepare: the digits dataset"
PYCLI_CACHE=$OUT.new/cache "$PY" -c 'from pycli.jobs.datasets import digits_dataset; from pycli.core.paths import cache_dir; digits_dataset(cache_dir())'

rm -rf "$OUT"
mv "$OUT.new" "$OUT"
SIZE_KIB=$(du -sk "$OUT" | cut -f1)
printf 'gpu-verify-prepare: %s holds %d files, %.1f MiB (limit %d MiB)\n' "$OUT" "$(find "$OUT" -type f | wc -l)" \
  "$(echo "$SIZE_KIB / 1024" | bc -l)" "$LIMIT_MIB"
if [ "$SIZE_KIB" -ge $((LIMIT_MIB * 1024)) ]; then
  echo "gpu-verify-prepare: $OUT is over $LIMIT_MIB MiB" >&2
  exit 1
fi
