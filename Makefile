VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench lint clean

$(STAMP): pyproject.toml runtime/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ./runtime -e '.[test]'
	touch $(STAMP)

# Build the bundled recipe, run the package, and compare it with onnxruntime.
demo: $(STAMP)
	$(VENV)/bin/aotc build recipes/mlp.yaml
	$(VENV)/bin/aotc inspect build/mlp.aotc
	$(VENV)/bin/aotc validate build/mlp.aotc --model recipes/models/mlp.onnx

lint: $(STAMP)
	$(VENV)/bin/ruff check aotc runtime tests benchmarks recipes
	$(VENV)/bin/ruff format --check aotc runtime tests benchmarks recipes

# One pytest worker per core (pytest-xdist): the suite took 16-17 minutes serially on a 2-core Zen 3, 10 with two.
test: lint
	$(PY) -m pytest -q -n auto

bench: $(STAMP)
	$(PY) benchmarks/kernels.py

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache .hypothesis
