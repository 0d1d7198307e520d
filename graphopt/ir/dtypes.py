"""Element types by short name (f32, f16, i64 …), shared by every graph kind.

Attributes such as Cast's `to` carry ONNX's TensorProto enum numbers; native
helpers translate through here so that they never depend on one graph library.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

__all__ = ["onnx_enum_to_name", "name_to_onnx_enum", "numpy_dtype", "LOSSLESS_WIDENING", "is_lossless_widening", "FLOAT_TYPES"]

_ENUM_TO_NAME: dict[int, str] = {
    TensorProto.FLOAT: "f32",
    TensorProto.FLOAT16: "f16",
    TensorProto.BFLOAT16: "bf16",
    TensorProto.DOUBLE: "f64",
    TensorProto.INT64: "i64",
    TensorProto.INT32: "i32",
    TensorProto.INT16: "i16",
    TensorProto.INT8: "i8",
    TensorProto.UINT64: "u64",
    TensorProto.UINT32: "u32",
    TensorProto.UINT16: "u16",
    TensorProto.UINT8: "u8",
    TensorProto.BOOL: "bool",
    TensorProto.STRING: "str",
}
_NAME_TO_ENUM = {v: k for k, v in _ENUM_TO_NAME.items()}

FLOAT_TYPES = frozenset({"f16", "bf16", "f32", "f64"})

#: src -> types that hold every value of src exactly, with the same sign semantics.
#: A cast through one of these and on to any type equals the direct cast.
LOSSLESS_WIDENING: dict[str, frozenset[str]] = {
    "bool": frozenset({"u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64"}),
    "u8": frozenset({"u16", "u32", "u64", "i16", "i32", "i64", "f16", "f32", "f64"}),
    "u16": frozenset({"u32", "u64", "i32", "i64", "f32", "f64"}),
    "u32": frozenset({"u64", "i64", "f64"}),
    "i8": frozenset({"i16", "i32", "i64", "f16", "f32", "f64"}),
    "i16": frozenset({"i32", "i64", "f32", "f64"}),
    "i32": frozenset({"i64", "f64"}),
    "f16": frozenset({"f32", "f64"}),
    "bf16": frozenset({"f32", "f64"}),
    "f32": frozenset({"f64"}),
}


def onnx_enum_to_name(enum: int) -> str | None:
    return _ENUM_TO_NAME.get(int(enum))


def name_to_onnx_enum(name: str) -> int:
    return _NAME_TO_ENUM[name]


def is_lossless_widening(src: str, mid: str) -> bool:
    return mid in LOSSLESS_WIDENING.get(src, frozenset())


def numpy_dtype(name: str) -> np.dtype:
    if name == "bf16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(
        {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i64": np.int64, "i32": np.int32, "i16": np.int16, "i8": np.int8,
         "u64": np.uint64, "u32": np.uint32, "u16": np.uint16, "u8": np.uint8, "bool": np.bool_}[name]
    )
