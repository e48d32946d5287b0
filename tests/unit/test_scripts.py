"""Every Lua script touches only keys it is given in KEYS, and declares them in its
header: a key built inside Lua would break on Redis Cluster (CROSSSLOT, or a key on
another node) and on proxies that check declared keys. Checked by reading each script.
A function of an include (lua/include/) is given the keys it touches as parameters
named ``*_key`` (or as its ``...``, the probes): each caller must fill them from KEYS (or
pass on its own). Includes include others; each script and each include names the
includes whose functions it calls itself, so that its head says what it carries."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pytest

from duetime.store.plans import scripts
from duetime.store.plans.scripts import IncludeError, expanded, includes

LUA = Path(str(resources.files("duetime.store.plans").joinpath("lua")))
SCRIPTS = sorted(LUA.glob("*.lua"))
INCLUDES = sorted((LUA / "include").glob("*.lua"))
#: How many leading arguments of each command used by the scripts are key names.
KEY_ARGUMENTS = {
    "DEL": 1, "EXISTS": 1, "HDEL": 1, "HEXISTS": 1, "HGET": 1, "HINCRBY": 1, "HMGET": 1, "HSET": 1,
    "HSETNX": 1,
    "LINDEX": 1, "LLEN": 1, "LMOVE": 2, "LPOS": 1, "LPUSH": 1, "LRANGE": 1, "LREM": 1, "LSET": 1,
    "LTRIM": 1,
    "PEXPIRE": 1, "RPUSH": 1, "ZADD": 1, "ZCARD": 1, "ZMSCORE": 1, "ZRANGE": 1, "ZREM": 1,
    "ZSCORE": 1, "HKEYS": 1, "ZLEXCOUNT": 1, "ZREMRANGEBYSCORE": 1, "HRANDFIELD": 1,
    "PUBLISH": 0,  # a channel, not a key
}  # fmt: skip
CALL = re.compile(r"redis\.p?call\(")
KEY = re.compile(r"KEYS\[(.+)\]")
DECLARED = re.compile(r"^-- KEYS\[(\d+)(\.\.)?\]", re.MULTILINE)
INCLUDED = re.compile(r"^-- @include (\w+)$", re.MULTILINE)
#: A function of an include: from "local function" at the start of a line to the first
#: "end" alone on a line (its body is indented).
FUNCTION = re.compile(r"^local function (\w+)\(([^)]*)\)\n.*?^end$", re.MULTILINE | re.DOTALL)
#: What a variadic function of an include hands a command as the n-th key of its ``...``.
VARIADIC_KEY = "(select(n, ...))"


def arguments(source: str, start: int) -> list[str]:
    """The arguments of the call whose "(" ends at ``start``, split at top-level commas
    (brackets inside quoted strings do not count)."""
    depth, current, found, quote = 0, "", [], ""
    for char in source[start:]:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                found.append(current.strip())
                return found
            depth -= 1
        if char == "," and depth == 0 and not quote:
            found.append(current.strip())
            current = ""
        else:
            current += char
    raise AssertionError("unbalanced call")


def code(path: Path) -> str:
    """The script as the server gets it (its includes in place), without its comments
    (none of them holds "--" inside a string)."""
    return re.sub(r"--.*", "", expanded(path.read_text()))


@dataclass(frozen=True)
class Included:
    """A function of an include: its text (comments out), and its key parameters by
    name and position."""

    text: str
    keys: dict[str, int]
    #: The position of its ``...``, if it takes one: every argument from there is a key.
    more_keys: int | None

    def given(self) -> set[str]:
        """What its body may hand a command as a key."""
        return set(self.keys) | ({"...", VARIADIC_KEY} if self.more_keys is not None else set())


def included(path: Path) -> dict[str, Included]:
    """The functions of the includes the script at ``path`` carries (directly or through
    other includes), by name."""
    found = {}
    for name in includes(path.read_text()):
        source = re.sub(r"--.*", "", (LUA / "include" / f"{name}.lua").read_text())
        for match in FUNCTION.finditer(source):
            parameters = [parameter.strip() for parameter in match[2].split(",")]
            keys = {name: n for n, name in enumerate(parameters) if name.endswith("_key")}
            more = parameters.index("...") if "..." in parameters else None
            found[match[1]] = Included(match[0], keys, more)
    return found


def calls_of(name: str, source: str) -> list[list[str]]:
    """The arguments of each call of the function ``name`` in the source."""
    pattern = rf"(?<![\w.])(?<!function ){name}\("
    return [arguments(source, match.end()) for match in re.finditer(pattern, source)]


def key_indices(source: str) -> list[str]:
    """What each KEYS[...] in the source indexes with (brackets may nest)."""
    found = []
    for match in re.finditer(r"KEYS\[", source):
        found.append(arguments(source.replace("]", ")"), match.end())[0])
    return found


def calls(source: str) -> list[list[str]]:
    return [arguments(source, match.end()) for match in CALL.finditer(source)]


def test_every_script_is_checked() -> None:
    assert len(SCRIPTS) >= 18
    assert all(calls(code(path)) for path in SCRIPTS)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: path.stem)
def test_keys_come_only_from_KEYS_and_are_declared(path: Path) -> None:
    header, source = path.read_text(), code(path)
    declared = {int(n) for n, _ in DECLARED.findall(header)}
    open_ended = [int(n) for n, more in DECLARED.findall(header) if more]
    assert declared, f"{path.name} declares no KEYS in its header"
    functions = included(path)
    # The script's own code (and whatever of its includes is not in a function) may touch
    # only KEYS; the body of an included function also the keys given as its parameters.
    own = source
    for function in functions.values():
        own = own.replace(function.text, "")
    parts: list[tuple[str, str, set[str]]] = [(path.name, own, set())]
    for name, function in functions.items():
        parts.append((f"{path.name}: {name}()", function.text, function.given()))
    for where, part, given in parts:
        for call in calls(part):
            command = call[0].strip("'\"").upper()
            assert command in KEY_ARGUMENTS, f"{where}: {command} is not a known command"
            for argument in call[1 : 1 + KEY_ARGUMENTS[command]]:
                assert KEY.fullmatch(argument) or argument in given, (
                    f"{where}: {command} is given the key {argument!r}, not one of KEYS"
                )
        for name, function in functions.items():
            for call in calls_of(name, part):
                for parameter, n in function.keys.items():
                    assert KEY.fullmatch(call[n]) or call[n] in given, (
                        f"{where}: {name}() is given the {parameter} {call[n]!r}, not one of KEYS"
                    )
                more = call[function.more_keys :] if function.more_keys is not None else []
                for argument in more:
                    assert KEY.fullmatch(argument) or argument in given, (
                        f"{where}: {name}() is given the key {argument!r}, not one of KEYS"
                    )
        for parameter in given - {"...", VARIADIC_KEY}:  # nor a name glued from a key given
            assert not re.search(rf"\b{parameter}\s*\.\.|\.\.\s*{parameter}\b", part), where
    for index in key_indices(source):
        if index.isdigit():
            number = int(index)
            assert number in declared or any(number >= first for first in open_ended), (
                f"{path.name} uses KEYS[{number}] without declaring it"
            )
        else:  # a computed index must fall in an open-ended range of the header
            assert open_ended, f"{path.name} indexes KEYS[{index}] with no KEYS[n..] declared"
    # Names are never glued together in Lua (".." next to KEYS, or a "duetime:" literal).
    assert not re.search(r"KEYS\[[^\]]+\]\s*\.\.|\.\.\s*KEYS\[", source), path.name
    assert "duetime:" not in source, path.name


def _code_only(source: str) -> str:
    """Lua source without its comments and string literals (none holds an escaped quote
    or "--")."""
    return re.sub(r"'[^'\n]*'|\"[^\"\n]*\"", "''", re.sub(r"--.*", "", source))


def _exported(source: str) -> set[str]:
    """The names an include defines for those who include it: its top-level locals."""
    found = set(re.findall(r"^local function (\w+)", source, re.MULTILINE))
    for names in re.findall(r"^local ([\w, ]+?) =", source, re.MULTILINE):
        found |= {name.strip() for name in names.split(",")}
    return found


def _declared(source: str) -> set[str]:
    """Every name the source declares itself: locals at any depth, parameters, loop
    variables."""
    found = set(re.findall(r"\blocal function (\w+)", source))
    for names in re.findall(r"\blocal ([\w, ]+?)(?:=|$)", source, re.MULTILINE):
        found |= {name.strip() for name in names.split(",")}
    for names in re.findall(r"\bfunction\s*\w*\(([^)]*)\)", source):
        found |= {name.strip() for name in names.split(",")}
    for names in re.findall(r"\bfor ([\w, ]+?) (?:=|in)\b", source):
        found |= {name.strip() for name in names.split(",")}
    return found


def _owners() -> dict[str, str]:
    owners: dict[str, str] = {}
    for path in INCLUDES:
        for name in _exported(_code_only(path.read_text())):
            assert name not in owners, f"{name} is defined by {owners[name]} and {path.stem}"
            owners[name] = path.stem
    return owners


def test_no_two_includes_define_one_name() -> None:
    """So that the order includes are put in never decides which definition a name reads."""
    assert _owners()


@pytest.mark.parametrize("path", SCRIPTS + INCLUDES, ids=lambda path: path.stem)
def test_each_file_names_the_includes_it_calls(path: Path) -> None:
    """A script's head (an include's too) names every include whose functions or values
    its own code uses: what it carries is read there, and each include is in place
    before the code that uses it (a name used before it is defined reads a global)."""
    source = path.read_text()
    code = _code_only(source)
    named = set(INCLUDED.findall(source))
    owners = _owners()
    own = _declared(code)
    used = set(re.findall(r"(?<![.\w])[A-Za-z_]\w*", code)) - own
    missing = sorted(
        f"{name} ({owners[name]})"
        for name in used
        if owners.get(name, path.stem) not in named | {path.stem}
    )
    assert not missing, f"{path.name} uses, without naming its include: {', '.join(missing)}"
    idle = sorted(named - {owners[name] for name in used if name in owners})
    assert not idle, f"{path.name} names includes it does not use itself: {', '.join(idle)}"


def test_every_include_is_used() -> None:
    carried = {name for path in SCRIPTS for name in includes(path.read_text())}
    assert carried == {path.stem for path in INCLUDES}


def test_includes_expand_recursively_once_each() -> None:
    source = "-- @include flow_release\n-- @include flow\nlocal x = 1\n"
    text = expanded(source)
    carried = includes(source)
    assert carried[0] == "flow_release" and len(carried) == len(set(carried))
    assert {"flow", "flow_pick", "chunks", "probes"} <= set(carried)
    assert text.count("local function flow_on(") == 1
    assert text.count("local function probe_hashes(") == 1
    assert "-- @include" not in text
    # Each include's own includes come before it: flow (in flow_release) before flow_pick.
    assert text.index("local function flow_on(") < text.index("local function pick_many(")


def test_an_unknown_include_is_refused_naming_it() -> None:
    with pytest.raises(IncludeError, match="no_such_part"):
        expanded("-- @include chunks\n-- @include no_such_part\n", "broken")


def test_an_include_cycle_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = {"a": "-- @include b\nlocal A = 1\n", "b": "-- @include a\nlocal B = 1\n"}
    real = scripts._read

    def read(*path: str) -> str:
        if path[0] == "include" and path[1].removesuffix(".lua") in parts:
            return parts[path[1].removesuffix(".lua")]
        return real(*path)

    monkeypatch.setattr(scripts, "_read", read)
    with pytest.raises(IncludeError, match="cycle a -> b -> a"):
        expanded("-- @include a\n", "looping")
