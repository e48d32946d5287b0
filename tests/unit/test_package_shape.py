"""The shape of the package that keeps it readable (docs/design.md, "Where things live"):
modules cut by concept, not by size, each named in the design's map; a size past its
package's budget is a signal to look, answered by a ``# Long:`` reason; layers that import
only downwards; no import cycle, not even for types; no class built from a tower of bases;
the plans free of redis-py; and "The life of a task" walking a short way through files
that exist. Read from the source with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "duetime"
DESIGN = ROOT / "docs" / "design.md"

#: Lines a module of each package may reach before it must say why its one job takes more
#: (a ``# Long: <reason>`` line among its first lines); the longest matching name wins.
MODULE_BUDGETS = {"duetime": 400}
#: Lines each package may hold in all (its subpackages apart, where listed): growing past
#: one is a choice made in the change that does it, raising the figure, not a drift.
PACKAGE_BUDGETS = {
    "duetime": 4300,
    "duetime.cli": 3800,
    "duetime.client": 5500,
    "duetime.cron": 950,
    "duetime.dashboard": 3600,
    "duetime.dispatcher": 950,
    "duetime.metrics": 1250,
    "duetime.store": 50,
    "duetime.store.plans": 4000,
    "duetime.store.redis": 2500,
    "duetime.worker": 2150,
}
MOST_CLASS_LINES = 300
MOST_FUNCTION_LINES = 60
MOST_BASES = 3
#: A module, class or function may be longer than its rule when a comment says why: for
#: a class or function right above it (or its decorators), for a module near its top.
LONG_MARKER = "# Long:"
#: The files one plain task passes through in "The life of a task", at most.
MOST_FILES_ON_A_TASKS_WAY = 15

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
    "duetime.store.plans": ("duetime.store.redis", "redis"),
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


def _package(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _owner(budgets: dict[str, int], name: str) -> str:
    """The budget's entry that covers ``name``: the longest package name it is in."""
    return max((key for key in budgets if name == key or name.startswith(key + ".")), key=len)


def _explains_its_size(source: list[str]) -> bool:
    return any(line.startswith(LONG_MARKER) for line in source[:40])


def test_a_module_past_its_packages_budget_says_why() -> None:
    unexplained = {}
    for name, path in _modules():
        source = path.read_text().splitlines()
        budget = MODULE_BUDGETS[_owner(MODULE_BUDGETS, _package(name, path))]
        if len(source) > budget and not _explains_its_size(source):
            unexplained[_shown(path)] = f"{len(source)} lines, budget {budget}"
    assert unexplained == {}, f"cut by concept, or say why with a '{LONG_MARKER}' line near the top"


def test_no_package_outgrows_its_budget() -> None:
    totals = dict.fromkeys(PACKAGE_BUDGETS, 0)
    for name, path in _modules():
        owner = _owner(PACKAGE_BUDGETS, _package(name, path))
        totals[owner] += len(path.read_text().splitlines())
    over = {
        name: f"{total} > {PACKAGE_BUDGETS[name]}"
        for name, total in totals.items()
        if total > PACKAGE_BUDGETS[name]
    }
    assert over == {}, "raise the budget in the change that grows the package, and say why"


def _definitions(tree: ast.AST) -> Iterator[Definition]:
    for node in ast.walk(tree):
        if isinstance(node, Definition):
            yield node


def test_no_class_or_function_is_longer_than_the_rule_without_a_reason() -> None:
    long_ones = []
    for _, path in _modules():
        text = path.read_text()
        source = text.splitlines()
        for node in _definitions(ast.parse(text)):
            most = MOST_CLASS_LINES if isinstance(node, ast.ClassDef) else MOST_FUNCTION_LINES
            if _lines(node) > most and not _explained(source, node):
                long_ones.append(
                    f"{_shown(path)} {node.name} ({_lines(node)} lines, line {node.lineno})"
                )
    assert long_ones == []


def test_no_class_is_built_from_a_tower_of_bases() -> None:
    towers = [
        f"{_shown(path)} {node.name} ({len(node.bases)} bases)"
        for _, path in _modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and len(node.bases) > MOST_BASES
    ]
    assert towers == []


def _third_party_imports(tree: ast.Module) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.partition(".")[0])
    return found


def test_the_plans_import_no_redis_client() -> None:
    plans = PACKAGE / "store" / "plans"
    importing = [
        _shown(path)
        for path in sorted(plans.rglob("*.py"))
        if "redis" in _third_party_imports(ast.parse(path.read_text()))
    ]
    assert importing == []


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
    assert sorted(breaches) == []


def test_no_import_cycle_not_even_for_types() -> None:
    graph = _graph(for_types=True)
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


def _section(heading: str) -> list[str]:
    """The lines of docs/design.md under ``heading``, up to the next heading of its level
    or above."""
    lines = DESIGN.read_text().splitlines()
    level = heading.split(" ")[0]
    start = lines.index(heading) + 1
    end = next(
        (
            at
            for at in range(start, len(lines))
            if lines[at].startswith("#") and len(lines[at].split(" ")[0]) <= len(level)
        ),
        len(lines),
    )
    return lines[start:end]


def _named_in_the_map() -> set[str]:
    """The modules the "Where things live" table names, as paths under src/duetime. A row
    names a folder once: ``client/handles.py``, ``registry.py`` is client/registry.py. The
    row of what lies outside the package is not read."""
    named = set()
    for row in _section("## Where things live"):
        if not row.startswith("|") or "outside the package" in row:
            continue
        folder = ""
        for token in re.findall(r"`([\w/]+\.py)`", row):
            if "/" in token:
                folder, _, token = token.rpartition("/")
                folder += "/"
            named.add(folder + token)
    return named


def test_every_module_is_named_in_the_designs_map() -> None:
    modules = {path.relative_to(PACKAGE).as_posix() for _, path in _modules()}
    named = _named_in_the_map()
    assert sorted(modules - named) == [], "add these to docs/design.md, 'Where things live'"
    assert sorted(named - modules) == [], "the map names modules that are gone"


def test_the_life_of_a_task_walks_a_short_way_through_files_that_exist() -> None:
    """Each step of the walk is one line, ``N. `file.py`: what happens there``; the files
    the steps stand in are the task's way, and every file the walk names exists."""
    for heading in ("### One task, file by file", "### One flow-controlled task, file by file"):
        section = _section(heading)
        way = [match[1] for line in section if (match := re.match(r"\d+\. `([\w/]+\.py)`", line))]
        named = {name for line in section for name in re.findall(r"`([\w/]+\.py)`", line)}
        gone = [name for name in named if not any((at / name).is_file() for at in (PACKAGE, ROOT))]
        assert sorted(gone) == [], heading
        assert 5 <= len(set(way)) <= MOST_FILES_ON_A_TASKS_WAY, f"{heading!r}: {way}"
