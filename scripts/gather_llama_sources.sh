#!/usr/bin/env bash
# Gather what scripts/gpu_check.sh needs on a machine without network into one ignored folder
# (default .gpu-carry/, a few MB): the llama.cpp sources that build libllama,
# llama-speculative-simple and ggml-rpc-server (from the pinned llama-cpp-python sdist, without
# the backends the check does not build and without the web UI), the pure-Python `llama_cpp`
# package of that sdist, and the pure-Python packages specgguf imports that a bare python3
# with numpy, jinja2 and click lacks (gguf, diskcache, typing_extensions).
#
#   scripts/gather_llama_sources.sh [--sdist FILE] [--out DIR] [--vulkan]
#
# --vulkan keeps ggml-vulkan's sources (about 1 MB more), for scripts/gpu_check.sh --vulkan on a
# machine without network.
#
# Env: PYTHON (the interpreter whose pip downloads and whose site-packages hold gguf;
# default: .venv/bin/python if present, else python3).
set -euo pipefail

VERSION=0.3.36
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=$REPO/.gpu-carry
SDIST=
KEEP=
if [[ -x $REPO/.venv/bin/python ]]; then PY=${PYTHON:-$REPO/.venv/bin/python}; else PY=${PYTHON:-python3}; fi
while [[ $# -gt 0 ]]; do
    case "$1" in
        --sdist) SDIST=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --vulkan) KEEP=vulkan; shift ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "error: unknown option $1 (use --sdist FILE, --out DIR, --vulkan)" >&2; exit 2 ;;
    esac
done

WORK=$(mktemp -d -t specgguf-gather.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
if [[ -z $SDIST ]]; then
    echo "downloading the llama-cpp-python==$VERSION sdist" >&2
    "$PY" -m pip download --quiet --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$WORK/dl" >&2
    SDIST=$WORK/dl/llama_cpp_python-$VERSION.tar.gz
fi
[[ -f $SDIST ]] || { echo "error: sdist not found: $SDIST" >&2; exit 2; }
tar -xzf "$SDIST" -C "$WORK"
SRC=$WORK/llama_cpp_python-$VERSION
[[ -f $SRC/vendor/llama.cpp/CMakeLists.txt ]] || { echo "error: $SDIST is not the llama-cpp-python sdist" >&2; exit 2; }

STAGE=$WORK/stage
mkdir -p "$STAGE/llama.cpp" "$STAGE/py"
# the parts of vendor/llama.cpp that CMake reads for libllama, the examples and tools/rpc
(cd "$SRC/vendor/llama.cpp" && cp -a CMakeLists.txt LICENSE cmake ggml src include common vendor examples pocs tools licenses \
    "$STAGE/llama.cpp/")
# backends the check never turns on (their folders are read only when enabled), and the web UI
for b in vulkan sycl opencl cann hexagon et openvino webgpu virtgpu zdnn zendnn musa; do
    [[ $b == "$KEEP" ]] && continue
    rm -rf "$STAGE/llama.cpp/ggml/src/ggml-$b"
done
rm -rf "$STAGE/llama.cpp/tools/ui" "$STAGE/llama.cpp/tools/server/public"* "$STAGE/llama.cpp/examples/llama.android" \
    "$STAGE/llama.cpp/examples/llama.swiftui"
cp -a "$SRC/llama_cpp" "$STAGE/py/"
rm -rf "$STAGE/py/llama_cpp/lib"  # the libraries are built on the spot (LLAMA_CPP_LIB_PATH)
for mod in gguf diskcache typing_extensions; do
    path=$("$PY" -c "import $mod, os; f = $mod.__file__; print(os.path.dirname(f) if f.endswith('__init__.py') else f)")
    cp -a "$path" "$STAGE/py/"
done
find "$STAGE" -name __pycache__ -prune -exec rm -rf {} +
echo "llama-cpp-python==$VERSION" > "$STAGE/VERSION"

rm -rf "$OUT.tmp" && mv "$STAGE" "$OUT.tmp" && rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
echo "gathered $(du -sh "$OUT" | cut -f1) into $OUT (packed: $(tar -czf - -C "$(dirname "$OUT")" "$(basename "$OUT")" | wc -c | awk '{printf "%.1f MB", $1/1e6}'))" >&2
