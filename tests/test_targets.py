"""The capability tables: what each target may be given, checked against onnxruntime itself."""

from __future__ import annotations

import onnxruntime
import pytest

from graphopt.errors import GraphoptError
from graphopt.ops.snapshot_ort_kernels import snapshot
from graphopt.ops.targets import TARGETS, get_target


def test_cpu_snapshot_matches_installed_onnxruntime() -> None:
    live = snapshot("CPUExecutionProvider")
    table = TARGETS["ort-cpu"].kernels
    live_keys = {tuple(k.split("::", 1)) for k in live["kernels"]}
    # Every kernel the table promises exists in the onnxruntime we test with, for every dtype.
    for key, dtypes in table.items():
        assert key in live_keys, f"{key} not registered by onnxruntime {onnxruntime.__version__}"
        assert dtypes <= set(live["kernels"]["::".join(key)]), key


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_every_lowering_lands_on_a_kernel_of_its_target(target: str) -> None:
    t = TARGETS[target]
    for op in t.lowerings:
        lowered = t.lowered("graphopt", op)
        assert lowered in t.kernels, f"{target}: graphopt.{op} lowers to {lowered}, which has no kernel"


def test_onnx_target_refuses_contrib_and_graphopt_ops() -> None:
    onnx_target = get_target("onnx")
    assert onnx_target.why_not("com.microsoft", "FusedConv", "f32", 17) is not None
    assert onnx_target.why_not("graphopt", "FusedConv", "f32", 17) is not None
    assert onnx_target.why_not("", "Gemm", "f16", 17) is None  # standard ONNX op
    assert onnx_target.why_not("", "NotAnOp", "f32", 17) is not None
    # Ops newer than the model's opset are refused.
    assert onnx_target.why_not("", "LayerNormalization", "f32", 13) is not None
    assert onnx_target.why_not("", "LayerNormalization", "f32", 17) is None


def test_ort_cpu_refuses_dtypes_without_a_kernel() -> None:
    cpu = get_target("ort-cpu")
    assert cpu.why_not("", "Gemm", "f32", 17) is None
    assert "no Gemm kernel for f16" in (cpu.why_not("", "Gemm", "f16", 17) or "")
    assert cpu.why_not("graphopt", "FusedConv", "f32", 17) is None
    assert cpu.why_not("graphopt", "FusedConv", "f16", 17) is not None


def test_unknown_target_is_a_clear_error() -> None:
    with pytest.raises(GraphoptError, match="unknown target 'tensorrt'"):
        get_target("tensorrt")
