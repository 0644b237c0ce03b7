# The README's two commands: `make demo` (the main job on a local cluster) and `make test`.
# Both set up what they need on a fresh Debian/Ubuntu machine: a Docker engine,
# debootstrap (scripts/host-prereqs.sh, root) and the Python environment (.venv).

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
NAME ?= local
NODES ?= 2
# Nodes trust this machine's CA bundle too, so pip on them works behind a TLS-intercepting proxy.
CA_BUNDLE ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
CA_FLAG := $(if $(CA_BUNDLE),--ca-bundle $(CA_BUNDLE))
# Tools of the venv (ansible, molecule) call each other by name.
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: demo test host venv lint unit integration molecule down clean

# A local cluster, the whole stack on it, and a Horovod job across its nodes. The first run
# builds Open MPI and Horovod (about 25 minutes on 2 cores); later runs take minutes.
demo: host venv
	$(BIN)/pycli cluster up --name $(NAME) --nodes $(NODES) $(CA_FLAG)
	$(BIN)/pycli provision inventory/local-$(NAME).ini
	# One torch thread per rank: the local nodes share this machine's cores.
	$(BIN)/pycli train mnist --np $(NODES) -i inventory/local-$(NAME).ini -- --epochs 5 --threads 1

# Integration tests provision a cluster first, which fills the cache the molecule
# scenarios then reuse.
test: host venv lint unit integration molecule

host:
	bash scripts/host-prereqs.sh

venv: $(BIN)/.installed

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

lint: venv
	$(BIN)/ansible-lint

unit: venv
	$(BIN)/pytest -q tests/unit

integration: venv
	$(BIN)/pytest -q tests/integration

molecule: venv
	$(BIN)/molecule test -s default
	$(BIN)/molecule test -s docker
	$(BIN)/molecule test -s gpu_fixture

down: venv
	$(BIN)/pycli cluster down --name $(NAME)

clean: down
	rm -rf $(VENV) runs
