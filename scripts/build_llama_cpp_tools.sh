#!/usr/bin/env bash
# Build llama.cpp's own speculative loop, `llama-speculative-simple`, and its RPC server,
# `ggml-rpc-server`, from the very llama.cpp that the pinned llama-cpp-python vendors: the C++
# baseline that tests/test_parity.py and scripts/bench_vs_cpp.py compare specgguf against, and
# the GGML_RPC libllama that tests/test_rpc.py and scripts/gpu_check.sh run on. One compile
# serves all of them.
#
# The sources are fetched at run time (pip download of the llama-cpp-python sdist), or taken
# from $SPECGGUF_LLAMA_SRC (a llama.cpp tree gathered beforehand: no network needed, see
# scripts/gather_llama_sources.sh), and the result goes to a cache outside the repository,
# reused while its stamp matches:
#
#   $SPECGGUF_CPP_TOOLS_DIR  (default ${XDG_CACHE_HOME:-$HOME/.cache}/specgguf/llama-cpp-tools/<version>)
#     bin/llama-speculative-simple
#     bin/ggml-rpc-server                (start one per machine that lends its CPU/GPU)
#     bin/libllama.so, bin/libggml*.so   (shared: specgguf loads these through LLAMA_CPP_LIB_PATH,
#                                         so both sides run the same bytes of llama.cpp)
#     stamp
#
# CMake options follow llama-cpp-python's own build where they matter for numerics: Release,
# shared libraries, GGML defaults (GGML_NATIVE on, OpenMP on), plus $CMAKE_ARGS, which is also
# what `pip install llama-cpp-python` passes (e.g. -DGGML_CUDA=on for a CUDA build), plus
# -mno-amx-* when the compiler is a GCC older than 13.2.1 (it miscompiles AMX). A Vulkan build
# (-DGGML_VULKAN=on in $CMAKE_ARGS) gets patches/vulkan-*.patch, as `specgguf build-llama --vulkan`
# does (Vulkan headers older than 1.3.272, e.g. Debian 12's), on a copy of the sources.
# The last line printed is the binary's path.
#
# Env: SPECGGUF_CPP_TOOLS_DIR, CMAKE_ARGS, PYTHON (interpreter whose pip downloads; default
# python3), SPECGGUF_BUILD_JOBS (default 2), SPECGGUF_LLAMA_SRC (vendor/llama.cpp of the sdist),
# SPECGGUF_CPP_TARGETS (other targets instead, e.g. "llama-server" for scripts/bench_parallel.py
# --llama-server: built into a cache folder of their own, .../llama-cpp-tools/<version>-<targets>,
# so the baseline's cache and stamp stay as they are; the last line is then the first target's path).
set -euo pipefail

VERSION=0.3.36
PYTHON=${PYTHON:-python3}
JOBS=${SPECGGUF_BUILD_JOBS:-2}
# shellcheck disable=SC2206  # a word list
TARGETS=(${SPECGGUF_CPP_TARGETS:-llama-speculative-simple ggml-rpc-server})
SUFFIX=${SPECGGUF_CPP_TARGETS:+-${TARGETS[*]}}
DEST=${SPECGGUF_CPP_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specgguf/llama-cpp-tools/$VERSION${SUFFIX// /+}}
BIN=$DEST/bin/${TARGETS[0]}

CMAKE_OPTS=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=ON
    -DLLAMA_BUILD_COMMON=ON
    -DLLAMA_BUILD_EXAMPLES=ON
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_TOOLS=ON   # configures tools/; only the targets below are compiled
    -DGGML_RPC=ON            # libggml-rpc and ggml-rpc-server: specgguf --rpc
    -DLLAMA_BUILD_SERVER=OFF
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_CURL=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    # everything lands in one folder: let binary and libraries find each other there
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
    "-DCMAKE_INSTALL_RPATH=\$ORIGIN"
)
[[ " ${TARGETS[*]} " == *" llama-server "* ]] && CMAKE_OPTS+=(-DLLAMA_BUILD_SERVER=ON)  # (the last one wins)
# shellcheck disable=SC2206  # CMAKE_ARGS is a word list by convention (as for pip)
EXTRA=(${CMAKE_ARGS:-})
# ...plus what this machine's compiler needs: GCC < 13.2.1 miscompiles llama.cpp's AMX kernels,
# so such a build leaves AMX out (specgguf/runtime/toolchain.py holds the rule; stdlib only)
mapfile -t EXTRA < <("$PYTHON" "$(dirname "$0")/../specgguf/runtime/toolchain.py" ${EXTRA[@]+"${EXTRA[@]}"})
PATCHES=()
if [[ " ${EXTRA[*]:-} " =~ \ -DGGML_VULKAN=(on|ON|1|true|TRUE)\  ]]; then
    PATCHES=("$(dirname "$0")"/../patches/vulkan-*.patch)
fi
PATCH_SUMS=""
[[ ${#PATCHES[@]} -gt 0 ]] && PATCH_SUMS=$(cat "${PATCHES[@]}" | sha256sum | cut -c1-16)
STAMP_TEXT="llama-cpp-python==$VERSION ${TARGETS[*]} ${CMAKE_OPTS[*]} ${EXTRA[*]:-}${PATCH_SUMS:+ patches:$PATCH_SUMS}"

if [[ -x $BIN && -f $DEST/stamp && "$(cat "$DEST/stamp")" == "$STAMP_TEXT" ]]; then
    echo "cached: $DEST" >&2
    echo "$BIN"
    exit 0
fi

WORK=$(mktemp -d -t specgguf-llama-build.XXXXXX)  # in $TMPDIR
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)

if [[ -n ${SPECGGUF_LLAMA_SRC:-} ]]; then
    SRC=$(cd "$SPECGGUF_LLAMA_SRC" && pwd)
else
    echo "downloading the llama-cpp-python==$VERSION sdist" >&2
    "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$WORK/dl" >&2
    tar -xzf "$WORK"/dl/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
    SRC=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp
fi
[[ -f $SRC/examples/speculative-simple/speculative-simple.cpp ]] || {
    echo "error: no examples/speculative-simple in $SRC" >&2; exit 1; }
if [[ ${#PATCHES[@]} -gt 0 ]]; then
    [[ -f $SRC/ggml/src/ggml-vulkan/ggml-vulkan.cpp ]] || {
        echo "error: $SRC has no ggml/src/ggml-vulkan (gathered without it? rerun scripts/gather_llama_sources.sh --vulkan)" >&2; exit 1; }
    if [[ $SRC != "$WORK"/* ]]; then  # never patch a tree we were only pointed at
        cp -a "$SRC" "$WORK/llama.cpp"
        SRC=$WORK/llama.cpp
    fi
    for p in "${PATCHES[@]}"; do
        patch -p1 --forward --quiet -d "$SRC" <"$p" || { echo "error: $(basename "$p") does not apply to $SRC" >&2; exit 1; }
    done
fi

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
echo "configuring (${EXTRA[*]:-no CMAKE_ARGS})" >&2
cmake -S "$SRC" -B "$WORK/build" "${GEN[@]}" "${CMAKE_OPTS[@]}" "${EXTRA[@]}" >"$WORK/configure.log" 2>&1 || {
    tail -40 "$WORK/configure.log" >&2; exit 1; }
echo "building ${TARGETS[*]} with -j$JOBS (many minutes on 2 cores)" >&2
cmake --build "$WORK/build" --target "${TARGETS[@]}" -j "$JOBS" >"$WORK/build.log" 2>&1 || {
    tail -60 "$WORK/build.log" >&2; exit 1; }

# install atomically: a half-copied cache must never look complete
rm -rf "$DEST.tmp"
mkdir -p "$DEST.tmp/bin"
for t in "${TARGETS[@]}"; do cp -a "$WORK/build/bin/$t" "$DEST.tmp/bin/"; done
cp -a "$WORK/build/bin/"lib*.so* "$DEST.tmp/bin/"
echo "$STAMP_TEXT" >"$DEST.tmp/stamp"
echo "$(( $(date +%s) - start ))" >"$DEST.tmp/build_seconds"
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
echo "built in $(cat "$DEST/build_seconds")s: $DEST" >&2
echo "$BIN"
