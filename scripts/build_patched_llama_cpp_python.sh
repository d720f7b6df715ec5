#!/usr/bin/env bash
# Build llama-cpp-python 0.3.36 with specgguf's llama.cpp patches (patches/*.patch) and install
# it into the current Python environment. Needed only for DeepSpec Eagle3 drafts (5 target
# layers, q/k norms), which the stock build's eagle3 graph refuses.
#
#   CMAKE_ARGS="-DGGML_CUDA=on" scripts/build_patched_llama_cpp_python.sh   # CUDA
#   CMAKE_ARGS="-DGGML_METAL=on" scripts/build_patched_llama_cpp_python.sh  # Metal
#   scripts/build_patched_llama_cpp_python.sh                               # CPU
#
# Options: --no-install (build/cache only, print the wheel), --rebuild (ignore the cache).
# PYTHON picks the interpreter whose environment gets the wheel (default: python3 on PATH).
# The wheel is cached in ${XDG_CACHE_HOME:-~/.cache}/specgguf/wheels/<key>/, where the key
# hashes the version, the patches, CMAKE_ARGS and the Python/platform tag: a second run with
# the same inputs installs in seconds instead of compiling llama.cpp again (minutes).
set -euo pipefail

VERSION=0.3.36
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
INSTALL=1
REBUILD=0
for arg in "$@"; do
    case "$arg" in
        --no-install) INSTALL=0 ;;
        --rebuild) REBUILD=1 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "unknown option $arg (use --no-install, --rebuild)" >&2; exit 2 ;;
    esac
done

shopt -s nullglob
PATCHES=("$REPO"/patches/*.patch)
if [ ${#PATCHES[@]} -eq 0 ]; then
    echo "no patches found in $REPO/patches" >&2; exit 2
fi

# The cache key: anything that changes the compiled library changes the key.
KEY=$( { echo "$VERSION"; echo "${CMAKE_ARGS:-}"
         "$PY" -c 'import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())'
         cat "${PATCHES[@]}"; } | sha256sum | cut -c1-16)
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/specgguf/wheels/$KEY
CACHED=("$CACHE"/llama_cpp_python-"$VERSION"-*.whl)  # nullglob: empty when not built yet
WHEEL=${CACHED[0]:-}

if [ -n "$WHEEL" ] && [ "$REBUILD" = 0 ]; then
    echo "using cached wheel $WHEEL"
else
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    echo "fetching the llama-cpp-python $VERSION sdist"
    "$PY" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
    tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
    SRC=$WORK/llama_cpp_python-$VERSION
    for p in "${PATCHES[@]}"; do
        echo "applying $(basename "$p")"
        # --dry-run first: a patch that does not fit leaves the tree untouched and stops here
        patch -p1 --forward --quiet --dry-run -d "$SRC/vendor/llama.cpp" < "$p" >/dev/null \
            || { echo "patch $(basename "$p") does not apply to llama-cpp-python $VERSION" >&2; exit 1; }
        patch -p1 --forward --quiet -d "$SRC/vendor/llama.cpp" < "$p"
    done
    mkdir -p "$CACHE"
    LOG=$CACHE/build.log
    echo "building the wheel (compiles llama.cpp: minutes; CMAKE_ARGS='${CMAKE_ARGS:-}'; log: $LOG)"
    start=$(date +%s)
    export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}
    if ! "$PY" -m pip wheel --no-deps -v "$SRC" -w "$WORK/dist" > "$LOG" 2>&1; then
        tail -n 30 "$LOG" >&2
        echo "the build failed; full log in $LOG" >&2
        exit 1
    fi
    # copy then rename: a cache entry is either complete or absent
    BUILT=("$WORK"/dist/llama_cpp_python-"$VERSION"-*.whl)
    built=${BUILT[0]}
    cp "$built" "$CACHE/.partial" && mv "$CACHE/.partial" "$CACHE/$(basename "$built")"
    WHEEL=$CACHE/$(basename "$built")
    echo "built $WHEEL in $(( $(date +%s) - start )) s"
fi

if [ "$INSTALL" = 1 ]; then
    "$PY" -m pip install --quiet --force-reinstall --no-deps "$WHEEL"
    echo "installed the patched llama-cpp-python into $("$PY" -c 'import sys; print(sys.prefix)')"
else
    echo "$WHEEL"
fi
