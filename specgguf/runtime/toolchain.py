"""CMake flags that make a llama.cpp build run on this machine's compiler (stdlib only).

GCC before 13.2.1 miscompiles the AMX tile-configuration intrinsic (runtime/amx.py,
docs/machines.md): a GGML_NATIVE build on an AMX CPU then crashes at its first matrix multiply.
`-mno-amx-tile -mno-amx-int8 -mno-amx-bf16` keep AMX out of such a build (GCC honours an explicit
`-mno-` over `-march=native` in either order), and ggml then compiles no AMX code: the build
runs at the speed of a CPU without AMX. Clang and newer GCCs keep AMX.

Used by `specgguf build-llama` (runtime/building.py) and, run as a script, by the shell
scripts that build llama.cpp: `python3 specgguf/runtime/toolchain.py ARG...` prints the given
CMake arguments merged with the flags this compiler needs, one argument per line.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess

NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
FIXED_GCC = (13, 2, 1)  # the first GCC that passes the 64-byte tile configuration whole


def compiler(command: str) -> tuple[str, tuple[int, int, int]] | None:
    """("gcc" | "clang" | other, version) of a C or C++ compiler command, from its predefined
    macros; None when it cannot be run."""
    argv = shlex.split(command)
    if not argv or shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run([*argv, "-dM", "-E", "-x", "c", os.devnull], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    macros = dict(line.split(" ", 2)[1:3] for line in out.splitlines()
                  if line.startswith("#define ") and len(line.split(" ", 2)) == 3)

    def num(name):
        try:
            return int(macros.get(name, "0"))
        except ValueError:
            return 0

    if "__clang__" in macros:
        return "clang", (num("__clang_major__"), num("__clang_minor__"), num("__clang_patchlevel__"))
    if "__GNUC__" in macros:
        return "gcc", (num("__GNUC__"), num("__GNUC_MINOR__"), num("__GNUC_PATCHLEVEL__"))
    return None


def miscompiles_amx(found: tuple[str, tuple[int, int, int]] | None) -> bool:
    return found is not None and found[0] == "gcc" and found[1] < FIXED_GCC


def compilers(env: dict | None = None) -> list[str]:
    """The compilers CMake picks by default: $CC / $CXX, else cc / c++."""
    env = os.environ if env is None else env
    return [env.get("CC") or "cc", env.get("CXX") or "c++"]


def amx_flags(machine: str | None = None, found: list | None = None) -> list[str]:
    """CMake arguments that keep AMX out of a build with a compiler that miscompiles it (x86
    only); [] when every compiler CMake would use handles AMX. `found` replaces the detected
    compilers (tests)."""
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64", "x86", "i686"):
        return []
    found = [compiler(c) for c in compilers()] if found is None else found
    if not any(miscompiles_amx(f) for f in found):
        return []
    return [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]


def merge(args: list[str], extra: list[str]) -> list[str]:
    """`args` (the user's own CMake arguments) plus `extra`; a -DNAME=value that both set keeps
    the user's value with ours appended (CMake would otherwise keep only the last)."""
    out = list(args)
    for flag in extra:
        name, _, value = flag.partition("=")
        for i, arg in enumerate(out):
            if arg.startswith(name + "=") or arg.startswith(name + ":"):
                out[i] = f"{arg} {value}"
                break
        else:
            out.append(flag)
    return out


def describe(found: list | None = None) -> str:
    """One line for `specgguf doctor` and build logs."""
    found = [compiler(c) for c in compilers()] if found is None else found
    names = [f"{f[0]} {'.'.join(map(str, f[1]))}" if f else "none found" for f in found]
    text = f"C compiler {names[0]}, C++ compiler {names[1]}"
    if amx_flags(found=found):
        text += f" (miscompiles AMX: builds add {NO_AMX})"
    return text


if __name__ == "__main__":  # pragma: no cover - exercised by the build scripts
    import sys

    for arg in merge(sys.argv[1:], amx_flags()):
        print(arg)
