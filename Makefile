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

.PHONY: demo test host venv lint unit integration down clean

demo: host venv
	$(BIN)/pycli cluster up --name $(NAME) --nodes $(NODES) $(CA_FLAG)
	@echo "demo: $(NODES) nodes answer Ansible over SSH (inventory/local-$(NAME).ini)."
	@echo "demo: provisioning (pycli provision) and training (pycli train) are not built yet; the demo stops here."

test: host venv lint unit integration

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

down: venv
	$(BIN)/pycli cluster down --name $(NAME)

clean: down
	rm -rf $(VENV) runs
