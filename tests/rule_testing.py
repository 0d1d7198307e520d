"""Helpers for the per-rule golden tests: build a model, optimize it with some
rules, and check rewrite counts, node counts and numerics."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import graphopt
from graphopt.decisions import CostTable, Entry

__all__ = ["make_model", "init", "optimize_with", "run", "assert_same_outputs", "rewrites", "op_types", "TensorProto", "helper",
           "fused_conv_table", "FUSED_CONV_WINS", "skip_norm_table", "SKIP_NORM_WINS", "bias_act_table", "BIAS_ACT_WINS", "FUSED_WINS"]

_RNG = np.random.default_rng(1234)


def init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def rand(*shape: int, dtype=np.float32, positive: bool = False) -> np.ndarray:
    a = _RNG.standard_normal(shape)
    if positive:
        a = np.abs(a) + 0.5
    return a.astype(dtype)


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 17, value_info=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, list(initializers), value_info=list(value_info))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)

    return model


def fused_conv_table(fused_ms: float, split_ms: float) -> CostTable:
    """A cost table in which every float32 convolution takes `fused_ms` as com.microsoft.FusedConv
    and `split_ms` as Conv + activation, on both onnxruntime providers."""
    return CostTable([
        Entry(ep, "fused_conv", "Conv", "f32", {}, {"FusedConv": fused_ms, "Conv+activation": split_ms}, source="test")
        for ep in ("CPUExecutionProvider", "CUDAExecutionProvider")
    ])


#: FusedConv predicted faster everywhere: what the conv-activation rules' golden tests optimize
#: with, to see the rules' output (by default, unmeasured, a FusedConv is split back into the
#: input's Conv + activation; graphopt/passes/fused_conv.py).
FUSED_CONV_WINS = fused_conv_table(0.5, 1.0)


def skip_norm_table(fused_ms: float, unfused_ms: float, ops: Sequence[str] = ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization")) -> CostTable:
    """A cost table in which every residual norm (`ops`, float32 and float16, any shape) takes `fused_ms`
    as the com.microsoft op and `unfused_ms` as Add + norm on the CPU provider (the only one that
    decides it: graphopt/passes/skip_norm.py)."""
    return CostTable([
        Entry("CPUExecutionProvider", "skip_norm", op, dtype, {}, {"fused": fused_ms, "unfused": unfused_ms}, source="test")
        for op in ops for dtype in ("f32", "f16")
    ])


#: The fused residual norms predicted faster everywhere: what the normalization rules' golden
#: tests on ort-cpu optimize with, to see the rules' output (by default, on ort-cpu, the
#: measured table splits them back into Add + norm).
SKIP_NORM_WINS = skip_norm_table(0.5, 1.0)


def bias_act_table(fused_ms: float, unfused_ms: float, ops: Sequence[str] = ("BiasGelu", "FastGelu")) -> CostTable:
    """A cost table in which every bias activation after a MatMul (`ops`, float32 and float16, any
    shape) takes `fused_ms` as the com.microsoft op with the bias and `unfused_ms` as Add +
    activation (onnxruntime's Gemm + activation) on both onnxruntime providers (graphopt/passes/bias_act.py)."""
    return CostTable([
        Entry(ep, "bias_act", op, dtype, {}, {"fused": fused_ms, "unfused": unfused_ms}, source="test")
        for ep in ("CPUExecutionProvider", "CUDAExecutionProvider") for op in ops for dtype in ("f32", "f16")
    ])


#: The bias activations predicted faster everywhere (the rule's output as it wrote it).
BIAS_ACT_WINS = bias_act_table(0.5, 1.0)
#: FusedConv, the residual norms and the bias activations predicted faster: the rules' output as they wrote it.
FUSED_WINS = CostTable([*FUSED_CONV_WINS.entries, *SKIP_NORM_WINS.entries, *BIAS_ACT_WINS.entries])


def optimize_with(model: onnx.ModelProto, rules: Sequence[str] | None, target: str = "onnx", **kwargs):
    return graphopt.optimize(model, target=target, enable=list(rules) if rules is not None else None, **kwargs)


def op_types(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def rewrites(report, rule: str) -> int:
    return report.rules[rule].applications if rule in report.rules else 0


def _feeds(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]] | None) -> dict[str, np.ndarray]:
    feeds = {}
    inits = {i.name for i in model.graph.initializer}
    for value in model.graph.input:
        if value.name in inits:
            continue
        t = value.type.tensor_type
        shape = (shapes or {}).get(value.name) or tuple(d.dim_value if d.dim_value > 0 else 2 for d in t.shape.dim)
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[value.name] = _RNG.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[value.name] = _RNG.random(shape) > 0.5
        else:
            feeds[value.name] = _RNG.integers(0, 4, shape).astype(dtype)
    return feeds


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # compare graphopt, not ORT
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_same_outputs(original: onnx.ModelProto, optimized: onnx.ModelProto, shapes=None, rtol=1e-4, atol=1e-5, feeds=None) -> None:
    feeds = _feeds(original, shapes) if feeds is None else feeds
    expected = run(original, feeds)
    actual = run(optimized, feeds)
    assert [o.name for o in original.graph.output] == [o.name for o in optimized.graph.output]
    for e, a in zip(expected, actual):
        assert e.dtype == a.dtype
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)


def ort_has_kernel(op_type: str, opset: int, domain: str = "") -> bool:
    """Whether the installed onnxruntime's CPU provider has a kernel for the op at `opset`
    (what `--target onnx` requires before lowering to a standard op: 1.32 has no Swish)."""
    from graphopt.ops.snapshot_ort_kernels import installed_kernels

    table = installed_kernels("CPUExecutionProvider") or {}
    return any(a <= opset <= b for a, b in table.get("ranges", {}).get(f"{domain}::{op_type}", []))
