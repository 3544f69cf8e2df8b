"""The project's import order: an AST walk over every ``.py`` file of the repository (``soar/``,
``tests/``, ``scripts/``, ``benchmarks/``, ``dev/``), every import including those inside functions, and
what an import runs besides its module: the packages above it (their ``__init__``). No import cycle among
the project's modules, no module of ``soar`` imports from a layer above its own (``soar.LAYERS``, written
out in ``soar/__init__.py``), the teacher and student roles never import each other, and the package
imports its own modules inside a function only where ``DEFERRED`` says why."""

import ast
from pathlib import Path

import soar

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("soar", "tests", "scripts", "benchmarks", "dev")
TOP = max(soar.LAYERS.values()) + 1
"""Layer of the scripts, tests and benchmarks: above the package, importing anything of it."""
DEFERRED = {
    "soar/__init__.py": 5,  # the API (compose, validate, train, train_rl, fail_at_k): this file runs everywhere
    "soar/cli.py": 16,  # each command's stage, after Hydra composed: --cfg job and a bad override load no torch
    "soar/worlds/arith.py": 1,  # the world model's pretraining (torch), when a model is built
    "soar/worlds/arith_team.py": 1,  # the same for the team world
}
"""Files of ``soar`` that import project modules inside functions, and how many such imports each has: the
interfaces (the API, the commands) import their stages when called, and a world module its model's
pretraining when a model is built, so composing a config stays light (``tests/test_config.py``)."""
ROLES = ("soar.teachers", "soar.students")
"""The two roles: neither imports the other (what both need is below them, ``soar.policy``; what joins
them is above, ``soar.rewards``)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))}


def imports_of(name: str, path: Path, modules: dict[str, Path], deferred: bool = True) -> set[str]:
    """The project modules ``name`` imports anywhere in its file (``from a.b import c`` counts as
    ``a.b.c`` when that is a module, else ``a.b``; relative imports are resolved); without ``deferred``,
    only those its import runs (not inside a function)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    nodes = ast.walk(tree) if deferred else top_level_nodes(tree)
    for node in nodes:
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


def top_level_nodes(tree: ast.AST):
    """The nodes of ``tree`` outside any function: what importing the module runs."""
    for child in ast.iter_child_nodes(tree):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield child
            yield from top_level_nodes(child)


def parents(name: str) -> list[str]:
    """The packages an import of ``name`` runs first, below the root (``soar/__init__.py`` imports only the
    schema when it runs; its API functions import the rest when called, and the walk reads those)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def graph(deferred: bool = True) -> dict[str, set[str]]:
    """Each project module -> the project modules it imports (without ``deferred``: those importing it runs,
    not inside a function) and their packages (those that do not hold the importing module: they are already
    running)."""
    modules = project_modules()
    edges = {}
    for name, path in modules.items():
        found = imports_of(name, path, modules, deferred)
        found |= {p for t in found for p in parents(t) if p in modules and not (name + ".").startswith(p + ".")}
        edges[name] = found - {name}
    return edges


def deferred_imports(path: Path) -> list[str]:
    """``line: statement`` of each import of a ``soar`` module inside a function of ``path``."""
    found = []

    def visit(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in child.names] if isinstance(child, ast.Import) else [child.module or ""]
                if getattr(child, "level", 0) or any(n == "soar" or n.startswith("soar.") for n in names):
                    found.append(f"{child.lineno}: {ast.unparse(child)}")
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


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
    """No cycle among what importing each module runs. An import inside a function runs once both modules are
    loaded (a world module's model build imports its pretraining, which imports the world): it must point
    down or sideways in the layers (``test_no_module_imports_from_a_higher_layer``), and ``DEFERRED`` lists
    where one may be."""
    edges = graph(deferred=False)
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
    """The walk reads imports inside functions too (``soar``'s API imports its stages when called), the
    packages an import runs (``soar.prepare`` imports ``soar.filters.failk``, so ``soar/filters/__init__.py``
    runs) and the worlds ``soar.worlds`` imports."""
    edges = graph()
    assert {"soar.loop", "soar.rl", "soar.filters.failk", "soar.hydra_config", "soar.validation"} <= edges["soar"]
    assert "soar.filters" in edges["soar.prepare"]
    assert {"soar.worlds", "soar.worlds.base"} <= edges["soar.hydra_config"] and "soar.worlds.arith" in edges["soar.worlds"]
    assert "soar.worlds.arith_pretrain" in edges["soar.worlds.arith"]  # inside ArithWorld.pretrain


def test_roles_do_not_import_each_other():
    """``soar.teachers`` never imports ``soar.students`` and the other way round (issue 51: the teacher's
    update took its trainer from the students; it is ``soar.policy`` now)."""
    def role(name: str) -> str | None:
        return next((r for r in ROLES if name == r or name.startswith(r + ".")), None)

    crossing = [f"{m} imports {t}" for m, targets in graph().items() if role(m)
                for t in sorted(targets) if role(t) not in (None, role(m))]
    assert not crossing, "\n".join(crossing)


def test_no_deferred_project_imports():
    """The package imports its own modules at the top of each file, where the walk and a reader see the
    order, except where ``DEFERRED`` says why (the interfaces' stages, a world's model build)."""
    counts = {str(path.relative_to(ROOT)): len(deferred_imports(path)) for path in sorted((ROOT / "soar").rglob("*.py"))}
    assert {f: n for f, n in counts.items() if n} == DEFERRED


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
