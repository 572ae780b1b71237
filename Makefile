# The two commands of the README: `make demo` trains the tiny model on this Python's standard
# library; `make test` runs the test suite. Both create .venv on first use.
VENV  := .venv
STAMP := $(VENV)/.installed-$(shell cksum < pyproject.toml | cut -d' ' -f1)
# The CPU wheel on these machines; on a GPU machine: make TORCH=torch demo
TORCH ?= torch==2.13.0

.PHONY: demo test test-fast system-packages docs
demo: $(STAMP)
	rm -rf runs/demo  # a fresh demo each time (shoal refuses to start over another run's metrics)
	$(VENV)/bin/shoal train --out runs/demo

# Two pytest workers, each test file whole on one of them (its module fixtures start once): they keep
# 2 cores busy where one left a core idle while its multi-rank tests wait (docs/architecture.md, Tests).
# TEST_JOBS=0 runs every test in this process, for a debugger.
TEST_JOBS ?= 2
test: $(STAMP)
	$(VENV)/bin/python -m pytest -n $(TEST_JOBS) --dist loadfile

# the in-process tier, for contributors between edits (about 3 minutes); `make test` runs everything
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -n $(TEST_JOBS) --dist loadfile tests/unit

# the guide's pictures (docs/img), drawn by shoal's code; tests/unit/test_guide_figures.py fails when they are stale
docs: $(STAMP)
	$(VENV)/bin/python -m shoal.report.guide_figures docs/img

# pip byte-compiles what it installs on one core (about 90 of the 170 s here); compileall does the same on
# every core after it, less what nothing here imports: packages' own tests and transformers' per-model modules
# (5,500 of 17,800 files; 21 -> 13 s). Its exit status is ignored: a few files are for newer Pythons (torch's
# py312_intrinsics), which pip skips too, and an uncompiled module is only compiled when first imported.
$(STAMP): pyproject.toml | system-packages
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-compile "$(TORCH)"
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-compile -e '.[dev]'
	$(VENV)/bin/python -m compileall -q -j 0 -x '/(tests?|transformers/models)/' $(VENV)/lib > /dev/null || true
	rm -f $(VENV)/.installed-* && touch $@

# Debian packages the tests use, installed once when make runs as root (a no-op when present; the
# tests that need them skip, saying why, where they cannot be installed): chromium for the report
# pages, slurm-wlm and munge for a real Slurm, iproute2 for the emulated two-node cluster.
SYSTEM_PACKAGES := chromium slurm-wlm munge iproute2
system-packages:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	[ -z "$$missing" ] || [ "$$(id -u)" != 0 ] || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null)
