"""Finding graphopt's torch custom ops (``torch.ops.graphopt.*``, registered by importing
graphopt.kernels) and telling whether one can be used: registered, and for training
differentiable.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from graphopt.pattern.native import RewriteDeclined

__all__ = ["ensure_kernels", "custom_op_problem", "graphopt_op"]


@functools.lru_cache(maxsize=1)
def ensure_kernels() -> str | None:
    """Import graphopt.kernels (it registers torch.ops.graphopt.*); None, or why it could not."""
    try:
        import graphopt.kernels  # noqa: F401
    except Exception as error:  # a broken kernels package must not break compiling
        return f"graphopt.kernels failed to import: {type(error).__name__}: {error}"
    return None


def _custom_op(qualname: str) -> Any:
    namespace, name = qualname.split("::")
    try:
        return getattr(getattr(torch.ops, namespace), name).default
    except (AttributeError, RuntimeError):
        return None


def custom_op_problem(qualname: str, training: bool = False) -> str | None:
    """None if torch.ops.<qualname> is registered (and, for training, differentiable)."""
    ensure_kernels()
    op = _custom_op(qualname)
    if op is None:
        return f"torch.ops.{qualname.replace('::', '.')} is not registered"
    if training and not _has_gradient(qualname, op):
        return f"torch.ops.{qualname.replace('::', '.')} has no gradient formula"
    return None


def _has_gradient(qualname: str, op: Any) -> bool:
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(qualname)
    if opdef is not None:  # torch.library.custom_op / triton_op: a backward is registered or not
        return getattr(opdef, "_backward_fn", None) is not None
    name = op.name()
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(name, key) for key in ("Autograd", "CompositeImplicitAutograd"))


def graphopt_op(name: str) -> Any:
    op = _custom_op(f"graphopt::{name}")
    if op is None:
        raise RewriteDeclined(f"torch.ops.graphopt.{name} is not registered")
    return op

