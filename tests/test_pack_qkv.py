"""graphopt.passes.pack_qkv: GroupQueryAttention's q, k, v projections of one input as one MatMul
(the packed query; key and value left out), as the onnxruntime-genai builder writes them. Golden
counts and equal outputs in onnxruntime's CPU provider over prefill and decode steps; negatives:
a weight that is not a constant, k projected from another input."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from llm_decoders import decoder_block, feeds
from onnx import helper
from rule_testing import run

import graphopt

# prefill, a decode step, several new tokens over a past at batch 1
STEPS = [(2, 5, 0), (2, 1, 7), (1, 4, 3)]


def _ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(n.op_type for n in model.graph.node)


def _assert_same(original: onnx.ModelProto, optimized: onnx.ModelProto, extra: dict[str, np.ndarray] | None = None) -> None:
    names = {i.name for i in original.graph.input}
    for batch, seq, past in STEPS:
        inputs = {k: v for k, v in feeds(original, batch, seq, past).items() if k in names} | (extra or {})
        for e, a in zip(run(original, inputs), run(optimized, inputs), strict=True):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5, err_msg=f"batch {batch}, seq {seq}, past {past}")


def test_golden_q_k_v_become_one_matmul_feeding_the_packed_query() -> None:
    model = decoder_block(mask="causal", hidden=64)
    optimized, report = graphopt.optimize(model, target="ort-cpu")
    assert report.pass_stats("pack_qkv").changes == 1
    assert _ops(model)["MatMul"] == 6 and _ops(optimized)["MatMul"] == 2  # q, k, v, o (and the scores, attention) -> qkv, o
    [gqa] = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    assert gqa.input[1] == "" and gqa.input[2] == ""
    packed = next(n for n in optimized.graph.node if n.output[0] == gqa.input[0])
    weight = next(i for i in optimized.graph.initializer if i.name == packed.input[1])
    assert packed.op_type == "MatMul" and list(weight.dims) == [64, 64 + 2 * 2 * 16]  # heads * head + 2 kv_heads * head
    assert {i.name for i in optimized.graph.initializer}.isdisjoint({"wq", "wk", "wv"})  # the separate weights are gone
    _assert_same(model, optimized)


def test_golden_with_a_shared_kv_buffer_too() -> None:
    model = decoder_block(mask="causal_padding", hidden=64)
    optimized, report = graphopt.optimize(model, target="ort-cpu", kv_buffer="shared")
    assert report.pass_stats("pack_qkv").changes == 1 and report.pass_stats("kv_buffer").changes == 2
    _assert_same(model, optimized)


def _with_k_from(model: onnx.ModelProto, weight_input: bool = False, other_input: bool = False) -> onnx.ModelProto:
    """The block with k's weight a graph input, or k projected from another input of hidden's shape."""
    k_proj = next(n for n in model.graph.node if n.output[0] == "k_proj")
    hidden = next(i for i in model.graph.input if i.name == "hidden")
    if weight_input:
        wk = next(i for i in model.graph.initializer if i.name == "wk")
        model.graph.initializer.remove(wk)
        model.graph.input.append(helper.make_tensor_value_info("wk", onnx.TensorProto.FLOAT, list(wk.dims)))
    if other_input:
        k_proj.input[0] = "hidden_k"
        shape = [d.dim_param or d.dim_value for d in hidden.type.tensor_type.shape.dim]
        model.graph.input.append(helper.make_tensor_value_info("hidden_k", onnx.TensorProto.FLOAT, shape))
    return model


def test_negative_a_weight_that_is_not_a_constant() -> None:
    model = _with_k_from(decoder_block(mask="causal", hidden=64), weight_input=True)
    optimized, report = graphopt.optimize(model, target="ort-cpu")
    assert _ops(optimized)["GroupQueryAttention"] == 1
    assert report.pass_stats("pack_qkv").changes == 0 and _ops(optimized)["MatMul"] == 4
    rng = np.random.default_rng(2)
    _assert_same(model, optimized, {"wk": (rng.standard_normal((64, 32)) / 8).astype(np.float32)})


def test_negative_k_projected_from_another_input() -> None:
    model = _with_k_from(decoder_block(mask="causal", hidden=64), other_input=True)
    optimized, report = graphopt.optimize(model, target="ort-cpu")
    assert _ops(optimized)["GroupQueryAttention"] == 1
    assert report.pass_stats("pack_qkv").changes == 0 and _ops(optimized)["MatMul"] == 4
