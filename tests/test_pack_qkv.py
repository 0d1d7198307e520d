"""graphopt.passes.pack_qkv: GroupQueryAttention's q, k, v projections of one input as one MatMul
(the packed query; key and value left out), as the onnxruntime-genai builder writes them. Golden
counts and equal outputs in onnxruntime's CPU provider over prefill and decode steps; negatives:
a weight that is not a constant, k projected from another input."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
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


# ----------------------------------------------------------------------------- biased projections (Qwen2)


def _packed(optimized: onnx.ModelProto) -> tuple[onnx.NodeProto, onnx.NodeProto]:
    """The packed MatMul and the Add of its bias, read by the one GroupQueryAttention."""
    [gqa] = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    assert gqa.input[1] == "" and gqa.input[2] == ""
    add = next(n for n in optimized.graph.node if n.output[0] == gqa.input[0])
    matmul = next(n for n in optimized.graph.node if n.output[0] in add.input)
    return matmul, add


def test_golden_biased_q_k_v_become_one_matmul_and_one_bias_add() -> None:
    """Qwen2's projections: Add(MatMul(x, W), b) for q, k and v (k's Add with the bias first) -> one MatMul and
    one Add of the concatenated biases."""
    model = decoder_block(mask="causal", hidden=64, qkv_bias="q,kx,v")
    assert _ops(model)["Add"] - _ops(decoder_block(mask="causal", hidden=64))["Add"] == 3
    optimized, report = graphopt.optimize(model, target="ort-cpu")
    assert report.pass_stats("pack_qkv").changes == 1
    assert _ops(optimized)["MatMul"] == 2
    matmul, add = _packed(optimized)
    inits = {i.name: i for i in optimized.graph.initializer}
    bias = onnx.numpy_helper.to_array(inits[next(i for i in add.input if i in inits)])
    expected = np.concatenate([onnx.numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == f"b{n}")) for n in "qkv"])
    np.testing.assert_array_equal(bias, expected)  # q's, then k's, then v's
    assert matmul.op_type == "MatMul" and set(inits).isdisjoint({"wq", "wk", "wv", "bq", "bk", "bv"})
    _assert_same(model, optimized)


def test_golden_a_bias_on_k_only_packs_zeros_for_q_and_v() -> None:
    model = decoder_block(mask="causal", hidden=64, qkv_bias="k")
    optimized, report = graphopt.optimize(model, target="ort-cpu")
    assert report.pass_stats("pack_qkv").changes == 1 and _ops(optimized)["MatMul"] == 2
    _, add = _packed(optimized)
    bias = onnx.numpy_helper.to_array(next(i for i in optimized.graph.initializer if i.name in add.input))
    assert not bias[:64].any() and bias[64:96].any() and not bias[96:].any()
    _assert_same(model, optimized)


def test_negative_a_bias_that_is_not_a_constant() -> None:
    model = decoder_block(mask="causal", hidden=64, qkv_bias="q,k,v")
    bk = next(i for i in model.graph.initializer if i.name == "bk")
    model.graph.initializer.remove(bk)
    model.graph.input.append(helper.make_tensor_value_info("bk", onnx.TensorProto.FLOAT, list(bk.dims)))
    optimized, report = graphopt.optimize(model, target="ort-cpu")
    assert _ops(optimized)["GroupQueryAttention"] == 1
    assert report.pass_stats("pack_qkv").changes == 0 and _ops(optimized)["MatMul"] == 4
    _assert_same(model, optimized, {"bk": onnx.numpy_helper.to_array(bk)})


def test_qwen2_export_packs_its_biased_projections() -> None:
    """The tiny Qwen2 (tests/llm_families.py) exported with a cache: both layers' q / k / v (biased) packed, the
    outputs over a prefill and decode steps equal the export's in onnxruntime's CPU provider."""
    pytest.importorskip("transformers")
    from architectures import build
    from llm_families import max_step_difference

    path, _ = build("qwen2-kv", "dynamo")
    model = onnx.load(str(path))
    optimized, report = graphopt.optimize(model, target="ort-cpu")
    assert report.pass_stats("pack_qkv").changes == 2
    gqa = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2 and all(n.input[1] == "" for n in gqa)
    assert max_step_difference(model, optimized, vocab=97, shared=False) < 1e-5


# ----------------------------------------------------------------------------- packed in the checkpoint (Phi-3)


def _slices_of_the_product(model: onnx.ModelProto) -> int:
    [matmul] = [n for n in model.graph.node if n.op_type == "MatMul" and "wqkv" in n.input[1]]
    return sum(n.op_type == "Slice" and n.input[0] == matmul.output[0] for n in model.graph.node)


def test_golden_q_k_v_slices_of_one_product_are_the_packed_query() -> None:
    """Phi-3's qkv_proj: q, k, v are Slices [0, 64), [64, 96), [96, 128) of one MatMul: the op reads that product."""
    model = decoder_block(mask="causal", hidden=64, packed_qkv=((0, 64), (64, 96), (96, 128)))
    optimized, report = graphopt.optimize(model, target="ort-cpu")
    assert report.pass_stats("pack_qkv").changes == 1
    [gqa] = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    assert gqa.input[1] == "" and gqa.input[2] == ""
    assert next(n for n in optimized.graph.node if n.output[0] == gqa.input[0]).op_type == "MatMul"
    assert _slices_of_the_product(optimized) == 0 and _ops(optimized)["MatMul"] == 2
    _assert_same(model, optimized)


def test_negative_slices_in_another_order_or_leaving_columns_out() -> None:
    # k first in the product (the op's packed query is q, k, v in that order); a product wider than q + 2 kv
    for spans, width in ((((32, 96), (0, 32), (96, 128)), 0), (((0, 64), (64, 96), (96, 128)), 136)):
        model = decoder_block(mask="causal", hidden=64, packed_qkv=spans, packed_width=width)
        optimized, report = graphopt.optimize(model, target="ort-cpu")
        assert _ops(optimized)["GroupQueryAttention"] == 1, spans
        assert report.pass_stats("pack_qkv").changes == 0, spans
        assert _slices_of_the_product(optimized) == 3, spans
        _assert_same(model, optimized)


# --weights int4 runs before pack_qkv: the three projections are MatMulNBits by then (issue 18's builder comparison:
# the builder's int4 models quantize one packed qkv_proj; graphopt's had q, k and v as three MatMulNBits).

def _nbits(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "MatMulNBits"]


def _attrs(node: onnx.NodeProto) -> dict[str, int]:
    return {a.name: a.i for a in node.attribute}


def _unpacked(model: onnx.ModelProto, monkeypatch: pytest.MonkeyPatch, **options: object) -> onnx.ModelProto:
    """The same optimization with pack_qkv left out (the q, k, v MatMulNBits as --weights wrote them)."""
    with monkeypatch.context() as patch:
        patch.setattr("graphopt.passes.pack_qkv.pack_qkv", lambda model, **_: 0)
        optimized, report = graphopt.optimize(model, **options)
    assert report.pass_stats("pack_qkv").changes == 0
    return optimized


@pytest.mark.parametrize("symmetric", [False, True])
def test_golden_int4_q_k_v_become_one_matmulnbits(symmetric: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    model = decoder_block(mask="causal", hidden=64)
    options = {"target": "ort-cpu", "weights": "int4", "block_size": 32, "weights_symmetric": symmetric}
    optimized, report = graphopt.optimize(model, **options)
    separate = _unpacked(model, monkeypatch, **options)
    assert report.weight_quantization is not None and report.weight_quantization.quantized == 4  # q, k, v, o
    assert report.pass_stats("pack_qkv").changes == 1
    assert len(_nbits(separate)) == 4 and len(_nbits(optimized)) == 2 and _ops(optimized)["MatMul"] == 0
    [gqa] = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    assert gqa.input[1] == "" and gqa.input[2] == ""
    packed = next(n for n in optimized.graph.node if n.output[0] == gqa.input[0])
    assert packed.op_type == "MatMulNBits" and packed.domain == "com.microsoft"
    assert _attrs(packed) == {"K": 64, "N": 64 + 2 * 2 * 16, "bits": 4, "block_size": 32, "accuracy_level": 4}
    assert len(packed.input) == (3 if symmetric else 4)
    # the packed arrays are the separate ones stacked along N (q, then k, then v)
    inits = {i.name: onnx.numpy_helper.to_array(i) for g in (optimized, separate) for i in g.graph.initializer}
    by_output = {n.output[0]: n for n in _nbits(separate)}
    parts = [by_output[n.input[i]] for i in range(3) for n in separate.graph.node if n.op_type == "GroupQueryAttention"]
    for slot in range(1, len(packed.input)):
        stacked = np.concatenate([inits[p.input[slot]].reshape(_attrs(p)["N"], -1) for p in parts])
        np.testing.assert_array_equal(inits[packed.input[slot]].reshape(128, -1), stacked)
    assert {i.name for i in optimized.graph.initializer}.isdisjoint({i for p in parts for i in p.input[1:]})
    _assert_same(separate, optimized)  # the same operator: equal outputs over prefill and decode steps


def test_negative_int4_with_k_kept_in_float_is_not_packed(monkeypatch: pytest.MonkeyPatch) -> None:
    """k kept by --weights-keep: a float MatMul and two MatMulNBits are not one operator."""
    model = decoder_block(mask="causal", hidden=64)
    options = {"target": "ort-cpu", "weights": "int4", "weights_keep": ["wk"]}
    optimized, report = graphopt.optimize(model, **options)
    assert report.pass_stats("pack_qkv").changes == 0
    assert len(_nbits(optimized)) == 3 and _ops(optimized)["MatMul"] == 1
    _assert_same(_unpacked(model, monkeypatch, **options), optimized)
