"""The package's layer rules, read from every import statement of infir/ (inside functions too):

- `infir.fp8` and `infir.optim` stand alone: nothing of megatron, `infir.model` or `infir.train`;
- `infir.model` imports nothing of `infir.train` (data flows conf -> train -> model/data -> fp8/optim);
- no two modules import each other, directly or through others;
- no class is made at run time with `type(name, bases, dict)`;
- no private name (`_x`) is imported from another package;
- no function or method is longer than 60 lines (decorators aside, docstring included).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "infir"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module imported, names taken from it, line) for every import statement in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.append((base, [alias.name for alias in node.names], node.lineno))
    return out


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(target: str, names: list[str]) -> list[str]:
    """The infir modules an import reaches: `from pkg import mod` reaches pkg.mod where that is a module."""
    if not target.startswith("infir"):
        return []
    hits = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
    if target in MODULES and len(hits) < len(names):
        hits.append(target)
    return hits


def _edges() -> dict[str, set[str]]:
    graph = {m: set() for m in MODULES}
    for mod, path in MODULES.items():
        for target, names, _ in _imports(path):
            for dep in _resolve(target, names):
                if dep != mod and not mod.startswith(dep + ".") and not (path.name == "__init__.py" and dep.startswith(mod + ".")):
                    graph[mod].add(dep)
    return graph


FORBIDDEN = {
    "infir.fp8": ("megatron", "infir.model", "infir.train"),
    "infir.optim": ("megatron", "infir.model", "infir.train"),
    "infir.model": ("infir.train",),
}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_import_nothing_above_them(layer):
    bad = []
    for mod, path in MODULES.items():
        if mod == layer or mod.startswith(layer + "."):
            for target, _, line in _imports(path):
                if any(target == f or target.startswith(f + ".") for f in FORBIDDEN[layer]):
                    bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    graph = _edges()
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


def test_no_classes_made_with_type():
    bad = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type" and len(node.args) == 3:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "type(name, bases, dict) at " + ", ".join(bad)


def test_no_private_names_across_packages():
    bad = []
    for mod, path in MODULES.items():
        package = mod.rsplit(".", 1)[0] if path.name != "__init__.py" else mod
        for target, names, line in _imports(path):
            if target.startswith("infir") and not (target == package or target.startswith(package + ".")):
                bad += [f"{path.relative_to(ROOT)}:{line} takes {target}.{n}" for n in names
                        if n.startswith("_") and not n.startswith("__")]
    assert not bad, "\n".join(bad)


MAX_FUNCTION_LINES = 60


def test_no_library_function_over_60_lines():
    long = []
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {length}")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named helpers):\n" + "\n".join(long)

def test_the_rules_see_imports_inside_functions(tmp_path):
    """The reader itself: an import inside a function body counts like a module-level one."""
    src = tmp_path / "infir" / "fp8" / "probe.py"
    src.parent.mkdir(parents=True)
    src.write_text("def f():\n    from megatron.core import parallel_state\n    from ..train import loop\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert [t for t, _, _ in _imports(src)] == ["megatron.core", "infir.train"]
    finally:
        ROOT = saved
