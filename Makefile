# The README's two commands: `make demo` and `make test`. Each creates .venv when it is missing.
PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
# CPU-only PyTorch wheels (no multi-GB CUDA libraries). CUDA users: see the README.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
PIP := $(VENV)/bin/python -m pip
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# uv installs the dependencies where it can be installed (it resolves and unpacks in parallel;
# tools/uv_args.py gives it pip's indexes and constraints, so both choose the same versions), else
# pip; neither compiles: the modules are then compiled on every core (pip would compile them on
# one), without the files of transformers' models other than those tformer loads.
NOT_COMPILED := transformers/models/(?!auto/|marian/|encoder_decoder/)[^/]+/

.PHONY: demo test lint format bench notebook clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# torch first: keep an installed one (e.g. a CUDA build), else a local CPU wheel, else the CPU index
	@$(BIN)/python -c "import torch" 2>/dev/null \
	  || $(PIP) install -q --no-compile --no-index --no-deps "torch==$(TORCH_VERSION)" 2>/dev/null \
	  || $(PIP) install -q --no-compile "torch==$(TORCH_VERSION)" --index-url $(TORCH_INDEX) \
	       --extra-index-url https://pypi.org/simple
	{ $(PIP) install -q uv 2>/dev/null && $(BIN)/uv pip install -q --python $(BIN)/python \
	    $$($(BIN)/python tools/uv_args.py) -e ".[dev,serve]"; } \
	  || $(PIP) install -q --no-compile -e ".[dev,serve]"
	@# || true: a few packages ship files that are not Python 3 (pip skips them too)
	@$(BIN)/python -m compileall -qq -j 0 -x '$(NOT_COMPILED)' $(VENV)/lib || true
	@touch $@

demo: $(STAMP)
	$(BIN)/tformer train
	@echo
	@echo "Translating test sentences (adjective-noun pairs never seen in training):"
	@{ head -n 3 data/toy/test.tsv; grep -m 1 ' because ' data/toy/test.tsv; } > $(VENV)/demo.tsv
	@cut -f1 $(VENV)/demo.tsv | $(BIN)/tformer translate --quiet | paste $(VENV)/demo.tsv - \
	  | awk -F'\t' '{ printf "  source:      %s\n  reference:   %s\n  translation: %s\n\n", $$1, $$2, $$3 }'
	@echo "Next: the tour in README.md, where -m toy names the newest runs/toy-<time>: this run."

# The suite in TEST_JOBS processes (pytest-xdist), a test file per process at a time: the
# module-scoped fixtures (trained runs, compiled steps) are built once per file as before. Files
# go out in the order tests/conftest.py sets (those with a slow test first), so that the
# processes finish together rather than one running a long file alone at the end.
TEST_JOBS ?= 2
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_train.py

# Re-execute the tour in place (its runs in a temporary folder), outputs kept for GitHub.
notebook: $(STAMP)
	$(BIN)/python -m tests.test_notebook notebooks/tour.ipynb

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
