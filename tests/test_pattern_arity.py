"""The loader's arity check of native helpers (graphopt.pattern.loader.takes_positional) reads
a plain function's code object instead of calling inspect: it must say what inspect says."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import pytest

from graphopt.pattern.loader import takes_positional


def _plain(ctx, a): ...  # type: ignore[no-untyped-def]
def _defaults(ctx, a, b=1, c=2): ...  # type: ignore[no-untyped-def]
def _star(ctx, *rest): ...  # type: ignore[no-untyped-def]
def _star_after(ctx, a, *rest, flag=False): ...  # type: ignore[no-untyped-def]
def _keyword_required(ctx, a, *, mode): ...  # type: ignore[no-untyped-def]
def _keyword_default(ctx, a, *, mode="x"): ...  # type: ignore[no-untyped-def]
def _positional_only(ctx, a, /, b): ...  # type: ignore[no-untyped-def]
def _positional_only_default(ctx, /, a=1): ...  # type: ignore[no-untyped-def]
def _kwargs(ctx, a, **options): ...  # type: ignore[no-untyped-def]
def _nothing(): ...  # type: ignore[no-untyped-def]


@functools.wraps(_plain)
def _wrapped(*args, **kwargs): ...  # type: ignore[no-untyped-def]


def _with_signature(*args): ...  # type: ignore[no-untyped-def]


_with_signature.__signature__ = inspect.signature(_defaults)  # type: ignore[attr-defined]


class _Callable:
    def __call__(self, ctx, a): ...  # type: ignore[no-untyped-def]

    def method(self, ctx, a, b=0): ...  # type: ignore[no-untyped-def]


FUNCTIONS: list[Any] = [
    _plain, _defaults, _star, _star_after, _keyword_required, _keyword_default, _positional_only, _positional_only_default,
    _kwargs, _nothing, _wrapped, _with_signature, _Callable(), _Callable().method, functools.partial(_defaults, None),
    lambda ctx, a, b: None,
]


def _inspect_binds(fn: Any, count: int) -> bool:
    try:
        inspect.signature(fn).bind(*range(count))
    except TypeError:
        return False
    return True


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda fn: getattr(fn, "__name__", type(fn).__name__))
def test_takes_positional_says_what_inspect_says(fn: Any) -> None:
    for count in range(6):
        try:
            ours = takes_positional(fn, count)
        except TypeError:
            ours = False
        assert ours == _inspect_binds(fn, count), count


def test_builtin_without_signature_is_left_alone() -> None:
    with pytest.raises(ValueError):
        takes_positional(max, 2)  # no signature: the loader skips the check
