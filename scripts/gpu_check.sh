#!/usr/bin/env bash
# One command for a GPU machine that starts bare (nvcc, CMake and python3 with numpy, jinja2 and
# click; no network, no pip): build libllama, llama-speculative-simple and ggml-rpc-server for the
# local GPU only from the llama.cpp sources gathered beforehand, make real-shaped synthetic models
# (a Qwen3-8B-shaped Q4_K_M target with the real 151936-token vocabulary, DeepSpec-shaped DSpark
# and DFlash drafts, an EAGLE-3 head) and print one table, also written as JSON: plain tokens/s,
# specgguf vs C++ tokens/s at fixed draft lengths for ngram, dspark, dflash and eagle3 (suffix and
# hybrid: specgguf alone), Python time per round, the verify-cost curve 1..64.
#
# Before (on a machine with network):  scripts/gather_llama_sources.sh     -> .gpu-carry/ (ignored)
# There:                                scripts/gpu_check.sh               (CUDA, full shapes)
# Rehearsal on a CPU (CI does this):    scripts/gpu_check.sh --cpu --small
# AMD/Intel GPUs, or Mesa's lavapipe:   scripts/gpu_check.sh --vulkan [--small]
#
# Options: --cpu (CPU build; it is the C++ tools build of scripts/build_llama_cpp_tools.sh, so a
# machine that has built it compiles nothing), --vulkan (llama.cpp's Vulkan backend, every layer
# offloaded; needs libvulkan-dev, glslc and spirv-headers to build and a Vulkan driver to run: on a
# machine without a GPU, Mesa's lavapipe from mesa-vulkan-drivers, which ggml-vulkan uses only
# when GGML_VK_VISIBLE_DEVICES names it: set to 0 here when vulkaninfo sees CPU devices only), --small (small widths and depths, the real
# vocabulary), --out FILE (default bench/gpu_check.json), --tokens N, --lengths 4,8,16, --repeat N,
# --kinds ngram,suffix,dspark,dflash,eagle3,hybrid,mtp, --trace (Python us per round by phase, wall and
# thread CPU time), --no-cpp (specgguf's side only), --gemma (the trace on the embedded 262k-token Gemma too).
# With --no-cpp and LLAMA_CPP_LIB_PATH set, nothing is built: specgguf runs on those libraries.
# Env: SPECGGUF_GPU_CARRY (default .gpu-carry), SPECGGUF_BUILD_JOBS (default: all CPUs),
# CUDA_ARCH (default: the local GPU's, from nvidia-smi), PYTHON (default python3), GGML_VK_VISIBLE_DEVICES.
# The build goes to ${XDG_CACHE_HOME:-~/.cache}/specgguf/llama-cpp-tools/0.3.36[-cuda|-vulkan], reused
# while its stamp matches.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
CARRY=${SPECGGUF_GPU_CARRY:-$REPO/.gpu-carry}
PY=${PYTHON:-python3}
CPU=0
VULKAN=0
PASS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --cpu) CPU=1; shift ;;
        --vulkan) VULKAN=1; shift ;;
        --small|--trace|--no-cpp|--gemma) PASS+=("$1"); shift ;;
        --out|--tokens|--lengths|--repeat|--threads|--kinds) PASS+=("$1" "$2"); shift 2 ;;
        -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
        *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

[[ $CPU == 1 && $VULKAN == 1 ]] && { echo "error: --cpu and --vulkan exclude each other: pick one" >&2; exit 2; }
start=$SECONDS
export SPECGGUF_BUILD_JOBS=${SPECGGUF_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
if [[ -f $CARRY/llama.cpp/CMakeLists.txt ]]; then
    export SPECGGUF_LLAMA_SRC=$CARRY/llama.cpp  # no download
fi
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/specgguf/llama-cpp-tools/0.3.36
if [[ $CPU == 1 ]]; then
    export CMAKE_ARGS=${CMAKE_ARGS:-}
    BACKEND=cpu
    GPU_LAYERS=0
elif [[ $VULKAN == 1 ]]; then
    # the same check and one line as `specgguf build-llama --vulkan` (stdlib only: a bare machine runs it)
    PYTHONPATH=$REPO "$PY" -c "import sys; from specgguf.runtime import building
try: building.vulkan_check()
except building.BuildError as e: sys.exit(f'error: {e}')" || exit 2
    if [[ -z ${GGML_VK_VISIBLE_DEVICES+x} ]] && command -v vulkaninfo >/dev/null; then
        types=$(vulkaninfo --summary 2>/dev/null | sed -n 's/.*deviceType *= *//p' | sort -u)
        if [[ $types == PHYSICAL_DEVICE_TYPE_CPU ]]; then
            export GGML_VK_VISIBLE_DEVICES=0
            echo "vulkan: only CPU-type devices (lavapipe): GGML_VK_VISIBLE_DEVICES=0" >&2
        fi
    fi
    DEVICE=$(vulkaninfo --summary 2>/dev/null | sed -n 's/.*deviceName *= *//p' | sed -n "$(( ${GGML_VK_VISIBLE_DEVICES:-0} + 1 ))p")
    # the device's largest storage buffer: gpu_check.py cuts the batch so that a batch of logits
    # fits it (lavapipe's 128 MiB holds 220 rows of Qwen3's vocabulary, not 512; passes crashed)
    RANGE=$(vulkaninfo 2>/dev/null | sed -n 's/.*maxStorageBufferRange *= *//p' | sed -n "$(( ${GGML_VK_VISIBLE_DEVICES:-0} + 1 ))p")
    [[ $RANGE =~ ^[0-9]+$ ]] && LIMIT=(--buffer-limit "$RANGE")
    export CMAKE_ARGS="-DGGML_VULKAN=on ${CMAKE_ARGS:-}"
    export SPECGGUF_CPP_TOOLS_DIR=${SPECGGUF_CPP_TOOLS_DIR:-$CACHE-vulkan}
    BACKEND="vulkan${DEVICE:+ $DEVICE}"
    GPU_LAYERS=99
else
    command -v nvcc >/dev/null || { echo "error: no nvcc on PATH: run with --cpu, or install the CUDA toolkit" >&2; exit 2; }
    ARCH=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.[:space:]')}
    [[ -n $ARCH ]] || { echo "error: cannot read the GPU's compute capability (nvidia-smi); set CUDA_ARCH, e.g. 90" >&2; exit 2; }
    export CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$ARCH ${CMAKE_ARGS:-}"
    export SPECGGUF_CPP_TOOLS_DIR=${SPECGGUF_CPP_TOOLS_DIR:-$CACHE-cuda}
    BACKEND="cuda sm_$ARCH"
    GPU_LAYERS=99
fi
if [[ " ${PASS[*]:-} " == *" --no-cpp "* && -n ${LLAMA_CPP_LIB_PATH:-} ]]; then
    # specgguf's side only, on libraries built already (e.g. the lib/ of a `specgguf build-llama
    # --vulkan` wheel): nothing to compile
    LIB=$LLAMA_CPP_LIB_PATH
    echo "build: none (--no-cpp on LLAMA_CPP_LIB_PATH=$LIB)" >&2
else
    "$REPO/scripts/build_llama_cpp_tools.sh" >/dev/null
    LIB=${SPECGGUF_CPP_TOOLS_DIR:-$CACHE}/bin
fi
BUILT=$(( SECONDS - start ))
echo "build: ${BUILT} s" >&2

# the pure-Python packages a bare machine lacks travel in $CARRY/py; the repository is specgguf
PYPATH=$REPO
[[ -d $CARRY/py ]] && PYPATH=$REPO:$CARRY/py
PYTHONPATH=$PYPATH${PYTHONPATH:+:$PYTHONPATH} LLAMA_CPP_LIB_PATH=$LIB SPECGGUF_CPP_TOOLS_DIR=${SPECGGUF_CPP_TOOLS_DIR:-$CACHE} \
    "$PY" "$REPO/scripts/gpu_check.py" --backend "$BACKEND" --gpu-layers "$GPU_LAYERS" --build-seconds "$BUILT" \
    ${LIMIT[@]+"${LIMIT[@]}"} ${PASS[@]+"${PASS[@]}"}
echo "total: $(( SECONDS - start )) s" >&2
