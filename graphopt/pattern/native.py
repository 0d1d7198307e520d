"""Native helpers: the Python bodies of body-less `Constraint` / `Rewrite` declarations.

Pattern files declare a helper by name; Python registers its implementation with
`@native_constraint("Name")` or `@native_rewrite("Name")`. A declaration whose name
has no registered implementation is an error when the pattern file is loaded.

Every helper receives a `ctx` first (see `graphopt.match.context.MatchContext`),
through which it reads constant arrays, dtypes and shapes of the bound values in a
way that works on ONNX and FX graphs alike. A constraint returns True, or False /
a string saying why it failed. A rewrite returns a value, an array (turned into a
constant), or a mapping / named tuple whose fields the rule reads as `f.w`; it
raises `RewriteDeclined` to back out of the rewrite with a reason.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphopt.errors import GraphoptError, PatternError

__all__ = [
    "NativeFn",
    "RewriteDeclined",
    "native_constraint",
    "native_rewrite",
    "lookup",
    "registered",
    "call_native",
    "HelperFailed",
    "UserCodeExit",
]


class RewriteDeclined(Exception):
    """Raised by a native rewrite that finds, late, that the rewrite is not valid."""


@dataclass(frozen=True)
class NativeFn:
    kind: str  # "Constraint" or "Rewrite"
    name: str
    fn: Callable[..., Any]
    source: str  # "file:line" of the Python implementation


_REGISTRY: dict[tuple[str, str], NativeFn] = {}


def _register(kind: str, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        code = getattr(fn, "__code__", None)
        source = f"{code.co_filename}:{code.co_firstlineno}" if code else repr(fn)
        # Re-registering the same function (a module imported twice) is harmless;
        # a different function under the same name replaces the old one on purpose.
        _REGISTRY[(kind, name)] = NativeFn(kind, name, fn, source)
        return fn

    return decorate


def native_constraint(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the implementation of `Constraint name(...)`."""
    return _register("Constraint", name)


def native_rewrite(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the implementation of `Rewrite name(...)`."""
    return _register("Rewrite", name)


def lookup(kind: str, name: str) -> NativeFn | None:
    return _REGISTRY.get((kind, name))


def registered() -> list[NativeFn]:
    return sorted(_REGISTRY.values(), key=lambda n: (n.kind, n.name))


def call_native(native: NativeFn, ctx: Any, *args: Any, rule: str | None = None) -> Any:
    """Run a native helper. What it raises (SystemExit included: user code may call
    sys.exit) becomes a PatternError `file:line: Kind name: message`, the line being the
    deepest one in the helper's own file; RewriteDeclined and GraphoptError pass."""
    try:
        return native.fn(ctx, *args)
    except (RewriteDeclined, GraphoptError):
        raise
    except (Exception, SystemExit) as error:
        in_rule = f" (rule {rule})" if rule else ""
        kind = UserCodeExit if isinstance(error, SystemExit) else HelperFailed
        raise kind(f"{_where(native, error)}: {native.kind} {native.name}{in_rule}: {_describe(error)}") from None


class HelperFailed(PatternError):
    """A native helper raised while graphopt ran it (the message says where)."""


class UserCodeExit(HelperFailed):
    """A native helper called sys.exit: always fatal, whoever wrote the rule."""


def _where(native: NativeFn, error: BaseException) -> str:
    source_file, _, line = native.source.rpartition(":")
    for frame in traceback.extract_tb(error.__traceback__):
        if frame.filename == source_file and frame.lineno:
            line = str(frame.lineno)  # the deepest frame in the helper's file
    return f"{source_file}:{line}" if source_file else native.source


def _describe(error: BaseException) -> str:
    if isinstance(error, SystemExit):
        return f"called sys.exit({error.code!r}) while graphopt was running it"
    return f"{type(error).__name__}: {error}"
