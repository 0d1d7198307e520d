"""`--precision fp8` on the ONNX path: refused, with the reason read from the target's kernels.

FP8 GEMMs with per-row scales (what the torch path does, graphopt/passes/fx_fp8.py) need a
runtime kernel taking float8 operands. onnxruntime's kernel tables (data/ort_*_kernels.json)
have none in MatMul or Gemm on any provider; the CUDA provider has com.microsoft.GemmFloat8
(cuBLASLt, compute capability >= 8.9), whose scales are one per tensor: activations would
need a dynamic whole-tensor quantize (ReduceMax, Div, QuantizeLinear to float8) before every
GEMM. graphopt does not emit that form (it is not the per-row scheme, and nothing here could
measure it against fp16), so fp8 is refused on every ONNX target, naming what the target has.
"""

from __future__ import annotations

from collections.abc import Mapping

from graphopt.errors import GraphoptError

__all__ = ["fp8_refusal", "refuse_fp8"]

_FP8 = "tensor(float8e4m3fn)"
_GEMMS = (("", "MatMul"), ("", "Gemm"))
_GEMM_FLOAT8 = ("com.microsoft", "GemmFloat8")
_TORCH_PATH = 'torch.compile(model, backend="graphopt", options={"precision": "fp8"}) does FP8 on the torch path'


def _kernel_types(table: Mapping[tuple[str, str], frozenset[str]], key: tuple[str, str]) -> frozenset[str]:
    return frozenset(table[key]) if key in table else frozenset()


def fp8_refusal(target_name: str) -> str:
    """The one-line reason `--precision fp8` is not supported on this ONNX target."""
    from graphopt.ops.targets import get_target

    target = get_target(target_name)
    table = getattr(target, "standard_kernels", None) or target.kernels
    if not table:
        reason = "standard ONNX has no FP8 MatMul or Gemm (float8 types only in Cast, QuantizeLinear and DequantizeLinear)"
    elif any(_FP8 in _kernel_types(table, key) for key in _GEMMS):  # a future onnxruntime: time to build it
        reason = "its MatMul/Gemm take float8e4m3fn, but graphopt does not emit that form yet"
    elif _FP8 in _kernel_types(table, _GEMM_FLOAT8):
        reason = ("onnxruntime's CUDA provider has no FP8 MatMul or Gemm kernel; its FP8 GEMM, com.microsoft.GemmFloat8 "
                  "(cuBLASLt, compute capability ≥ 8.9), scales whole tensors, not rows, and needs a dynamic "
                  "QuantizeLinear of every activation, a form graphopt does not emit")
    else:
        reason = f"{target.description} has no FP8 GEMM kernel (MatMul and Gemm take no float8 type)"
    return f"fp8 is not supported on target {target_name}: {reason}; {_TORCH_PATH}"


def refuse_fp8(precision: str | None, target_name: str) -> None:
    """Raise GraphoptError (one line) when `precision` asks for fp8 on the ONNX path."""
    if precision is not None and str(precision).strip().lower() == "fp8":
        raise GraphoptError(fp8_refusal(target_name))
