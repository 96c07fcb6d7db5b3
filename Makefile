# Tocsin developer loop. `make demo` and `make test` need nothing but Python 3.11:
# each installs what it uses into a virtual environment of its own.
PYTHON ?= python3
VENV   := .venv
SAMENV := .venv-sam
CHKENV := .venv-checks
BIN    := $(VENV)/bin
REGION := us-east-1
TASKS  ?= 200

tool_pins = $(shell $(PYTHON) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml","rb"))["tool"]["tocsin"]["tools"]["$(1)"]))')

.PHONY: demo test lock lint format unit unit-runtime validate sam-validate sam-build cfn-lint statelint checkov clean

demo: $(VENV)/.installed
	$(BIN)/tocsin demo --tasks $(TASKS)

test: lint validate unit unit-runtime

unit: $(VENV)/.installed
	$(BIN)/pytest -q

# The functions run on Python 3.13 (template.yaml). Where one is found, as the layer's
# build finds it, every test runs again on it, in a .venv of its own, from the same locks.
RUNTIME_PYTHON = $(shell $(MAKE) -s --no-print-directory -C layers/tocsin runtime-python)

unit-runtime:
	@if [ -z "$(RUNTIME_PYTHON)" ]; then \
		echo "no Python 3.13 found: the tests ran on $(PYTHON) only"; \
	else \
		$(MAKE) --no-print-directory unit VENV=.venv-313 PYTHON="$(RUNTIME_PYTHON)"; \
	fi

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

validate: sam-validate sam-build cfn-lint statelint checkov

sam-validate: $(SAMENV)/.installed
	$(SAMENV)/bin/sam validate --lint --region $(REGION)

sam-build: $(SAMENV)/.installed
	$(SAMENV)/bin/sam build --region $(REGION)

cfn-lint: $(VENV)/.installed
	$(BIN)/cfn-lint template.yaml

checkov: $(CHKENV)/.installed
	$(CHKENV)/bin/checkov -f template.yaml --framework cloudformation --compact --quiet --skip-download

statelint: $(VENV)/.installed $(CHKENV)/.installed
	mkdir -p .build
	$(BIN)/tocsin asl > .build/task.asl.json
	$(CHKENV)/bin/statelint .build/task.asl.json

# Everything the .venv and the layer install is locked, with hashes, in requirements/
# (`make lock` writes the locks from pyproject.toml; a test fails when they disagree).
$(VENV)/.installed: pyproject.toml requirements/dev.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --require-hashes -r requirements/dev.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

LOCK = $(BIN)/uv pip compile pyproject.toml --universal --python-version 3.11 --generate-hashes -q

lock: $(VENV)/.installed
	$(LOCK) -o requirements/runtime.txt
	$(LOCK) --extra local --extra dev -o requirements/dev.txt

$(SAMENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(SAMENV)
	$(SAMENV)/bin/pip install -q $(call tool_pins,sam)
	touch $@

$(CHKENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(CHKENV)
	$(CHKENV)/bin/pip install -q $(call tool_pins,checks)
	touch $@

clean:
	rm -rf $(VENV) .venv-313 $(SAMENV) $(CHKENV) .aws-sam .build .pytest_cache .ruff_cache
