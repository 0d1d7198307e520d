"""graphopt._dataclass_code: dataclasses' generated methods read from a table of compiled code
give the classes `@dataclass` gives; the table is kept on disk by the `graphopt` program only."""

from __future__ import annotations

import dataclasses
import marshal
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from graphopt import _dataclass_code

REPO = Path(__file__).resolve().parent.parent

# A module of graphopt's (the table serves it) whose classes the tests define, with
# `from __future__ import annotations` as graphopt's own modules have.
CLASSES = '''
from __future__ import annotations
import dataclasses
from dataclasses import dataclass, field

@dataclass(frozen=True)
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()

@dataclass
class Box:
    """A box."""
    items: list[int] = field(default_factory=list)
    name: str = "box"
    hidden: int = field(default=3, repr=False, compare=False)

@dataclass(order=True, slots=True)
class Ordered:
    key: int
    value: float = 1.5

@dataclass(eq=False)
class Plain:
    value: object = None
'''

METHODS = ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__", "__lt__", "__ge__")


def _define(name: str, hooked: bool, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses reads the module's globals from sys.modules
    try:
        if hooked:
            monkeypatch.setattr(dataclasses, "exec", _dataclass_code._exec, raising=False)
        else:
            monkeypatch.delattr(dataclasses, "exec", raising=False)
        exec(compile(CLASSES, f"<{name}>", "exec"), module.__dict__)
    finally:
        del sys.modules[name]
        monkeypatch.delattr(dataclasses, "exec", raising=False)
    return module


def _code(function: Any) -> Any:
    function = getattr(function, "__wrapped__", function)  # __repr__ is wrapped by reprlib's guard
    return getattr(function, "__code__", None)


@pytest.fixture
def fresh_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("GRAPHOPT_NO_CACHE", raising=False)
    monkeypatch.setattr(_dataclass_code, "_table", None)
    monkeypatch.setattr(_dataclass_code, "_used", {})
    monkeypatch.setattr(_dataclass_code, "_compiled", 0)
    return tmp_path


def test_classes_are_the_same_with_the_table(fresh_table: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _define("graphopt_test_plain", hooked=False, monkeypatch=monkeypatch)
    compiled = _define("graphopt_test_hooked", hooked=True, monkeypatch=monkeypatch)
    before = _dataclass_code.compiled()
    assert before > 10  # the hook ran: it compiled each method once
    cached = _define("graphopt_test_cached", hooked=True, monkeypatch=monkeypatch)
    assert _dataclass_code.compiled() == before  # the second module's sources were all in the table
    for name in ("Point", "Box", "Ordered", "Plain"):
        classes = [getattr(module, name) for module in (plain, compiled, cached)]
        for method in METHODS:
            codes = [_code(cls.__dict__.get(method)) for cls in classes]
            assert codes[0] == codes[1] == codes[2], (name, method)
            functions = [getattr(cls.__dict__.get(method), "__wrapped__", cls.__dict__.get(method)) for cls in classes]
            # The annotations are objects, not strings: the module's __future__ flag is not inherited.
            annotations = [getattr(f, "__annotations__", None) for f in functions]
            assert annotations[0] == annotations[1] == annotations[2], (name, method)
        assert [str(dataclasses.fields(c)) for c in classes[1:]] == [str(dataclasses.fields(classes[0]))] * 2
    point = cached.Point(1, tags=("a",))
    assert repr(point) == "Point(x=1, y=0, tags=('a',))" and point == cached.Point(1, 0, ("a",)) and hash(point) == hash((1, 0, ("a",)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 2  # type: ignore[misc]
    box = cached.Box()
    assert repr(box) == "Box(items=[], name='box')" and box == cached.Box(hidden=9) and box.items is not cached.Box().items
    assert cached.Ordered(1) < cached.Ordered(2) and not hasattr(cached.Ordered(1), "__dict__")
    assert cached.Plain(1) != cached.Plain(1)


def test_the_table_round_trips_through_its_file(fresh_table: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _define("graphopt_test_first", hooked=True, monkeypatch=monkeypatch)
    made = _dataclass_code.compiled()
    _dataclass_code.save()
    path = _dataclass_code.cache_path()
    assert path is not None and path.is_file() and path.parent == fresh_table / "graphopt"
    monkeypatch.setattr(_dataclass_code, "_table", None)  # as a new process: the table comes from the file
    monkeypatch.setattr(_dataclass_code, "_compiled", 0)
    _define("graphopt_test_second", hooked=True, monkeypatch=monkeypatch)
    assert made > 0 and _dataclass_code.compiled() == 0
    written = path.stat().st_mtime_ns
    path.write_bytes(path.read_bytes())  # (a new mtime, same table)
    rewritten = path.stat().st_mtime_ns
    _dataclass_code.save()  # nothing new: the file is left as it is
    assert path.stat().st_mtime_ns == rewritten >= written


@pytest.mark.parametrize("content", [b"", b"not marshal", marshal.dumps(("another interpreter", {})), marshal.dumps([1, 2])])
def test_a_file_that_is_not_this_interpreters_table_is_ignored(fresh_table: Path, monkeypatch: pytest.MonkeyPatch, content: bytes) -> None:
    path = _dataclass_code.cache_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    module = _define("graphopt_test_bad_file", hooked=True, monkeypatch=monkeypatch)
    assert _dataclass_code.compiled() > 0 and repr(module.Point(2)) == "Point(x=2, y=0, tags=())"
    _dataclass_code.save()  # replaced by a good table
    stamp, table = marshal.loads(path.read_bytes())
    assert stamp == _dataclass_code._STAMP and len(table) == _dataclass_code.compiled()


def test_other_modules_do_not_use_the_table(fresh_table: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _define("somebody_elses", hooked=True, monkeypatch=monkeypatch)
    assert _dataclass_code.compiled() == 0 and _dataclass_code._table is None  # not even read
    assert repr(module.Point(1)) == "Point(x=1, y=0, tags=())"
    plain = _define("somebody_plain", hooked=False, monkeypatch=monkeypatch)
    for method in METHODS:  # compiled as the dataclasses module compiles them
        assert _code(module.Box.__dict__.get(method)) == _code(plain.Box.__dict__.get(method)), method
        init = module.Box.__dict__["__init__"]
        assert init.__annotations__ == plain.Box.__dict__["__init__"].__annotations__
    assert _dataclass_code._ours({"__name__": "graphopt_patterns_0123_attention"})
    assert _dataclass_code._ours({"__name__": "typer._coercion"}) and _dataclass_code._ours({"__name__": "onnx_ir"})
    assert not _dataclass_code._ours({"__name__": "typerx"}) and not _dataclass_code._ours({"__name__": "torch.fx"})
    assert not _dataclass_code._ours(None) and not _dataclass_code._ours({})


def test_no_cache_turns_it_off(fresh_table: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHOPT_NO_CACHE", "1")
    monkeypatch.delattr(dataclasses, "exec", raising=False)
    _dataclass_code.install()
    assert "exec" not in vars(dataclasses)
    _dataclass_code.save()
    assert not (fresh_table / "graphopt").exists()


def test_a_read_only_cache_folder_is_no_error(fresh_table: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (fresh_table / "graphopt").write_text("a file where the folder would be")
    module = _define("graphopt_test_read_only", hooked=True, monkeypatch=monkeypatch)
    _dataclass_code.save()
    assert module.Point(1).x == 1


def test_the_program_saves_the_table_and_its_next_run_compiles_nothing(tmp_path: Path) -> None:
    # `python -m graphopt` (graphopt.cli.run): the first run writes the table, the second finds
    # every dataclass of its start-up in it.
    env = dict(os.environ, PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("GRAPHOPT_NO_CACHE", None)
    probe = (
        "import atexit, sys\n"
        "from graphopt import _dataclass_code\n"
        "atexit.register(lambda: print('COMPILED', _dataclass_code.compiled(), flush=True))\n"
        "from graphopt.cli import run\n"
        "sys.argv = ['graphopt', 'version']\n"
        "run()\n"
    )
    first = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    second = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.startswith("graphopt ") and first.stdout.splitlines()[0] == second.stdout.splitlines()[0]
    assert int(first.stdout.split("COMPILED")[1]) > 5, first.stdout  # typer's and graphopt's dataclasses
    assert int(second.stdout.split("COMPILED")[1]) == 0, second.stdout
    assert len(list((tmp_path / "cache" / "graphopt").glob("dataclass-code-*.marshal"))) == 1


def test_an_entry_that_is_not_code_is_compiled_anew(fresh_table: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _define("graphopt_test_to_spoil", hooked=True, monkeypatch=monkeypatch)
    _dataclass_code.save()
    path = _dataclass_code.cache_path()
    assert path is not None
    stamp, table = marshal.loads(path.read_bytes())
    spoiled = {source: (b"\x00garbage" if i % 2 else marshal.dumps(42)) for i, source in enumerate(table)}
    path.write_bytes(marshal.dumps((stamp, spoiled)))
    monkeypatch.setattr(_dataclass_code, "_table", None)
    monkeypatch.setattr(_dataclass_code, "_compiled", 0)
    module = _define("graphopt_test_spoiled", hooked=True, monkeypatch=monkeypatch)
    assert _dataclass_code.compiled() == len(table)
    assert repr(module.Point(3)) == "Point(x=3, y=0, tags=())" and module.Box() == module.Box()


def test_a_table_grown_too_big_is_started_afresh(fresh_table: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_dataclass_code, "_MAX_ENTRIES", 5)
    path = _dataclass_code.cache_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    stale = {f"def old_{i}(): pass": marshal.dumps(compile(f"def old_{i}(): pass", "<string>", "exec")) for i in range(10)}
    path.write_bytes(marshal.dumps((_dataclass_code._STAMP, stale)))
    _define("graphopt_test_grown", hooked=True, monkeypatch=monkeypatch)
    _dataclass_code.save()
    _, table = marshal.loads(path.read_bytes())
    assert not set(table) & set(stale) and len(table) == _dataclass_code.compiled()  # only what this run used


def test_no_home_folder_means_no_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("GRAPHOPT_NO_CACHE", raising=False)

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert _dataclass_code.cache_path() is None
    monkeypatch.delattr(dataclasses, "exec", raising=False)
    _dataclass_code.install()  # graphopt.cli still imports: without a table
    assert "exec" not in vars(dataclasses)
