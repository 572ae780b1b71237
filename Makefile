# The two commands of the README: `make demo` trains the tiny model on this Python's standard
# library; `make test` runs the test suite. Both create .venv on first use.
VENV  := .venv
STAMP := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)
# The CPU wheel on these machines; on a GPU machine: make TORCH=torch demo
TORCH ?= torch==2.13.0

.PHONY: demo test
demo: $(STAMP)
	rm -rf runs/demo  # a fresh demo each time (shoal refuses to start over another run's metrics)
	$(VENV)/bin/shoal train --out runs/demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[dev]'
	rm -f $(VENV)/.installed-* && touch $@
