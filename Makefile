# Quick start: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CPU build from the local wheel; an unpinned torch pulls a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0

.PHONY: demo test docs bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH_PIN)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH_PIN) -e '.[models,test,onnx]'
	touch $(STAMP)

# The import contract (.importlinter, docs/architecture.md) first: an upward import fails fast.
# The tests run in one worker per CPU (pytest-xdist, at most 4), each test file whole in one worker.
test: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q -ra -n auto --maxprocesses 4 --dist loadfile $(PYTEST_ARGS)

# `make demo DATA=folder` (train.tsv + dev.tsv); default: ../shared/data/sst2, else the hub's GLUE SST-2.
demo: $(STAMP)
	$(VENV)/bin/transferset run --config configs/demo.yaml $(if $(DATA),data=$(DATA))

# The documentation site, built strictly into site/: the command and configuration pages are regenerated from
# the code first (docs/generate.py), then a broken link or a page missing from mkdocs.yml fails the build.
docs: $(STAMP)
	$(PY) docs/generate.py
	$(VENV)/bin/mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(PY) benchmarks/augment.py
	$(PY) benchmarks/score.py
	$(PY) benchmarks/train.py

clean:
	rm -rf $(VENV) build *.egg-info runs site
