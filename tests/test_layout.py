"""The package's layers stay visible: no import cycles, ctypes in one module, no module that
reaches back up into a front end."""

from __future__ import annotations

import ast
from pathlib import Path

import specgguf

ROOT = Path(specgguf.__file__).parent


def _modules() -> dict[str, Path]:
    import importlib

    conv = Path(importlib.import_module("specgguf.converters").__file__).parent
    out = {}
    for base, prefix in ((ROOT, "specgguf"), (conv, "specgguf.converters")):
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([prefix, *parts])] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every specgguf module `name` imports, at module level or inside functions."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import mod` depends on pkg.mod; `from pkg import name` on pkg itself
            subs = [f"{mod}.{a.name}" for a in node.names]
            targets = [t for t in subs if t in known]
            if len(targets) < len(subs):
                targets.append(mod)
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            # a module that imports its own package (`from . import x` in pkg/mod.py) depends on
            # pkg/__init__.py like any other module: that edge counts (only the root package is
            # left out: every module is inside it, and it imports nothing back but the API)
            if t and t != name and t != "specgguf":
                found.add(t)
    return found


def test_no_import_cycles():
    mods = _modules()
    graph = {name: _imports(name, path, set(mods)) for name, path in mods.items()}
    state, stack, cycles = {}, [], []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == "open":
                cycles.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = "done"

    for n in sorted(graph):
        if n not in state:
            visit(n)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_ctypes_only_in_native():
    users = [name for name, path in _modules().items() if "import ctypes" in path.read_text()]
    assert users and all(u.startswith("specgguf.runtime.native.") for u in users), users


def test_library_does_not_import_front_ends():
    mods = _modules()
    front = ("specgguf.cli", "specgguf.server")
    for name, path in mods.items():
        if name.startswith(front) or name == "specgguf.__main__" or name.startswith("specgguf.converters.cli"):
            continue
        bad = [m for m in _imports(name, path, set(mods)) if m.startswith(front)]
        assert not bad, f"{name} imports front ends {bad}"


# Each package and what it may import (besides itself and `specgguf.errors`): the layers of
# docs/layers.md, bottom to top. A new edge that breaks them fails here, not in review.
LAYERS = {
    "specgguf.synthetic": set(),
    "specgguf.runtime": {"specgguf.synthetic"},
    "specgguf.converters": {"specgguf.runtime"},
    "specgguf.decoding": {"specgguf.runtime"},
    "specgguf.drafters": {"specgguf.runtime", "specgguf.decoding"},
    "specgguf.inspection": {"specgguf.runtime", "specgguf.drafters"},
    "specgguf.request": {"specgguf.runtime", "specgguf.decoding", "specgguf.drafters"},
    "specgguf.loading": {"specgguf.runtime", "specgguf.converters", "specgguf.decoding", "specgguf.drafters"},
    "specgguf.llamacompat": {"specgguf.runtime", "specgguf.decoding", "specgguf.drafters", "specgguf.request",
                             "specgguf.loading"},
    "specgguf.api": {"specgguf.runtime", "specgguf.decoding", "specgguf.drafters", "specgguf.request",
                     "specgguf.loading", "specgguf.llamacompat"},
}


def _layer(name: str) -> str:
    return ".".join(name.split(".")[:2])


def test_packages_import_only_the_layers_below():
    mods = _modules()
    for name, path in mods.items():
        layer = _layer(name)
        if layer not in LAYERS:
            assert layer in ("specgguf", "specgguf.errors", "specgguf.cli", "specgguf.server", "specgguf.__main__"), \
                f"{layer} is in no layer of tests/test_layout.py LAYERS (and docs/layers.md): add it there"
            continue
        allowed = LAYERS[layer] | {layer, "specgguf.errors"}
        bad = sorted(m for m in _imports(name, path, set(mods)) if _layer(m) not in allowed and m != "specgguf")
        assert not bad, f"{name} ({layer}) imports {bad}; it may import only {sorted(allowed)}"


def test_every_layer_is_documented():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "layers.md").read_text()
    for layer in [*LAYERS, "specgguf.cli", "specgguf.server", "specgguf.errors"]:
        short = layer.removeprefix("specgguf.")
        assert f"`{short}" in doc, f"docs/layers.md does not name {short}"


def test_every_package_ships_in_the_wheel():
    """pyproject.toml lists the packages by name: a new subpackage missing there would be left
    out of the wheel (and of every pip install) while the source tree still works."""
    import tomllib

    listed = set(tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT.parent).parts) for p in ROOT.rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
