# The README's two commands: `make demo` (the main job on a local cluster) and `make test`.
# Both set up what they need on a fresh Debian/Ubuntu machine: a Docker engine,
# debootstrap (scripts/host-prereqs.sh, root) and the Python environment (.venv).

# The controller's Python: the newest of the versions pyproject.toml admits that is found
# here (3.11 only for now: the pinned torch that the workload tests import installs from
# local disk for 3.11 on the test machines).
SUPPORTED_PYTHONS := 3.11
PYTHON ?= $(firstword $(foreach v,$(SUPPORTED_PYTHONS),$(shell command -v python$(v) 2>/dev/null)))
VENV := .venv
# pycli's node-side package, whose one home is its role's files (pyproject.toml maps it).
NODE_PACKAGE_DIR := roles/pycli_node/files/pycli_node
BIN := $(VENV)/bin
NAME ?= local
NODES ?= 2
# Ranks of the demo job: local nodes get 4 slots each, and every rank keeps to its share of
# the machine's cores. The job is the plain `pycli train mnist --np 8`: its default batch is 64
# in all, shared out between the ranks (docs/train.md "Batch size").
NP ?= 8
# Nodes trust this machine's CA bundle too, so pip on them works behind a TLS-intercepting proxy.
CA_BUNDLE ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
CA_FLAG := $(if $(CA_BUNDLE),--ca-bundle $(CA_BUNDLE))
# Tools of the venv (ansible, molecule) call each other by name.
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: demo test test-steps host venv lint unit integration molecule down clean

# A local cluster, the whole stack on it, and a Horovod job across its nodes. The first run
# downloads everything and builds Open MPI and Horovod (about 10 minutes on 2 cores); later
# runs take minutes.
demo: host venv
	$(BIN)/pycli cluster up --name $(NAME) --nodes $(NODES) $(CA_FLAG)
	$(BIN)/pycli provision inventory/local-$(NAME).ini
	$(BIN)/pycli train mnist --np $(NP) -i inventory/local-$(NAME).ini

# The integration tests provision one cluster and share it; the CPU roles (common, ssh_trust,
# openmpi, horovod) are tested on it (tests/integration/test_roles_state.py, test_provision.py)
# rather than on a second cluster of their own. The molecule scenarios test the rest.
# CI proves the cold path: under CI=true every run starts from an empty, temporary cache and
# state folder, so it downloads and builds Open MPI and Horovod once (both folders go when the
# run ends). Locally the warm cache (pycli's own, pycli.core.paths) stays the default.
# Every part of `make test` adds rows to one timings folder (tests/timings.py): a row per test
# (wall, CPU of this machine's processes, the setup a test is the first to need), one per lint
# tool and molecule scenario. The run ends with the largest entries, even when a part failed.
TIMINGS ?= runs/test-timings/$(shell date +%Y%m%d-%H%M%S)
export TIMINGS
TIMED = $(BIN)/python -m tests.timings run $(TIMINGS)/$(1).tsv $(1) $(2) --

test: host venv
ifeq ($(CI),true)
	@cache=$$(mktemp -d /tmp/pycli-ci-cache.XXXXXX) && state=$$(mktemp -d /tmp/pycli-ci-state.XXXXXX) && \
	trap 'rm -rf "$$cache" "$$state"' EXIT && \
	echo "make test: CI=true, empty cache $$cache and state $$state" && \
	PYCLI_CACHE=$$cache PYCLI_STATE=$$state $(MAKE) --no-print-directory test-steps; \
	rc=$$?; $(BIN)/python -m tests.timings report $(TIMINGS); exit $$rc
else
	@$(MAKE) --no-print-directory test-steps; rc=$$?; $(BIN)/python -m tests.timings report $(TIMINGS); exit $$rc
endif

# The parts that need no cluster of the integration tests' (molecule, lint, unit) run beside
# the integration tests' first cluster and its provisioning (on CI: the cold Open MPI and Horovod
# build). The unit tests, some of which time things, run at the usual priority, and the
# integration tests start only once they have ended (PYCLI_TEST_AFTER,
# tests/integration/conftest.py), so no test that times something shares the cores with them.
# Molecule and lint time nothing: they run at the lowest priority (nice 19), and molecule's node
# containers, which do not inherit a nice value, at a CPU weight of 64 against a node's 1024
# (PYCLI_TEST_NODE_CPU_SHARES, molecule/resources/tasks/node_cpu_share.yml), so the build, which the
# whole run waits for, keeps the cores, and they take what it leaves (into the integration tests
# if need be). Their output comes after the integration tests'.
# All of them start once the first provisioning has started its Open MPI build in the background
# (PYCLI_TEST_SIDE_GO, tests/integration/conftest.py), not while the build still waits in line
# for the build tools; at the latest after SIDE_WAIT_S.
SIDE_WAIT_S := 300
SIDE_WAIT = i=0; while [ ! -e $(TIMINGS)/side.go ] && [ $$i -lt $(SIDE_WAIT_S) ]; do sleep 1; i=$$((i+1)); done

test-steps:
	@mkdir -p $(TIMINGS) && rm -f $(TIMINGS)/unit.rc $(TIMINGS)/niced.rc $(TIMINGS)/side.go
	@echo "make test: unit, and molecule and lint (nice 19), beside the integration tests' first provisioning once its build runs (their output follows the integration tests')"
	@($(SIDE_WAIT); $(MAKE) --no-print-directory unit >$(TIMINGS)/unit.log 2>&1; echo $$? >$(TIMINGS)/unit.rc) & \
	($(SIDE_WAIT); PYCLI_TEST_NODE_CPU_SHARES=64 nice -n 19 $(MAKE) --no-print-directory molecule lint >$(TIMINGS)/niced.log 2>&1; echo $$? >$(TIMINGS)/niced.rc) & \
	PYCLI_TEST_SIDE_GO=$(TIMINGS)/side.go PYCLI_TEST_AFTER=$(TIMINGS)/unit.rc $(MAKE) --no-print-directory integration; integration=$$?; \
	wait; echo "make test: the output of molecule and lint:"; cat $(TIMINGS)/niced.log; \
	echo "make test: the output of unit:"; cat $(TIMINGS)/unit.log; \
	unit=$$(cat $(TIMINGS)/unit.rc 2>/dev/null || echo 1); niced=$$(cat $(TIMINGS)/niced.rc 2>/dev/null || echo 1); \
	if [ "$$integration" -ne 0 ] || [ "$$unit" -ne 0 ] || [ "$$niced" -ne 0 ]; then \
		echo "make test: FAILED (integration exit $$integration; unit exit $$unit; molecule and lint exit $$niced)"; exit 1; fi
	@echo "make test: all green (cache $$($(BIN)/python -m pycli.core.paths PYCLI_CACHE), timings $(TIMINGS))"

host:
	bash scripts/host-prereqs.sh

# pip compiles what it installs to bytecode, but pycli itself is installed in place (-e): its own
# modules are compiled here once, so that each of the many pycli processes of a run reads them
# (Python writes no bytecode of its own where PYTHONDONTWRITEBYTECODE is set, and recompiles a
# module in memory, correctly, once its source is newer).
venv: $(BIN)/.installed

$(BIN)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "no supported Python found (one of: $(SUPPORTED_PYTHONS)); install python$(lastword $(SUPPORTED_PYTHONS)) or pass PYTHON=..." >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/python -m compileall -q pycli $(NODE_PACKAGE_DIR) workloads tests >/dev/null
	touch $@

lint: venv
	$(call TIMED,lint,ansible-lint) $(BIN)/ansible-lint
	$(call TIMED,lint,ruff) $(BIN)/ruff check pycli $(NODE_PACKAGE_DIR) workloads scripts
	$(call TIMED,lint,mypy) $(BIN)/mypy
	$(call TIMED,lint,import-linter) $(BIN)/lint-imports --no-cache

unit: venv
	$(BIN)/pytest -q tests/unit --timings $(TIMINGS)/unit.tsv

# Where the suite's time goes: the timings table (every test), and its largest entries at the end.
integration: venv
	$(BIN)/pytest -q tests/integration --timings $(TIMINGS)/integration.tsv

# The scenarios run under the strategy `pycli provision` runs the roles with (Mitogen's, unless
# PYCLI_ANSIBLE_STRATEGY=linear): what they prove holds for it, and a scenario's three runs of
# its playbook (converge, idempotence, check) cost about 40 % less CPU than with `linear`.
ANSIBLE_STRATEGY_ENV = $(BIN)/python -c 'from pycli.cluster.runner import strategy_env; print(" ".join(f"{k}={v}" for k, v in strategy_env().items()))'

# The controller folders the roles use are pycli's (pycli.core.paths), as under `pycli provision`.
molecule: venv
	@strategy="$$($(ANSIBLE_STRATEGY_ENV))" && folders="$$($(BIN)/python -m pycli.core.paths)" || exit 1; \
	for scenario in default gpu_fixture gpu_adopt; do \
		env $$strategy $$folders $(call TIMED,molecule,$$scenario) $(BIN)/molecule test -s $$scenario || exit 1; \
	done

down: venv
	$(BIN)/pycli cluster down --name $(NAME)

clean: down
	rm -rf $(VENV) runs
