"""Triton, when it is installed, and what the kernel modules need around it.

Triton is optional: CPU-only installs register every op with its reference
implementation. When ``import triton`` fails, ``triton`` and ``tl`` below are
placeholders (the approach of vLLM's ``TritonPlaceholder``) so that the kernel
modules can still define their ``@triton.jit`` functions at module level, where
they read like ordinary Triton code; a placeholder kernel raises if launched.

``TRITON_INTERPRET=1`` (read at import, as Triton itself does) runs kernels in
Triton's numpy interpreter on CPU tensors: the tests use it to check the kernels'
logic on a machine without a GPU.
"""

import os
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["HAS_TRITON", "INTERPRET", "triton", "tl", "use_triton", "dot_precision", "next_power_of_2", "autotune_configs", "m_bucket", "multiprocessors", "EXACT_M"]


class _PlaceholderKernel:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        raise RuntimeError(f"Triton kernel {self.fn.__name__} launched, but triton is not installed")


class _TritonPlaceholder:
    """Just enough of ``triton`` to define kernels and configs at import time."""

    @staticmethod
    def jit(fn: Callable[..., Any]) -> _PlaceholderKernel:
        return _PlaceholderKernel(fn)

    @staticmethod
    def autotune(*args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        return lambda kernel: kernel

    @staticmethod
    def Config(*args: Any, **kwargs: Any) -> None:  # noqa: N802 - mirrors triton.Config
        return None


class _LanguagePlaceholder:
    """``tl.constexpr`` and friends appear in kernel annotations, evaluated at import."""

    def __getattr__(self, name: str) -> Any:
        return None


try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # CPU-only install: reference implementations only
    triton = _TritonPlaceholder()  # type: ignore[assignment]
    tl = _LanguagePlaceholder()  # type: ignore[assignment]
    HAS_TRITON = False

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(*tensors: torch.Tensor | None) -> bool:
    """True where the Triton kernels run: CUDA tensors (CPU ones too under the interpreter)."""
    if not HAS_TRITON:
        return False
    present = [t for t in tensors if t is not None]
    if any(t.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.bool) for t in present):
        return False  # float64 and friends: the reference path is exact and simple
    device = present[0].device.type
    return device == "cuda" or (INTERPRET and device == "cpu")


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision: fp32 follows torch's TF32 switch, like torch's own matmuls."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"  # ignored for fp16/bf16 operands


def next_power_of_2(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()


def autotune_configs(gpu: list[dict[str, Any]], interpreter: dict[str, Any]) -> list[Any]:
    """The GPU's autotuning space, or one small config under the interpreter (a single
    config is never benchmarked, and small tiles make the tests cover several tiles)."""
    chosen = [interpreter] if INTERPRET else gpu
    configs = []
    for entry in chosen:
        meta = dict(entry)
        warps = meta.pop("num_warps", 4)
        stages = meta.pop("num_stages", 2)
        configs.append(triton.Config(meta, num_warps=warps, num_stages=stages))
    return configs


#: Rows up to which the decode kernels' autotuners key on the exact M (then powers of two).
EXACT_M = 16


def m_bucket(m: int) -> int:
    """The autotuners' M key: exact to EXACT_M, then powers of two up to 4096."""
    return m if m <= EXACT_M else min(next_power_of_2(m), 4096)


def multiprocessors(device: Any) -> int:
    """The device's SM count (the split-K heuristics' unit); 4 under the interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter
