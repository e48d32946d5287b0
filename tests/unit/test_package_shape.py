"""The shape of the package that keeps it readable: small modules, classes and functions,
layers that import only downwards, and no import cycles (docs/design.md, "Where things
live"). Read from the source with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "duetime"

MOST_MODULE_LINES = 400
MOST_CLASS_LINES = 300
MOST_FUNCTION_LINES = 60
#: A function may be longer when a comment right above it (or its decorators) says why.
LONG_MARKER = "# Long:"

#: What a layer may not import: the Redis layer knows nothing of those who call it, and
#: metrics read queues, not the dispatcher's internals.
FORBIDDEN = {
    "duetime.store": (
        "duetime.client",
        "duetime.worker",
        "duetime.dispatcher",
        "duetime.cli",
        "duetime.metrics",
        "duetime.dashboard",
    ),
    "duetime.metrics": ("duetime.dispatcher", "duetime.cli", "duetime.dashboard"),
    "duetime.worker": ("duetime.client", "duetime.dispatcher", "duetime.cli", "duetime.dashboard"),
    "duetime.dispatcher": ("duetime.client", "duetime.worker", "duetime.cli", "duetime.dashboard"),
    "duetime.client": (
        "duetime.worker",
        "duetime.dispatcher",
        "duetime.cli",
        "duetime.metrics",
        "duetime.dashboard",
    ),
}

#: Modules still larger than the rule, each with its size today: the list only shrinks.
OVERSIZED_MODULES: dict[str, int] = {"duetime/store/redis/runner.py": 802}
#: Breaches still to mend (the package split removes them): the list only shrinks.
KNOWN_BREACHES: set[str] = set()


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def _shown(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


Definition = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def _start(node: Definition) -> int:
    return min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])


def _lines(node: Definition) -> int:
    return (node.end_lineno or node.lineno) - _start(node) + 1


def _explained(source: list[str], node: Definition) -> bool:
    above = _start(node) - 2
    while above >= 0 and source[above].strip().startswith("#"):
        if source[above].strip().startswith(LONG_MARKER):
            return True
        above -= 1
    return False


def test_no_module_is_larger_than_the_rule_unless_listed() -> None:
    too_large = {}
    for _, path in _modules():
        count = len(path.read_text().splitlines())
        if count > MOST_MODULE_LINES and count > OVERSIZED_MODULES.get(_shown(path), 0):
            too_large[_shown(path)] = count
    assert too_large == {}


def test_the_list_of_oversized_modules_holds_only_modules_still_too_large() -> None:
    sizes = {_shown(path): len(path.read_text().splitlines()) for _, path in _modules()}
    stale = {
        name: sizes.get(name)
        for name in OVERSIZED_MODULES
        if sizes.get(name, 0) <= MOST_MODULE_LINES
    }
    assert stale == {}, "remove these from OVERSIZED_MODULES"


def _definitions(tree: ast.AST) -> Iterator[Definition]:
    for node in ast.walk(tree):
        if isinstance(node, Definition):
            yield node


def test_no_class_or_function_is_longer_than_the_rule_without_a_reason() -> None:
    long_ones = []
    for _, path in _modules():
        if _shown(path) in OVERSIZED_MODULES:
            continue
        text = path.read_text()
        source = text.splitlines()
        for node in _definitions(ast.parse(text)):
            most = MOST_CLASS_LINES if isinstance(node, ast.ClassDef) else MOST_FUNCTION_LINES
            where = f"{_shown(path)} {node.name}"
            explained = _explained(source, node) or where in KNOWN_BREACHES
            if _lines(node) > most and not explained:
                long_ones.append(f"{where} ({_lines(node)} lines, line {node.lineno})")
    assert long_ones == []


def _in_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module, known: set[str], own: str, for_types: bool) -> set[str]:
    """The duetime modules a module imports when it runs, and with ``for_types`` also
    those it imports only for type checking."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        child: ast.AST
        if isinstance(node, ast.If) and _in_type_checking(node) and not for_types:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                found.add(target if target in known else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {name for name in found if name in known and name != own}


def _graph(for_types: bool) -> dict[str, set[str]]:
    modules = dict(_modules())
    known = set(modules)
    return {
        name: _imports(ast.parse(path.read_text()), known, name, for_types)
        for name, path in modules.items()
    }


def test_no_layer_imports_one_above_it() -> None:
    breaches = []
    for name, imported in _graph(for_types=True).items():
        for layer, above in FORBIDDEN.items():
            if name == layer or name.startswith(layer + "."):
                breaches += [
                    f"{name} imports {target}"
                    for target in sorted(imported)
                    if any(target == a or target.startswith(a + ".") for a in above)
                ]
    assert sorted(set(breaches) - KNOWN_BREACHES) == []


def test_no_import_cycle() -> None:
    graph = _graph(for_types=False)
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def walk(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target in sorted(graph[name]):
            # A package's own submodules import through it; that is not a cycle.
            if name.startswith(target + "."):
                continue
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                walk(target)
        path.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name)
    assert cycles == []
