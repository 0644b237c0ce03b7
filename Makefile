# The README's two commands: `make demo` (the main job on a local cluster) and `make test`.
# Both set up what they need on a fresh Debian/Ubuntu machine: a Docker engine,
# debootstrap (scripts/host-prereqs.sh, root) and the Python environment (.venv).

VENV := .venv
# pycli's node-side package, whose one home is its role's files (pyproject.toml maps it).
NODE_PACKAGE_DIR := roles/pycli_node/files/pycli_node
BIN := $(VENV)/bin

# The controller's Pythons: the ones pyproject.toml admits, those ansible-core 2.19 (the pinned
# line) runs its controller on. A pythonX.Y counts only when it runs and answers with that
# version: pyenv puts a shim on PATH for every version it has, which answers "command not found"
# for those not selected. Looked for on PATH first (the venvs' folders left out: PATH gets
# .venv/bin below), then among pyenv's installed versions, newest patch first, selected or not
# (PYENV_ROOT, else ~/.pyenv).
# $(call find_python,VERSIONS) is the interpreter of the first of VERSIONS that answers so.
SUPPORTED_PYTHONS := 3.11 3.12 3.13
HOST_PATH := $(subst $(abspath $(BIN)):,,$(PATH))
find_python = $(shell PATH='$(HOST_PATH)'; for v in $(1); do \
	for candidate in python$$v $$(ls -d "$${PYENV_ROOT:-$$HOME/.pyenv}"/versions/$$v.*/bin/python$$v 2>/dev/null | sort -rV); do \
	found=$$($$candidate -c 'import sys; print(sys.executable) if "%d.%d" % sys.version_info[:2] == sys.argv[1] else sys.exit(1)' $$v 2>/dev/null) \
	&& { echo "$$found"; break 2; }; done; done)
# Each is looked for once, and only by the recipes that need it (the eval makes it a plain value).
# `make demo` and `make venv`: 3.11 where the machine has it, the Python make test runs .venv on and
# the integration tests prove (one venv for both), else the newest found. PYTHON=... chooses.
PYTHON ?= $(eval PYTHON := $(call find_python,3.11 3.13 3.12))$(PYTHON)
# make test proves a second Python beside .venv's: pycli installed under it from its wheel with its
# test extras, the unit tests that need no torch run by it, and one provisioning and one job of
# the integration tests' cluster by its pycli (tests/integration/test_roles_state.py). The newest
# found of the others, or SECOND_PYTHON=... On a machine with one supported Python (Debian 13 has
# 3.13 alone) it is that one again: the second venv still proves the installed wheel, not a
# second Python, and make test says so (PYCLI_TEST_SECOND_SAME).
PYTHON_VERSION = $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
SECOND_PYTHON ?= $(eval SECOND_PYTHON := $(or $(call find_python,$(filter-out $(PYTHON_VERSION),3.13 3.12 3.11)),$(PYTHON)))$(SECOND_PYTHON)
SECOND_VERSION = $(shell $(SECOND_PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
SECOND_VENV := .venv-second
SECOND_BIN := $(SECOND_VENV)/bin
# "3.13" of an interpreter, or nothing where it does not run.
python_version = $$($(1) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
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

.PHONY: demo test test-pythons test-steps host venv wheel collection second-venv lint unit unit-torch unit-second unit-second-run integration integration-slurm integration-three-nodes molecule down clean

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

# The Pythons test-pythons found go to the parts as they are, not looked for again in each.
TEST_PYTHONS = PYTHON=$(PYTHON) SECOND_PYTHON=$(SECOND_PYTHON)

test: test-pythons host venv
ifeq ($(CI),true)
	@cache=$$(mktemp -d /tmp/pycli-ci-cache.XXXXXX) && state=$$(mktemp -d /tmp/pycli-ci-state.XXXXXX) && \
	trap 'rm -rf "$$cache" "$$state"' EXIT && \
	echo "make test: CI=true, empty cache $$cache and state $$state" && \
	PYCLI_CACHE=$$cache PYCLI_STATE=$$state $(MAKE) --no-print-directory test-steps $(TEST_PYTHONS); \
	rc=$$?; $(BIN)/python -m tests.timings report $(TIMINGS); exit $$rc
else
	@$(MAKE) --no-print-directory test-steps $(TEST_PYTHONS); rc=$$?; $(BIN)/python -m tests.timings report $(TIMINGS); exit $$rc
endif

# make test's two Pythons, checked before anything is made: .venv's (PYTHON: 3.11 where there is
# one, else the newest; torch's CPU wheel for it must be on local disk, pyproject.toml's extra
# torch), and a second one of another version (SECOND_PYTHON).
test-pythons:
	@v="$(if $(PYTHON),$(call python_version,$(PYTHON)))"; case " $(SUPPORTED_PYTHONS) " in *" $$v "*) ;; *) echo "make test: no supported Python (one of $(SUPPORTED_PYTHONS)) answers here$(if $(PYTHON), as PYTHON=$(PYTHON)): install python3.11 or pass PYTHON=/path/to/python3.X" >&2; exit 2;; esac
	@v="$(call python_version,$(BIN)/python)"; [ ! -e $(BIN)/python ] || [ "$$v" = "$(PYTHON_VERSION)" ] || { echo "make test: $(VENV) runs Python $${v:-that does not start}, and make test runs it on $(PYTHON_VERSION) ($(PYTHON)): remove it (rm -rf $(VENV)) and run make test again" >&2; exit 2; }
	@v="$(if $(SECOND_PYTHON),$(call python_version,$(SECOND_PYTHON)))"; case " $(SUPPORTED_PYTHONS) " in *" $$v "*) ;; *) echo "make test: SECOND_PYTHON=$(SECOND_PYTHON) is $${v:+Python }$${v:-no Python that runs}: pass one of $(SUPPORTED_PYTHONS)" >&2; exit 2;; esac
	@[ "$(SECOND_VERSION)" != "$(PYTHON_VERSION)" ] || echo "make test: the second Python is $(PYTHON_VERSION) too (the one supported Python found here, or SECOND_PYTHON so): the second venv is pycli's wheel on it again, and this run proves one Python; with another of $(filter-out $(PYTHON_VERSION),$(SUPPORTED_PYTHONS)) installed it proves two"

# The parts that need no cluster of the integration tests' (molecule, lint, unit) run beside
# them. The unit tests that need torch, some of which time things (training on 8 ranks,
# restarts), run at the usual priority beside the integration tests' first cluster and its
# provisioning (on CI: the cold Open MPI and Horovod build), and the integration tests start only
# once they have ended (PYCLI_TEST_AFTER, tests/integration/conftest.py), so no test that times
# something shares the cores with them. They start once the first provisioning has started its
# Open MPI build in the background (PYCLI_TEST_SIDE_GO, tests/integration/conftest.py), not while
# the build still waits in line for the build tools; at the latest after SIDE_WAIT_S.
# The second Python's venv and the unit tests it runs (those without torch: logic, parsers and
# scripts, which time nothing) take CPU the build would use (about 260 s of it in a cold run on
# 2 cores, the build being the critical path), so they run with molecule and lint below: once
# the first provisioning has ended, at nice 19. The integration tests get the second venv's
# pycli for their one provisioning by it (PYCLI_TEST_SECOND_PYCLI) and wait for it there
# (PYCLI_TEST_SECOND_MADE), minutes after it was made.
# Molecule and lint time nothing, and the first provisioning, which the whole run waits for, is
# CPU-bound from end to end, while the integration tests after it leave the cores idle for
# minutes (waiting on a dead node, a timeout, a poll). So they start once the first provisioning
# has ended (PYCLI_TEST_PROVISIONED; at the latest when the integration tests end) and run at the
# lowest priority (nice 19), and molecule's node containers, which do not inherit a nice value,
# at a CPU weight of 64 against a node's 1024 (PYCLI_TEST_NODE_CPU_SHARES,
# molecule/resources/tasks/node_cpu_share.yml): they take what the integration tests leave.
# Their output comes after the integration tests'.
# The integration tests run as three lanes (tests/integration/conftest.py, PYCLI_TEST_LANE): the
# 2-node cluster's tests, and beside them the Slurm tests and the 3-node cluster's, each lane
# with a cluster of its own, which its pytest makes once the first provisioning has passed (from
# the cache that filled) and runs its tests on as soon as it is there, in the minutes the 2-node
# tests wait; a test that compares the nodes' compute runs alone (PYCLI_TEST_LANES_LOCK), once
# no step of molecule and lint runs that nice cannot hold back (PYCLI_TEST_NOISY_LOCK: Docker
# removing molecule's containers and ansible-lint starting took a healthy node's compute down to
# 0.14 of the others'). Their output comes after the 2-node lane's.
# make test's noisy steps (molecule's container removal, ansible-lint) hold this lock shared, and a
# test that measures the cores holds it alone (PYCLI_TEST_NOISY_LOCK); run by hand, nothing.
NOISY = $(if $(PYCLI_TEST_NOISY_LOCK),flock -s $(PYCLI_TEST_NOISY_LOCK))
SIDE_WAIT_S := 300
SIDE_WAIT = i=0; while [ ! -e $(TIMINGS)/side.go ] && [ $$i -lt $(SIDE_WAIT_S) ]; do sleep 1; i=$$((i+1)); done
PROVISIONED_WAIT = while [ ! -e $(TIMINGS)/provisioned.go ]; do sleep 1; done

test-steps:
	@mkdir -p $(TIMINGS) && rm -f $(TIMINGS)/unit.rc $(TIMINGS)/unit-second.rc $(TIMINGS)/niced.rc $(TIMINGS)/side.go $(TIMINGS)/provisioned.go $(TIMINGS)/second-venv.rc $(TIMINGS)/three-nodes.rc $(TIMINGS)/slurm.rc
	@echo "make test: the unit tests that need torch beside the integration tests' first provisioning once its build runs; the second venv and its unit tests, molecule and lint (nice 19), and the Slurm tests and the 3-node cluster's, beside the 2-node cluster's once it has ended (their output follows the 2-node cluster's tests')"
	@($(PROVISIONED_WAIT); nice -n 19 $(MAKE) --no-print-directory second-venv >$(TIMINGS)/second-venv.log 2>&1; echo $$? >$(TIMINGS)/second-venv.rc; \
		if [ "$$(cat $(TIMINGS)/second-venv.rc)" -eq 0 ]; then nice -n 19 $(MAKE) --no-print-directory unit-second-run >$(TIMINGS)/unit-second.log 2>&1; \
		else echo "make test: the second venv was not made (see its output), so its unit tests did not run" >$(TIMINGS)/unit-second.log; false; fi; \
		echo $$? >$(TIMINGS)/unit-second.rc) & \
	($(SIDE_WAIT); $(MAKE) --no-print-directory unit-torch >$(TIMINGS)/unit.log 2>&1; echo $$? >$(TIMINGS)/unit.rc) & \
	($(PROVISIONED_WAIT); PYCLI_TEST_NODE_CPU_SHARES=64 PYCLI_TEST_NOISY_LOCK=$(TIMINGS)/noisy.lock nice -n 19 $(MAKE) --no-print-directory molecule lint >$(TIMINGS)/niced.log 2>&1; echo $$? >$(TIMINGS)/niced.rc) & \
	(PYCLI_TEST_PROVISIONED=$(TIMINGS)/provisioned.go PYCLI_TEST_AFTER=$(TIMINGS)/unit.rc PYCLI_TEST_LANES_LOCK=$(TIMINGS)/lanes.lock PYCLI_TEST_NOISY_LOCK=$(TIMINGS)/noisy.lock \
		$(MAKE) --no-print-directory integration-three-nodes >$(TIMINGS)/three-nodes.log 2>&1; echo $$? >$(TIMINGS)/three-nodes.rc) & \
	(PYCLI_TEST_PROVISIONED=$(TIMINGS)/provisioned.go PYCLI_TEST_AFTER=$(TIMINGS)/unit.rc PYCLI_TEST_LANES_LOCK=$(TIMINGS)/lanes.lock PYCLI_TEST_NOISY_LOCK=$(TIMINGS)/noisy.lock \
		$(MAKE) --no-print-directory integration-slurm >$(TIMINGS)/slurm.log 2>&1; echo $$? >$(TIMINGS)/slurm.rc) & \
	PYCLI_TEST_SIDE_GO=$(TIMINGS)/side.go PYCLI_TEST_PROVISIONED=$(TIMINGS)/provisioned.go PYCLI_TEST_AFTER=$(TIMINGS)/unit.rc \
		PYCLI_TEST_SECOND_PYCLI=$(abspath $(SECOND_BIN))/pycli PYCLI_TEST_SECOND_MADE=$(TIMINGS)/second-venv.rc \
		PYCLI_TEST_SECOND_SAME=$(if $(filter $(PYTHON_VERSION),$(SECOND_VERSION)),1) \
		PYCLI_TEST_LANE=two-nodes PYCLI_TEST_LANES_LOCK=$(TIMINGS)/lanes.lock PYCLI_TEST_NOISY_LOCK=$(TIMINGS)/noisy.lock $(MAKE) --no-print-directory integration; integration=$$?; touch $(TIMINGS)/provisioned.go; \
	wait; echo "make test: the output of the Slurm tests:"; cat $(TIMINGS)/slurm.log; \
	echo "make test: the output of the 3-node cluster's tests:"; cat $(TIMINGS)/three-nodes.log; \
	echo "make test: the output of molecule and lint:"; cat $(TIMINGS)/niced.log; \
	echo "make test: the output of the second venv:"; cat $(TIMINGS)/second-venv.log; \
	echo "make test: the output of the unit tests that need torch:"; cat $(TIMINGS)/unit.log; \
	echo "make test: the output of the other unit tests (the second venv's Python):"; cat $(TIMINGS)/unit-second.log; \
	unit=$$(cat $(TIMINGS)/unit.rc 2>/dev/null || echo 1); unit_second=$$(cat $(TIMINGS)/unit-second.rc 2>/dev/null || echo 1); \
	niced=$$(cat $(TIMINGS)/niced.rc 2>/dev/null || echo 1); \
	second=$$(cat $(TIMINGS)/second-venv.rc 2>/dev/null || echo 1); three=$$(cat $(TIMINGS)/three-nodes.rc 2>/dev/null || echo 1); \
	slurm=$$(cat $(TIMINGS)/slurm.rc 2>/dev/null || echo 1); \
	if [ "$$integration" -ne 0 ] || [ "$$slurm" -ne 0 ] || [ "$$three" -ne 0 ] || [ "$$unit" -ne 0 ] || [ "$$unit_second" -ne 0 ] || [ "$$niced" -ne 0 ] || [ "$$second" -ne 0 ]; then \
		echo "make test: FAILED (integration exit $$integration, its Slurm lane $$slurm, its 3-node lane $$three; unit exit $$unit (torch) and $$unit_second (the second venv's); molecule and lint exit $$niced; second venv exit $$second)"; exit 1; fi
	@echo "make test: all green (cache $$($(BIN)/python -m pycli.core.paths PYCLI_CACHE), timings $(TIMINGS))"

host:
	bash scripts/host-prereqs.sh

# pip compiles what it installs to bytecode, but pycli itself is installed in place (-e): its own
# modules are compiled here once, so that each of the many pycli processes of a run reads them
# (Python writes no bytecode of its own where PYTHONDONTWRITEBYTECODE is set, and recompiles a
# module in memory, correctly, once its source is newer).
venv: $(BIN)/.installed

$(BIN)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "no supported Python answers here (one of: $(SUPPORTED_PYTHONS)); install one (python3.11 where you run make test too) or pass PYTHON=/path/to/python3.X" >&2; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test,torch]'
	$(BIN)/python -m compileall -q pycli $(NODE_PACKAGE_DIR) workloads tests >/dev/null
	touch $@

# The roles, playbooks and plugins as the Ansible collection pycli.cluster (galaxy.yml,
# docs/collection.md), built from this checkout and installed as a user installs it, into
# runs/collection/installed. make lint runs ansible-lint on that installed copy (production
# profile); ANSIBLE_ROLES_PATH there lets its syntax check of a single task file find a sibling
# role by its short name, as Ansible finds it inside the collection. The roles, playbooks and
# plugins are linted there, once: the checkout's own ansible-lint leaves them out (LINT_IN_COLLECTION)
# and lints the rest (galaxy.yml, meta/, molecule's scenarios, the tests' playbooks).
COLLECTION := runs/collection
COLLECTION_ROOT := $(COLLECTION)/installed/ansible_collections/pycli/cluster
LINT_IN_COLLECTION := roles playbooks plugins
collection: venv
	rm -rf $(COLLECTION) && out=$$($(BIN)/ansible-galaxy collection build --output-path $(COLLECTION) . 2>&1 \
		&& $(BIN)/ansible-galaxy collection install --force --no-deps -p $(COLLECTION)/installed $(COLLECTION)/pycli-cluster-*.tar.gz 2>&1) \
		|| { echo "$$out"; false; }; echo "make collection: $$(ls $(COLLECTION)/*.tar.gz), installed in $(COLLECTION)/installed"

# pycli's wheel, as a user installs it (pipx install, uv tool install): the Python packages and the
# tree they drive (roles, playbooks, workloads, ansible.cfg; setup.py), built from this checkout
# with .venv's setuptools. build/ is setuptools' scratch folder: removed before, so that a module
# removed from the tree is not carried on, and after, so that no copy of the roles stays beside them.
DIST := runs/dist
wheel: venv
	rm -rf build $(DIST) && $(call TIMED,second-venv,wheel) $(BIN)/pip wheel --quiet --no-deps --no-build-isolation -w $(DIST) . && rm -rf build

# The second Python's venv (make test): pycli installed from its wheel, not editable, so that the
# second Python's pycli is the installed form (its tree found in the package, from any folder:
# tests/integration/conftest.py, second_pycli), and its test extras, which leave torch out there
# (pyproject.toml). The venv is made again when pyproject.toml changes or SECOND_PYTHON is another
# interpreter (its stamp names the one it was made with); the wheel goes in again every time.
# It is made beside the first provisioning, so with less CPU than .venv: pip compiles nothing (with its compiling, pip took 170 s of CPU on a busy
# machine, 65 s of it for the 15,000 modules of the `ansible` bundle's collections; without, 50 s),
# and only what every pycli, Ansible and pytest process imports is compiled here, with pycli's own
# (8 s, against 54 s for all of site-packages but the collections); a test that imports more
# (scikit-learn, matplotlib) compiles it in memory.
SECOND_COMPILED := pycli pycli_node ansible ansible_runner ansible_mitogen mitogen jinja2 markupsafe yaml typer click rich pexpect ptyprocess \
	docker requests urllib3 _pytest pytest pluggy hypothesis
SITE_PACKAGES = $$($(1) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

second-venv: wheel
	@python=$$($(or $(SECOND_PYTHON),false) -c 'import sys; print(sys.executable)') || { echo "no second Python: none of $(SUPPORTED_PYTHONS) answers here; install one or pass SECOND_PYTHON=/path/to/python3.X" >&2; exit 2; }; \
	stamp=$(SECOND_BIN)/.installed; v="$(call python_version,$$python)"; wheel=$$(echo $(abspath $(DIST))/pycli-*.whl); \
	if [ -e $$stamp ] && [ $$stamp -nt pyproject.toml ] && [ "$$(cat $$stamp)" = "$$python" ]; then \
		echo "$(SECOND_VENV): Python $$v, up to date; pycli again from $$wheel"; \
		site="$(call SITE_PACKAGES,$(SECOND_BIN)/python)"; \
		$(call TIMED,second-venv,reinstall-py$$v) $(SECOND_BIN)/pip install --quiet --no-compile --no-deps --force-reinstall "$$wheel" && \
		$(SECOND_BIN)/python -m compileall -q "$$site/pycli" "$$site/pycli_node" >/dev/null; exit; fi; \
	set -x; rm -rf $(SECOND_VENV) && \
	$(call TIMED,second-venv,venv-py$$v) $$python -m venv $(SECOND_VENV) && \
	$(call TIMED,second-venv,pip-install-py$$v) $(SECOND_BIN)/pip install --quiet --no-compile "pycli[test] @ file://$$wheel" && \
	{ set +x; site="$(call SITE_PACKAGES,$(SECOND_BIN)/python)"; \
	  compiled=$$(for p in $(SECOND_COMPILED); do [ ! -d "$$site/$$p" ] || echo "$$site/$$p"; done); set -x; } && \
	$(call TIMED,second-venv,compileall-py$$v) $(SECOND_BIN)/python -m compileall -q pycli $(NODE_PACKAGE_DIR) workloads tests \
		$$compiled >/dev/null && \
	echo "$$python" >$$stamp

lint: venv collection
	$(call TIMED,lint,ansible-lint) $(NOISY) $(BIN)/ansible-lint $(foreach part,$(LINT_IN_COLLECTION),--exclude $(part))
	$(call TIMED,lint,ansible-lint-collection) $(NOISY) sh -c 'cd $(COLLECTION_ROOT) && ANSIBLE_COLLECTIONS_PATH=$(abspath $(COLLECTION)/installed) \
		ANSIBLE_ROLES_PATH=$(abspath $(COLLECTION_ROOT))/roles exec $(abspath $(BIN))/ansible-lint --profile production'
	$(call TIMED,lint,ruff) $(BIN)/ruff check pycli $(NODE_PACKAGE_DIR) workloads scripts plugins
	$(call TIMED,lint,mypy) $(BIN)/mypy
	$(call TIMED,lint,import-linter) $(BIN)/lint-imports --no-cache

unit: venv
	$(BIN)/pytest -q tests/unit --timings $(TIMINGS)/unit.tsv

# make test's unit tests, each run once: those that need torch (marker torch, tests/conftest.py)
# by .venv's Python 3.11, the others by the second Python.
unit-torch: venv
	$(BIN)/pytest -q tests/unit -m torch --timings $(TIMINGS)/unit.tsv

# make test runs it once the second venv is made (and its pycli in use by the integration tests,
# which a second install would pull from under them): unit-second-run alone.
unit-second: second-venv unit-second-run
unit-second-run:
	$(SECOND_BIN)/pytest -q tests/unit -m "not torch" --timings $(TIMINGS)/unit-second.tsv

# Where the suite's time goes: the timings table (every test), and its largest entries at the end.
# Run alone, `make integration` runs every lane's tests in one pytest, on one 2-node cluster and
# the 3-node one (its tests last); make test runs it for the 2-node cluster's lane
# (PYCLI_TEST_LANE=two-nodes) and, beside it, the Slurm lane and the 3-node cluster's, which make
# their clusters once the first provisioning has passed (tests/integration/conftest.py).
integration: venv
	$(BIN)/pytest -q tests/integration --timings $(TIMINGS)/integration.tsv

integration-slurm: venv
	PYCLI_TEST_LANE=slurm $(BIN)/pytest -q tests/integration --timings $(TIMINGS)/integration-slurm.tsv

integration-three-nodes: venv
	PYCLI_TEST_LANE=three-nodes $(BIN)/pytest -q tests/integration --timings $(TIMINGS)/integration-three-nodes.tsv

# The scenarios run under the strategy `pycli provision` runs the roles with (Mitogen's, unless
# PYCLI_ANSIBLE_STRATEGY=linear): what they prove holds for it, and a scenario's three runs of
# its playbook (converge, idempotence, check) cost about 40 % less CPU than with `linear`.
ANSIBLE_STRATEGY_ENV = $(BIN)/python -c 'from pycli.cluster.runner import strategy_env; print(" ".join(f"{k}={v}" for k, v in strategy_env().items()))'

# The controller folders the roles use are pycli's (pycli.core.paths), as under `pycli provision`.
# Removing a scenario's containers is Docker's work at the usual priority, which nice cannot hold
# back: under make test it takes the noisy-steps lock shared (NOISY), as ansible-lint does, so that
# it never runs while a test measures the cores (tests/integration/conftest.py, quiet_machine).
molecule: venv
	@strategy="$$($(ANSIBLE_STRATEGY_ENV))" && folders="$$($(BIN)/python -m pycli.core.paths)" || exit 1; \
	for scenario in default gpu_fixture gpu_adopt; do \
		env $$strategy $$folders $(NOISY) $(BIN)/molecule destroy -s $$scenario || exit 1; \
		env $$strategy $$folders $(call TIMED,molecule,$$scenario) $(BIN)/molecule test -s $$scenario --destroy never; passed=$$?; \
		env $$strategy $$folders $(call TIMED,molecule,$$scenario-destroy) $(NOISY) $(BIN)/molecule destroy -s $$scenario || exit 1; \
		[ $$passed -eq 0 ] || exit 1; \
	done

down: venv
	$(BIN)/pycli cluster down --name $(NAME)

clean: down
	rm -rf $(VENV) $(SECOND_VENV) runs
