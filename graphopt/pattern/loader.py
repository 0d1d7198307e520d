"""Load rules from a patterns directory, a `.pdll` file or a `.py` file.

A directory is loaded in two steps: first every `*.py` file in it (sorted by
name), imported by path so that its `@native_constraint` / `@native_rewrite`
helpers register and its `@rule` functions become rules; then every `*.pdll`
file, sorted by name. `__init__.py`, `conftest.py` and test files are skipped.

Every native a rule needs, declared or only called, must have a registered
implementation once the Python files are imported; an unresolved one, and a
rule name used twice, is a `PatternError` at load time, not a failure at match time.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import inspect
import os
import re
import sys
import traceback
import types
from pathlib import Path

import onnx

from graphopt._digest import sha1
from graphopt.errors import PatternError
from graphopt.pattern.ir import NativeDecl, OpMatch, Rule, iter_match_nodes
from graphopt.pattern.native import NativeFn, declared_fields, lookup
from graphopt.pattern.pdll import parse_pdll_file

__all__ = ["load_patterns"]

_SKIPPED_PY = re.compile(r"^(__init__|conftest|test_.*|.*_test)\.py$")


def load_patterns(path_or_dir: str | os.PathLike[str]) -> list[Rule]:
    """All rules of a patterns directory, or of one .pdll or .py file, checked and ready to match."""
    path = Path(path_or_dir)
    if path.is_dir():
        py_files = sorted(p for p in path.glob("*.py") if p.is_file() and not _SKIPPED_PY.match(p.name))
        pdll_files = sorted(p for p in path.glob("*.pdll") if p.is_file())
    elif path.is_file() and path.suffix == ".pdll":
        py_files, pdll_files = [], [path]
    elif path.is_file() and path.suffix == ".py":
        py_files, pdll_files = [path], []
    elif not path.exists():
        raise PatternError(f"{path}: no such file or directory")
    else:
        raise PatternError(f"{path}: expected a directory, a .pdll file or a .py file")

    rules: list[Rule] = []
    declared: list[NativeDecl] = []
    for py in py_files:  # first: their natives must be registered before anything is resolved
        rules += _rules_of_module(py)
    for pdll in pdll_files:
        pf = parse_pdll_file(pdll)
        declared += pf.natives
        rules += pf.rules

    rules = list({id(r): r for r in rules}.values())  # a rule imported into a second module is still one rule
    for decl in declared:
        _resolve(decl)
    for r in rules:
        for decl in r.natives:
            _resolve(decl)
    _check_unique_names(rules)
    _check_known_ops(rules)
    return rules


def _module_name(path: Path) -> str:
    # Unique per file, stable across loads, never shadowing an importable module.
    digest = sha1(str(path.resolve()).encode()).hexdigest()[:12]
    stem = re.sub(r"\W", "_", path.stem)
    return f"graphopt_patterns_{digest}_{stem}"


def _rules_of_module(path: Path) -> list[Rule]:
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PatternError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling inside the module look it up here
    try:
        spec.loader.exec_module(module)
    except PatternError:
        sys.modules.pop(name, None)
        raise
    except (Exception, SystemExit) as e:  # user code may call sys.exit: that must not end graphopt quietly
        sys.modules.pop(name, None)
        raise _import_error(path, e) from e
    found: list[Rule] = []
    for value in vars(module).values():
        if isinstance(value, Rule) and not any(value is r for r in found):
            found.append(value)
    return found


def _import_error(path: Path, e: BaseException) -> PatternError:
    """file:line:col of where importing `path` failed, and why."""
    if isinstance(e, SyntaxError) and e.lineno is not None:
        return PatternError(f"{e.filename or path}:{e.lineno}:{e.offset or 1}: {type(e).__name__}: {e.msg}")
    line = 1
    target = str(path.resolve())
    for frame in traceback.extract_tb(e.__traceback__):
        if frame.filename and os.path.abspath(frame.filename) == target and frame.lineno:
            line = frame.lineno  # the deepest frame in the pattern file itself
    if isinstance(e, SystemExit):
        return PatternError(f"{path}:{line}:1: importing failed: it called sys.exit({e.code!r})")
    return PatternError(f"{path}:{line}:1: importing failed: {type(e).__name__}: {e}")


def _resolve(decl: NativeDecl) -> None:
    native = lookup(decl.kind, decl.name)
    if native is not None:
        if native.params is not None or native.results is not None:
            _check_declaration(decl, native)
        else:
            _check_arity(decl, native.fn, native.source)
        return
    other = "Rewrite" if decl.kind == "Constraint" else "Constraint"
    hint = f" (a {other} of that name is registered)" if lookup(other, decl.name) else ""
    register = "native_constraint" if decl.kind == "Constraint" else "native_rewrite"
    where = str(decl.loc) if decl.loc else "<unknown>:1:1"
    raise PatternError(
        f"{where}: {decl.kind} '{decl.name}' has no Python implementation{hint}; "
        f'register one with @{register}("{decl.name}") in a .py file beside the patterns'
    )


def _check_declaration(decl: NativeDecl, native: NativeFn) -> None:
    """The .pdll declaration names the same parameters and results, of the same kinds,
    as the Python one (a kind left out in the .pdll file is taken from Python)."""
    where = str(decl.loc) if decl.loc else "<unknown>:1:1"
    if not decl.params and not decl.results:
        return  # called without a declaration in this file: the Python one is the declaration
    for what, names, kinds, cls in (
        ("parameters", decl.params, [decl.param_kind(i) for i in range(len(decl.params))], native.params),
        ("results", decl.results, [decl.result_kind(r) for r in decl.results], native.results),
    ):
        if cls is None:
            continue
        python = declared_fields(cls)
        if tuple(names) != tuple(n for n, _ in python):
            raise PatternError(
                f"{where}: {decl.kind} '{decl.name}' is declared with {what} ({', '.join(names)}), but its Python declaration "
                f"{cls.__name__} at {native.source} has ({', '.join(n for n, _ in python)})"
            )
        for name, kind, (_, py_kind) in zip(names, kinds, python):
            if "any" not in (kind, py_kind) and kind != py_kind:
                raise PatternError(f"{where}: {decl.kind} '{decl.name}': '{name}' is declared as a {kind}, but {cls.__name__}.{name} is a {py_kind}")


def _check_arity(decl: NativeDecl, fn: object, source: str) -> None:
    """A declared helper's Python function must take `ctx` and one argument per declared
    parameter: a mismatch is an error at the declaration, not a TypeError mid-optimization."""
    if not decl.params:
        return  # no parameters declared (or synthesized from a call without a declaration): nothing to hold it to
    try:
        if not takes_positional(fn, 1 + len(decl.params)):
            raise TypeError
    except TypeError:
        where = str(decl.loc) if decl.loc else "<unknown>:1:1"
        raise PatternError(
            f"{where}: {decl.kind} '{decl.name}' is declared with {len(decl.params)} parameter(s) ({', '.join(decl.params)}), "
            f"but its Python implementation at {source} cannot take them (after ctx)"
        ) from None
    except ValueError:
        return  # a builtin without a signature: nothing to check


def takes_positional(fn: object, count: int) -> bool:
    """Whether fn(*count positional arguments) binds, as `inspect.signature(fn).bind(*args)` says.

    Read from the code object for a plain function (the ~200 built-in helpers: inspect
    took ~5 ms of every start-up); anything else (wrappers, partials, methods, classes,
    builtins) is inspect's: a TypeError where it does not bind, ValueError without a signature."""
    if type(fn) is not types.FunctionType or any(hasattr(fn, a) for a in ("__wrapped__", "__signature__", "_partialmethod")):
        inspect.signature(fn).bind(*range(count))  # type: ignore[arg-type]
        return True
    code = fn.__code__
    positional = code.co_argcount
    required = positional - len(fn.__defaults__ or ())
    keyword_only = code.co_varnames[positional : positional + code.co_kwonlyargcount]
    keyword_defaults = fn.__kwdefaults__ or {}
    return (
        required <= count
        and (count <= positional or bool(code.co_flags & inspect.CO_VARARGS))
        and all(name in keyword_defaults for name in keyword_only)
    )


def _check_known_ops(rules: list[Rule]) -> None:
    """A default-domain op the ONNX spec does not define (at any opset) can never match:
    a misspelling, refused at load time instead of a rule that silently does nothing."""
    for r in rules:
        for node in iter_match_nodes(r.root):
            # onnx.defs.has looks one name up (at any opset); listing every schema takes 20 ms.
            if isinstance(node, OpMatch) and node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type):
                close = difflib.get_close_matches(node.op_type, _onnx_op_names(), n=3)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                raise PatternError(
                    f"{r.loc or '<unknown>:1:1'}: rule '{r.name}' matches op<{node.op_type}>, which the ONNX default domain "
                    f"does not define{hint}; ops of other domains are written op<domain.Name>"
                )


@functools.lru_cache(maxsize=1)
def _onnx_op_names() -> frozenset[str]:
    return frozenset(schema.name for schema in onnx.defs.get_all_schemas_with_history() if schema.domain in ("", "ai.onnx"))


def _check_unique_names(rules: list[Rule]) -> None:
    first: dict[str, Rule] = {}
    for r in rules:
        if r.name in first and first[r.name] is not r:
            raise PatternError(f"{r.loc or '<unknown>:1:1'}: duplicate rule name '{r.name}' (first defined at {first[r.name].loc})")
        first.setdefault(r.name, r)
