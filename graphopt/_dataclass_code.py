"""The code of dataclasses' generated methods, compiled once and kept on disk.

`@dataclass` writes the source of each class's `__init__`, `__repr__`, `__eq__` (and, frozen,
`__hash__`, `__setattr__`, `__delattr__`) and compiles it as the class is defined: on Python
3.11 some 0.5 ms a class, most of it in `compile`. The `graphopt` command line defines ~65
dataclasses as it starts (graphopt's pattern IR, report, op specs and rules; typer's; onnx-ir's):
~0.03 s of a small model's ~0.28 s (benchmarks/RESULTS.md, 2026-11-28, session 8).

`install()` (graphopt.cli, as it is imported) gives the dataclasses module a stand-in for
`exec` that reads the compiled code from a table keyed by the exact source text, compiling
(as `exec` would: no inherited `__future__` flags) only what is not in it. The same source
always compiles to the same code, so the classes are the same, whatever the table holds.
Only the modules of `MODULES` (the command line's own and its libraries') use the table, so
it stays small whatever else a process defines (torch's dataclasses, a test suite's).

The `graphopt` program saves the table (`save()`, from graphopt.cli.run) when the run
compiled something new, beside the pattern cache ($XDG_CACHE_HOME or ~/.cache, graphopt/),
one file per interpreter build; a file that cannot be read as this interpreter's table is
ignored. GRAPHOPT_NO_CACHE=1 turns this off, as it does the pattern cache. Like the pattern
cache's pickles, the file is code the user's own cache folder holds (written with mode 0600).
"""

import builtins
import marshal
import os
import sys
import tempfile
from pathlib import Path
from types import CodeType
from typing import Any

__all__ = ["install", "save", "cache_path", "MODULES"]

#: Modules (and packages: a name is followed by "." or "_") whose dataclasses use the table.
MODULES = ("graphopt", "typer", "onnx_ir")
#: A table with more entries than this is started afresh (only what the run used is kept): the
#: command line's own are ~450; --patterns files (graphopt_patterns_*) may add their own.
_MAX_ENTRIES = 2000
#: What a table file belongs to: this interpreter's build (code objects are its own format).
_STAMP = f"graphopt dataclass code 2 {sys.version} {sys.hexversion}"

#: Source text -> its code, marshalled: only the entries a process uses are unmarshalled, so
#: the classes of other commands in the table (explain's, the report's) cost next to nothing.
_table: dict[str, bytes] | None = None  # read on first use
_used: dict[str, bytes] = {}  # what this process looked up or compiled
_compiled = 0  # sources compiled by this process (not found in the table)


def cache_path() -> Path | None:
    """The table's file, or None when caches are off (GRAPHOPT_NO_CACHE=1)."""
    if os.environ.get("GRAPHOPT_NO_CACHE") == "1":
        return None
    try:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "graphopt"
    except (RuntimeError, KeyError):  # no home folder to be found: no table
        return None
    return root / f"dataclass-code-{sys.implementation.cache_tag}-{sys.hexversion:x}.marshal"


def _read_table() -> dict[str, bytes]:
    path = cache_path()
    if path is None:
        return {}
    try:
        stamp, table = marshal.loads(path.read_bytes())
    except (OSError, ValueError, EOFError, TypeError):  # none yet, unreadable, or not a table
        return {}
    if stamp != _STAMP or type(table) is not dict:
        return {}
    return table


def _ours(globals_: Any) -> bool:
    name = globals_.get("__name__") if type(globals_) is dict else None
    return type(name) is str and any(name == m or name.startswith((m + ".", m + "_")) for m in MODULES)


def _code_of(stored: bytes | None) -> CodeType | None:
    try:
        code = marshal.loads(stored) if type(stored) is bytes else None
    except (ValueError, EOFError, TypeError):  # not marshal data: compiled anew
        return None
    return code if type(code) is CodeType else None


def _exec(source: Any, globals_: Any = None, locals_: Any = None, /) -> None:
    """`exec` for the dataclasses module: a source text of one of `MODULES` runs as its compiled code."""
    global _table, _compiled
    if type(source) is str and _ours(globals_):
        if _table is None:
            _table = _read_table()
        code = _code_of(_table.get(source))
        if code is None:
            # As exec compiles a string there: with the dataclasses module's own flags (none).
            code = compile(source, "<string>", "exec", dont_inherit=True)
            _table[source] = marshal.dumps(code)
            _compiled += 1
        _used[source] = _table[source]
        source = code
    elif type(source) is str:  # compiled here as in the dataclasses module (whatever this module's __future__ flags)
        source = compile(source, "<string>", "exec", dont_inherit=True)
    builtins.exec(source, globals_, locals_)


def install() -> None:
    """Let `@dataclass` read its compiled methods from the table (unless caches are off)."""
    import dataclasses

    if cache_path() is not None:
        dataclasses.exec = _exec  # type: ignore[attr-defined]  # its module global, before the builtin


def compiled() -> int:
    """How many sources this process compiled (not found in the table)."""
    return _compiled


def save() -> None:
    """Write the table if this process compiled something new (quietly not, where it cannot)."""
    path = cache_path()
    if not _compiled or _table is None or path is None:
        return
    table = _table if len(_table) <= _MAX_ENTRIES else _used
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    except OSError:
        return  # a read-only home is no reason to fail: compile next time
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(marshal.dumps((_STAMP, table)))
        os.replace(temp, path)  # whole or not at all: a reader never sees half a file
    except (OSError, ValueError):
        Path(temp).unlink(missing_ok=True)
