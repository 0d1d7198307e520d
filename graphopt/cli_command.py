"""The command class of graphopt's subcommands: the help text users of onnxsim and Polygraphy
expect, and parameter values converted without importing pydantic.

typer (0.29 on) converts every parameter value through a pydantic TypeAdapter, built on
the command's first run. For `graphopt optimize` that is pydantic's import and ~30
TypeAdapters (~0.05 s of CPU, an eighth of a small model's whole run), to turn strings
into str, int, bool and Path. `GraphoptCommand` gives each parameter of those plain kinds
a converter that does the common case itself and hands anything else (a value that is
not a plain string, a number pydantic would read in its own way) to typer's own
converter, so values and error messages stay typer's. This leans on typer's private
coercion layer (`typer._coercion`): a typer without it (older releases, which need no
pydantic) or with other fields is left as it is, and tests/test_cli_startup.py fails
when the shortcut no longer applies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

import typer

__all__ = ["GraphoptCommand", "GraphoptGroup", "plain_converter"]

_TYPE_TAG = re.compile(r" <(?:path|text|int|float|bool|int range|float range)>(?= |$)", re.M)
#: Integers spelt so that int() and pydantic read them alike (pydantic also takes "+5", "1_000", "1.0").
_PLAIN_INT = re.compile(r"-?[0-9]{1,18}")

try:  # typer's coercion layer (0.29): absent from older releases, which convert through click
    from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
    from typer._param_types import coerce_cli_path
except ImportError:  # pragma: no cover - depends on the installed typer
    RuntimeParam = None  # type: ignore[assignment,misc]


def _use_plain_converters(params: list[Any]) -> None:
    for param in params:
        converter = plain_converter(param)
        if converter is not None:
            param._runtime_param = converter


class _PlainParameters:
    """Gives a command's parameters, the `--help` option included, the plain converters."""

    params: list[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _use_plain_converters(self.params)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            _use_plain_converters([option])
        return option


class GraphoptGroup(_PlainParameters, typer.core.TyperGroup):
    """The top level (`--version`, `--help`): its options converted without pydantic too."""


class GraphoptCommand(_PlainParameters, typer.core.TyperCommand):
    """Help in the form onnxsim's and Polygraphy's users read: `IN.onnx [OUT.onnx]` on the
    usage line (typer writes required arguments as `{IN.onnx}`) and no type tags such as
    `<path>` after argument names (every argument has a metavar that says more)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, typer.core.TyperArgument):
                name = param.metavar or (param.name or "").upper()
                pieces.append(name if param.required or name.startswith("[") else f"[{name}]")
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces

    def get_help(self, ctx: Any) -> str:
        return _TYPE_TAG.sub("", super().get_help(ctx))


_NOT_PLAIN = object()


def _plain_value(value: Any, kind: type, parameter_info: Any) -> Any:
    """`value` as typer would convert it to `kind` (str, int, bool or Path), or _NOT_PLAIN where typer must decide."""
    if kind is bool:  # flags arrive as bools; "--flag/--no-flag" envvar strings go to typer
        return value if type(value) is bool else _NOT_PLAIN
    if type(value) is str:
        if kind is str:
            return value
        if kind is Path:
            return Path(value)
        if _PLAIN_INT.fullmatch(value):
            value = int(value)
    if kind is int and type(value) is int:
        low, high = parameter_info.min, parameter_info.max
        if (low is None or value >= low) and (high is None or value <= high):
            return value
    return _NOT_PLAIN


def _plain_kind(annotation: Any) -> tuple[type, bool] | None:
    """(str, int, bool or Path; whether a list of them) for the annotations the shortcut handles."""
    listed = get_origin(annotation) is list
    if listed:
        args = get_args(annotation)
        if len(args) != 1:
            return None
        annotation = args[0]
    return (annotation, listed) if annotation in (str, int, bool, Path) else None


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class _PlainRuntimeParam(RuntimeParam):
        """Converts plain strings itself; anything else goes to typer's converter (and pydantic)."""

        descriptor: TypeDescriptor
        kind: type
        listed: bool

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            info = self.parameter_info
            if self.listed and isinstance(value, (list, tuple)):
                items = [_plain_value(item, self.kind, info) for item in value]
                if all(item is not _NOT_PLAIN for item in items):
                    return [self._finish(item, param, ctx) for item in items]
            elif not self.listed:
                plain = _plain_value(value, self.kind, info)
                if plain is not _NOT_PLAIN:
                    return self._finish(plain, param, ctx)
            return build_runtime_param(self.descriptor)._coerce_value(value, param=param, ctx=ctx)

        def _finish(self, value: Any, param: Any, ctx: Any) -> Any:
            # A Path passes typer's own checks (exists=, readable=, ...) as it would have.
            if self.kind is Path:
                return coerce_cli_path(value, self.parameter_info, path_type=Path, param=param, ctx=ctx)
            return value


def plain_converter(param: Any) -> Any:
    """The shortcut converter for a typer parameter of a plain kind, or None (typer's stays)."""
    if RuntimeParam is None or getattr(param, "_runtime_param", _NOT_PLAIN) is not None:
        return None
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None or descriptor.file_annotation is not None:
        return None
    info = descriptor.parameter_info
    if getattr(info, "parser", None) is not None or getattr(info, "click_type", None) is not None or getattr(info, "clamp", False):
        return None
    found = _plain_kind(descriptor.annotation)
    if found is None:
        return None
    kind, listed = found
    if kind is Path and (getattr(info, "path_type", None) is not None or getattr(info, "resolve_path", False)):
        return None
    try:
        return _PlainRuntimeParam(
            parameter_info=info, annotation=descriptor.annotation, descriptor=descriptor, kind=kind, listed=listed
        )
    except TypeError:  # a typer whose RuntimeParam takes other fields: its own converter stays
        return None
