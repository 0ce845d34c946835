VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test bench lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check aotc tests benchmarks
	$(VENV)/bin/ruff format --check aotc tests benchmarks

test: lint
	OMP_WAIT_POLICY=passive $(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/kernels.py

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache .hypothesis
