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
#
# Options: --cpu (CPU build; it is the C++ tools build of scripts/build_llama_cpp_tools.sh, so a
# machine that has built it compiles nothing), --small (small widths and depths, the real
# vocabulary), --out FILE (default bench/gpu_check.json), --tokens N, --lengths 4,8,16, --repeat N,
# --kinds ngram,suffix,dspark,dflash,eagle3,hybrid,mtp, --trace (Python us per round by phase, wall and
# thread CPU time), --no-cpp (specgguf's side only), --gemma (the trace on the embedded 262k-token Gemma too).
# Env: SPECGGUF_GPU_CARRY (default .gpu-carry), SPECGGUF_BUILD_JOBS (default: all CPUs),
# CUDA_ARCH (default: the local GPU's, from nvidia-smi), PYTHON (default python3).
# The build goes to ${XDG_CACHE_HOME:-~/.cache}/specgguf/llama-cpp-tools/0.3.36[-cuda], reused
# while its stamp matches.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
CARRY=${SPECGGUF_GPU_CARRY:-$REPO/.gpu-carry}
PY=${PYTHON:-python3}
CPU=0
PASS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --cpu) CPU=1; shift ;;
        --small|--trace|--no-cpp|--gemma) PASS+=("$1"); shift ;;
        --out|--tokens|--lengths|--repeat|--threads|--kinds) PASS+=("$1" "$2"); shift 2 ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

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
else
    command -v nvcc >/dev/null || { echo "error: no nvcc on PATH: run with --cpu, or install the CUDA toolkit" >&2; exit 2; }
    ARCH=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.[:space:]')}
    [[ -n $ARCH ]] || { echo "error: cannot read the GPU's compute capability (nvidia-smi); set CUDA_ARCH, e.g. 90" >&2; exit 2; }
    export CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$ARCH ${CMAKE_ARGS:-}"
    export SPECGGUF_CPP_TOOLS_DIR=${SPECGGUF_CPP_TOOLS_DIR:-$CACHE-cuda}
    BACKEND="cuda sm_$ARCH"
    GPU_LAYERS=99
fi
"$REPO/scripts/build_llama_cpp_tools.sh" >/dev/null
BUILT=$(( SECONDS - start ))
echo "build: ${BUILT} s" >&2
LIB=${SPECGGUF_CPP_TOOLS_DIR:-$CACHE}/bin

# the pure-Python packages a bare machine lacks travel in $CARRY/py; the repository is specgguf
PYPATH=$REPO
[[ -d $CARRY/py ]] && PYPATH=$REPO:$CARRY/py
PYTHONPATH=$PYPATH${PYTHONPATH:+:$PYTHONPATH} LLAMA_CPP_LIB_PATH=$LIB SPECGGUF_CPP_TOOLS_DIR=${SPECGGUF_CPP_TOOLS_DIR:-$CACHE} \
    "$PY" "$REPO/scripts/gpu_check.py" --backend "$BACKEND" --gpu-layers "$GPU_LAYERS" --build-seconds "$BUILT" \
    ${PASS[@]+"${PASS[@]}"}
echo "total: $(( SECONDS - start )) s" >&2
