#!/usr/bin/env bash
# Verify the GPU path on one machine with an NVIDIA GPU, in one go: provision it as a local
# host (the adopt path: its own driver, CUDA and NCCL), build Horovod with NCCL against its own
# torch, train through pycli on CUDA, run pycli check's GPU gates, and print one table of what
# it measured (also written as JSON). No network, Docker, sshd or systemd needed.
#
#   scripts/gpu-verify.sh [--carry DIR] [--work DIR] [--out DIR] [--no-horovod] [--python PY] [--budget S]
#                        [--build-timeout S]
#
# --carry: the folder scripts/gpu-verify-prepare.sh made (default gpu-carry/ in the repository).
# --work: scratch space (default a new private folder under $TMPDIR or /tmp; a folder given here
# must be new, or one an earlier run made, which is made anew). --out: where the table,
# the JSON and the machine's real nvidia-smi / kernel log / driver version go (default
# WORK/out). --python: the Python that has torch (default: python3 on PATH). --budget: start no
# step after S seconds (the table is still written). --build-timeout: seconds the Horovod build
# may take (default 420: one GPU's architecture on 16 cores takes a few minutes).
# On a machine without a GPU every step that needs one says "no GPU" and the rest runs.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY=$ROOT/gpu-carry
WORK=
PY=python3
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --carry) CARRY=${2:?}; shift 2 ;;
    --work) WORK=${2:?}; shift 2 ;;
    --python) PY=${2:?}; shift 2 ;;
    --out|--budget|--build-timeout) ARGS+=("$1" "${2:?}"); shift 2 ;;
    --no-horovod) ARGS+=("$1"); shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-verify: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
# Scratch space is removed and made anew: never a path someone else made first (a shared /tmp),
# a link, or a folder of the user's own that no earlier run of this script made.
MARK=.pycli-gpu-verify
if [ -n "$WORK" ] && { [ -e "$WORK" ] || [ -L "$WORK" ]; } &&
   { [ -L "$WORK" ] || [ ! -d "$WORK" ] || [ ! -O "$WORK" ] || [ ! -e "$WORK/$MARK" ]; }; then
  echo "gpu-verify: --work $WORK exists and is not a folder an earlier run of yours made: give a new path" >&2; exit 2
fi
command -v "$PY" >/dev/null || { echo "gpu-verify: no $PY: give the Python that has torch with --python" >&2; exit 2; }
"$PY" -c 'import torch' 2>/dev/null || { echo "gpu-verify: $PY has no torch: give the Python that has it with --python" >&2; exit 2; }
[ -d "$CARRY/wheels" ] || { echo "gpu-verify: $CARRY has no wheels/: run scripts/gpu-verify-prepare.sh on a machine with PyPI first" >&2; exit 2; }

# A venv of its own over the machine's Python: it sees that Python's packages (torch) through
# a .pth file, and Ansible, ansible-runner and pycli's dependencies go into it alone.
if [ -z "$WORK" ]; then
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/pycli-gpu-verify.XXXXXX") || { echo "gpu-verify: could not make a scratch folder" >&2; exit 1; }
else
  rm -rf "$WORK"
  mkdir -p "$(dirname "$WORK")" && mkdir -m 700 "$WORK" || { echo "gpu-verify: could not make $WORK" >&2; exit 1; }
fi
touch "$WORK/$MARK"
echo "gpu-verify: scratch space $WORK"
VENV=$WORK/venv
# No pip of its own (a system Python may lack ensurepip): the machine Python's pip, seen through
# the .pth file, installs into this venv.
"$PY" -m venv --without-pip "$VENV" || { echo "gpu-verify: $PY -m venv failed" >&2; exit 1; }
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
"$PY" -c 'import site, sys; print("\n".join(site.getsitepackages()))' > "$SITE/zz-machine-python.pth"
# pycli, and its node-side package from its role (pyproject.toml maps it the same way).
printf '%s\n' "$ROOT" "$ROOT/roles/pycli_node/files" > "$SITE/pycli-checkout.pth"
"$VENV/bin/python" -m pip --version >/dev/null 2>&1 || { echo "gpu-verify: $PY has no pip" >&2; exit 1; }
PINS=$("$VENV/bin/python" - "$ROOT" <<'EOF'
import sys, tomllib
from pathlib import Path
deps = tomllib.loads((Path(sys.argv[1]) / "pyproject.toml").read_text())["project"]["dependencies"]
print(" ".join(d for d in deps if d.startswith(("ansible-core", "ansible-runner", "typer", "rich", "docker", "jinja2"))))
EOF
)
# shellcheck disable=SC2086
{ "$VENV/bin/python" -m pip install -q --no-index --find-links "$CARRY/wheels" $PINS &&
  "$VENV/bin/python" -m pip install -q --no-index --no-deps --find-links "$CARRY/wheels" -r "$CARRY/horovod-requirements.txt"
} > "$WORK/pip.log" 2>&1 \
  || { echo "gpu-verify: installing Ansible from $CARRY/wheels failed; see $WORK/pip.log" >&2; tail -5 "$WORK/pip.log" >&2; exit 1; }
mkdir -p "$WORK/collections"
tar -xzf "$CARRY/collections.tar.gz" -C "$WORK/collections"
# torchrun as the machine's torch installs it, in this venv's bin/ where pycli looks for it.
cat > "$VENV/bin/torchrun" <<EOF
#!$VENV/bin/python
import sys
from torch.distributed.run import main
sys.exit(main())
EOF
chmod +x "$VENV/bin/torchrun"

# Then the machine Python's own bin/ (its torch's tools, and Ansible where it has it already).
export PATH=$VENV/bin:$("$PY" -c 'import os, sys; print(os.path.join(sys.prefix, "bin"))'):$PATH
export ANSIBLE_COLLECTIONS_PATH=$WORK/collections
export PYCLI_CACHE=$WORK/cache PYCLI_STATE=$WORK/state PYCLI_RUNS=$WORK/runs
mkdir -p "$PYCLI_CACHE"
cp -r "$CARRY/cache/." "$PYCLI_CACHE/"
cd "$ROOT" && exec "$VENV/bin/python" "$ROOT/scripts/gpu_verify.py" --work "$WORK" --carry "$CARRY" "${ARGS[@]}"
