"""The project's import order: an AST walk over every ``.py`` file of the repository (``soar/``,
``tests/``, ``scripts/``, ``benchmarks/``, ``dev/``), every import including those inside functions. No
import cycle among the project's modules, and no module of ``soar`` imports from a layer above its
own (``soar.LAYERS``, written out in ``soar/__init__.py``)."""

import ast
from pathlib import Path

import soar

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("soar", "tests", "scripts", "benchmarks", "dev")
TOP = max(soar.LAYERS.values()) + 1
"""Layer of the scripts, tests and benchmarks: above the package, importing anything of it."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file (``from a.b import c`` counts as
    ``a.b.c`` when that is a module, else ``a.b``; relative imports are resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # ``import soar.students.trainer`` -> that module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def layer(name: str) -> int:
    return soar.LAYERS[name] if name.startswith("soar") else TOP


def test_every_package_module_has_a_layer():
    missing = [m for m in project_modules() if m.startswith("soar") and m not in soar.LAYERS]
    assert not missing, f"add these modules to soar.LAYERS (soar/__init__.py): {missing}"


def test_no_module_imports_from_a_higher_layer():
    upward = [f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})"
              for m, targets in graph().items() for t in sorted(targets) if layer(t) > layer(m)]
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    edges = graph()
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def strongconnect(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in edges:
        if v not in index:
            strongconnect(v)
    assert not cycles, f"import cycles among: {cycles}"


def test_the_walk_sees_deferred_imports():
    """The walk reads imports inside functions too (e.g. ``soar.cli`` defers its stages)."""
    assert {"soar.loop", "soar.students.trainer", "soar.estimate"} <= graph()["soar.cli"]


def test_ruff_is_clean():
    """``ruff check`` (``[tool.ruff]`` in pyproject.toml) passes on every folder of the project's Python
    (FOLDERS holds all of it), not on whatever else lies in the checkout, such as a user's virtualenv."""
    import shutil
    import subprocess

    import pytest

    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    res = subprocess.run([ruff, "check", *(str(ROOT / f) for f in FOLDERS)], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
