# Two commands do all set-up: `make train` and `make test`. Both create .venv on first use.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
ARGS   ?=

.PHONY: train test test-slow lint bench clean

# pip takes torch==2.14.1 / torchvision==0.29.1 from this machine's disk (its cap stays on).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[all,dev]'
	touch $(STAMP)

# The main job: mnist1d, 4 workers, the emulated WAN, cpdp from K=1 with beta=0.3, and K
# chosen online by the exposed-sync controller.
train: $(STAMP)
	$(BIN)/autok train --policy exposed-sync $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow $(ARGS)

# ruff, then mypy over the installed packages ([tool.mypy] in pyproject.toml: what it checks).
# mypy cannot follow setuptools' package-dir mapping (trainer/ installs as autok.trainer), so it
# reads a tree of links laid out as the wheel installs the packages.
TYPECHECK := .typecheck/autok
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf .typecheck && mkdir -p $(TYPECHECK)
	ln -s $(CURDIR)/autok/*.py $(TYPECHECK)/
	ln -s $(CURDIR)/trainer $(TYPECHECK)/trainer
	ln -s $(CURDIR)/controllers $(TYPECHECK)/controllers
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/autok bench $(ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache
