"""Native helpers: the Python bodies of body-less `Constraint` / `Rewrite` declarations.

Pattern files declare a helper by name; Python registers its implementation with
`@native_constraint("Name")` or `@native_rewrite("Name")`. A declaration whose name
has no registered implementation is an error when the pattern file is loaded.

Every helper receives a `ctx` first (see `graphopt.match.context.MatchContext`),
through which it reads constant arrays, dtypes and shapes of the bound values in a
way that works on ONNX and FX graphs alike. A constraint returns True, or False /
a string saying why it failed. A rewrite returns a value, an array (turned into a
constant), or a mapping / dataclass whose fields the rule reads as `f.w`; it
raises `RewriteDeclined` to back out of the rewrite with a reason.

A helper may declare what it takes and returns as frozen dataclasses whose fields
are annotated with the kinds below (`q: Value`, `eps: Attr`, `form: Tag`,
`kind: OpType`): `@native_rewrite("F", params=FArgs, results=FResult)`. It then
receives one `FArgs` (named fields instead of a positional bag), and the loader
holds every `.pdll` declaration of "F" to the same names and kinds, so a wrong call
is an error at load time with file:line:col, not at run time.
"""

from __future__ import annotations

import dataclasses
import sys
import traceback
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from graphopt.errors import GraphoptError, PatternError

__all__ = [
    "NativeFn",
    "Value",
    "Attr",
    "Tag",
    "OpType",
    "declared_fields",
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


# The kinds of a helper's parameters and results, as annotations of its dataclass fields.
Value = Annotated[Any, "value"]  # a graph value: bound value, matched or built op, array result
Attr = Annotated[Any, "attr"]  # an attribute value or a literal
Tag = Annotated[Any, "tag"]  # an alternative's tag (None where the alternative was not reached)
OpType = Annotated[Any, "type"]  # a matched op type, "Relu" or "graphopt.FusedConv"


def declared_fields(cls: type) -> tuple[tuple[str, str], ...]:
    """(name, kind) of each field of a helper's params/results dataclass, in order."""
    hints: dict[str, Any] | None = None
    out = []
    for f in dataclasses.fields(cls):
        annotation = _plain_annotation(cls, f)
        if annotation is _UNRESOLVED:
            if hints is None:
                hints = typing.get_type_hints(cls, include_extras=True)
            annotation = hints.get(f.name)
        meta = getattr(annotation, "__metadata__", ())
        out.append((f.name, str(meta[0]) if meta else "any"))
    return tuple(out)


_UNRESOLVED = object()


def _plain_annotation(cls: type, f: dataclasses.Field[Any]) -> Any:
    """A field's annotation written as one name of its class's module (`q: Value`, the usual
    form), as typing.get_type_hints would resolve it, or _UNRESOLVED. get_type_hints compiles
    and evaluates every string annotation (~1.5 ms of the built-in library's loading)."""
    annotation = f.type
    if not isinstance(annotation, str):
        return annotation
    own = cls.__dict__.get("__annotations__", {})
    module = sys.modules.get(cls.__module__)
    if f.name not in own or not annotation.isidentifier() or annotation in vars(cls) or module is None:
        return _UNRESOLVED  # inherited, an expression, or a name the class itself defines: typing's rules
    value = vars(module).get(annotation, _UNRESOLVED)
    return _UNRESOLVED if isinstance(value, str) else value  # a string would be evaluated again


@dataclass(frozen=True)
class NativeFn:
    kind: str  # "Constraint" or "Rewrite"
    name: str
    fn: Callable[..., Any]
    source: str  # "file:line" of the Python implementation
    params: type | None = None  # a dataclass: the helper receives one instance of it
    results: type | None = None  # a dataclass of what a Rewrite returns (declared, not enforced)

    def call(self, ctx: Any, args: Sequence[Any]) -> Any:
        if self.params is not None:
            return self.fn(ctx, self.params(*args))
        return self.fn(ctx, *args)


_REGISTRY: dict[tuple[str, str], NativeFn] = {}


def _register(kind: str, name: str, params: type | None, results: type | None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    for what, cls in (("params", params), ("results", results)):
        if cls is not None and not dataclasses.is_dataclass(cls):
            raise TypeError(f"{kind} {name}: {what}= takes a dataclass, not {cls!r}")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        code = getattr(fn, "__code__", None)
        source = f"{code.co_filename}:{code.co_firstlineno}" if code else repr(fn)
        # Re-registering the same function (a module imported twice) is harmless;
        # a different function under the same name replaces the old one on purpose.
        _REGISTRY[(kind, name)] = NativeFn(kind, name, fn, source, params, results)
        return fn

    return decorate


def native_constraint(name: str, *, params: type | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the implementation of `Constraint name(...)` (see the module doc for `params`)."""
    return _register("Constraint", name, params, None)


def native_rewrite(name: str, *, params: type | None = None, results: type | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the implementation of `Rewrite name(...) -> (...)` (see the module doc for `params`, `results`)."""
    return _register("Rewrite", name, params, results)


def lookup(kind: str, name: str) -> NativeFn | None:
    return _REGISTRY.get((kind, name))


def registered() -> list[NativeFn]:
    return sorted(_REGISTRY.values(), key=lambda n: (n.kind, n.name))


def call_native(native: NativeFn, ctx: Any, *args: Any, rule: str | None = None) -> Any:
    """Run a native helper. What it raises (SystemExit included: user code may call
    sys.exit) becomes a PatternError `file:line: Kind name: message`, the line being the
    deepest one in the helper's own file; RewriteDeclined and GraphoptError pass."""
    try:
        return native.call(ctx, args)
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
