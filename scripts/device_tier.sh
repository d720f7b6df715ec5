#!/usr/bin/env bash
# The device tier (tests/test_device.py) on llama.cpp's Vulkan backend: every layer offloaded,
# on an AMD or Intel GPU, or on a CPU-only machine through Mesa's lavapipe.
#
#   scripts/device_tier.sh          the default device tests (about 6 min on lavapipe, 2 cores)
#   scripts/device_tier.sh --all    the slow ones too (the Gemma 4 assistant, the eagle3 prompt
#                                   cache, llama-speculative-simple per round on Vulkan)
#
# Needs (Debian/Ubuntu): apt install libvulkan-dev glslc spirv-headers mesa-vulkan-drivers vulkan-tools.
# Builds the Vulkan llama-cpp-python into .venv-vulkan with `specgguf build-llama --vulkan`
# (one compile, about 6 min on 2 cores; cached in ~/.cache/specgguf/wheels), then runs the tests
# there with SPECGGUF_REQUIRE_DEVICE=1, so that a missing device fails instead of skipping.
# --all also builds llama-speculative-simple with Vulkan (scripts/build_llama_cpp_tools.sh,
# cached) for the per-round comparison. Env: GGML_VK_VISIBLE_DEVICES (set to 0 here when
# vulkaninfo sees CPU devices only: ggml-vulkan skips those unless named).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
ALL=0
case "${1:-}" in
    --all) ALL=1 ;;
    "") ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
esac
took() { echo "[device] $1: $(( SECONDS - $2 )) s" >&2; }

command -v vulkaninfo >/dev/null && vulkaninfo --summary >/dev/null 2>&1 \
    || { echo "error: no Vulkan driver answers (vulkaninfo): install mesa-vulkan-drivers (lavapipe) or a GPU's driver, and vulkan-tools" >&2; exit 2; }
if [[ -z ${GGML_VK_VISIBLE_DEVICES+x} ]]; then
    types=$(vulkaninfo --summary 2>/dev/null | sed -n 's/.*deviceType *= *//p' | sort -u)
    if [[ $types == PHYSICAL_DEVICE_TYPE_CPU ]]; then
        export GGML_VK_VISIBLE_DEVICES=0
        echo "[device] only CPU-type Vulkan devices (lavapipe): GGML_VK_VISIBLE_DEVICES=0" >&2
    fi
fi

t=$SECONDS
[[ -x .venv-vulkan/bin/python ]] || python3 -m venv .venv-vulkan
.venv-vulkan/bin/pip install -q -e '.[test]'
.venv-vulkan/bin/specgguf build-llama --vulkan
took "venv and specgguf build-llama --vulkan" $t

MARK="not slow"
if [[ $ALL == 1 ]]; then
    MARK="slow or not slow"
    t=$SECONDS
    export SPECGGUF_CPP_TOOLS_DIR=${SPECGGUF_CPP_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specgguf/llama-cpp-tools/0.3.36-vulkan}
    CMAKE_ARGS="-DGGML_VULKAN=on ${CMAKE_ARGS:-}" PYTHON=.venv-vulkan/bin/python scripts/build_llama_cpp_tools.sh >/dev/null
    took "llama-speculative-simple with Vulkan" $t
fi
t=$SECONDS
SPECGGUF_REQUIRE_DEVICE=1 .venv-vulkan/bin/python -m pytest -q -p no:cacheprovider -m "$MARK" tests/test_device.py
took "device tier ($MARK)" $t
