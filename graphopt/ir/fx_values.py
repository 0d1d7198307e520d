"""What the FX view and the torch lowering share: how values that are not plain FX
nodes are written, and the conversions between torch and graphopt's names.

* `InlineConst` -- a Python number or int list in a node's arguments, read as a constant;
* `NeutralOp` -- the call target of a graphopt op between its rewrite and its lowering;
* `meta_val` -- the fake tensor an FX node computes;
* dtype names ("f32", "bf16", ...) and tensor <-> numpy conversions.

Kept apart from both users so that neither imports the other for them
(graphopt.ir.fx_view builds new nodes through graphopt.ops.torch_lowering).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.fx as fx

__all__ = [
    "InlineConst",
    "NeutralOp",
    "neutral_op",
    "is_neutral",
    "meta_val",
    "torch_dtype_name",
    "torch_dtype_from_name",
    "tensor_to_numpy",
    "numpy_to_tensor",
]

_TORCH_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
    torch.complex64: "c64",
    torch.complex128: "c128",
}
_NAME_TO_TORCH = {v: k for k, v in _TORCH_DTYPES.items()}


def torch_dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else _TORCH_DTYPES.get(dtype, str(dtype).replace("torch.", ""))


def torch_dtype_from_name(name: str) -> torch.dtype:
    return _NAME_TO_TORCH[name]


def tensor_to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A CPU numpy copy of a real tensor (bfloat16 through ml_dtypes, as graphopt's ONNX side does)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.contiguous().numpy()


def numpy_to_tensor(array: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
    array = np.asarray(array)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16).to(device)
    return torch.from_numpy(np.ascontiguousarray(array).copy()).to(device)


# --------------------------------------------------------------------------- neutral graphopt ops


class NeutralOp:
    """The call target of a graphopt op between its rewrite and its lowering. Its
    attributes live in ``node.meta["graphopt_attrs"]``; it is never executed."""

    def __init__(self, op_type: str) -> None:
        self.op_type = op_type
        self.__name__ = f"graphopt_{op_type}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"graphopt.{self.op_type} ran before it was lowered to torch ops")

    def __repr__(self) -> str:
        return f"graphopt.{self.op_type}"


_NEUTRAL: dict[str, NeutralOp] = {}


def neutral_op(op_type: str) -> NeutralOp:
    if op_type not in _NEUTRAL:
        _NEUTRAL[op_type] = NeutralOp(op_type)
    return _NEUTRAL[op_type]


def is_neutral(node: fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, NeutralOp)


# --------------------------------------------------------------------------- values that are not FX nodes


class InlineConst:
    """A constant operand written inline in a node's arguments (a Python number or int list)."""

    __slots__ = ("array", "name", "raw")

    def __init__(self, array: np.ndarray | None, name: str, raw: Any) -> None:
        self.array = array  # None for an int list with symbolic entries
        self.name = name
        self.raw = raw  # the argument as written, for lowering it back

    def __repr__(self) -> str:
        return f"InlineConst({self.name}={self.raw!r})"


def meta_val(node: Any) -> Any:
    """The fake tensor (or SymInt, or tuple of them) an FX node computes; None for non-nodes."""
    return node.meta.get("val") if isinstance(node, fx.Node) else None
