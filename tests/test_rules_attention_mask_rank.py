"""Golden tests for FuseAttention with a mask of rank < 4 (rules/attention.pdll).

Added to [B, N, S, L] scores, a mask [S, L] or [N|1, S, L] broadcasts exactly as its
unsqueeze to rank 4 does (HF CLIP's TorchScript export adds a [77, 77] causal mask).
onnxruntime's attention_bias takes only [B|1, N|1, S, L], so the fused op gets the mask
unsqueezed on the left; a constant mask folds. The last two dims must still be [S, L]
exactly: the fused ops do not broadcast a mask over queries or keys.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.rule_testing import assert_same_outputs, init, optimize_with, rewrites
from tests.test_rules_attention import ATTENTION_RULES, MS, B, N, S, _feeds, attention_model

CAUSAL = np.triu(np.full((S, S), np.finfo(np.float32).min, np.float32), 1)


def _causal_feeds(model: onnx.ModelProto, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    feeds = _feeds(model)
    if "mask" in {i.name for i in model.graph.input}:
        feeds["mask"] = np.ascontiguousarray(np.broadcast_to(CAUSAL, shape))
    return feeds


def _mha_count(model: onnx.ModelProto) -> int:
    return sum(1 for n in model.graph.node if (n.domain, n.op_type) == (MS, "MultiHeadAttention"))


def _bias_of_fused_op(model: onnx.ModelProto) -> str:
    node = next(n for n in model.graph.node if n.op_type in ("MultiHeadAttention", "Attention"))
    return node.input[5] if node.domain == MS else node.input[3]


def _producer(model: onnx.ModelProto, name: str):
    return next((n for n in model.graph.node if name in n.output), None)


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
@pytest.mark.parametrize("shape", [(S, S), (1, S, S), (N, S, S)])
def test_mask_of_lower_rank_is_unsqueezed_into_the_fused_op(target: str, shape: tuple[int, ...]) -> None:
    model = attention_model(mask="add", mask_shape=shape)
    optimized, report = optimize_with(model, ATTENTION_RULES, target=target)
    assert rewrites(report, "FuseAttention") == 1
    assert _mha_count(optimized) == 1 and "Softmax" not in [n.op_type for n in optimized.graph.node]
    unsqueeze = _producer(optimized, _bias_of_fused_op(optimized))
    assert unsqueeze is not None and unsqueeze.op_type == "Unsqueeze" and list(unsqueeze.input[:1]) == ["mask"]
    axes = {i.name: i for i in optimized.graph.initializer}[unsqueeze.input[1]]
    assert onnx.numpy_helper.to_array(axes).tolist() == list(range(4 - len(shape)))
    assert_same_outputs(model, optimized, feeds=_causal_feeds(model, shape), rtol=1e-4, atol=1e-5)


def test_rank_4_mask_gets_no_unsqueeze() -> None:
    optimized, report = optimize_with(attention_model(mask="add", mask_shape=(1, 1, S, S)), ATTENTION_RULES, target="ort-cpu")
    assert rewrites(report, "FuseAttention") == 1
    assert _bias_of_fused_op(optimized) == "mask" and "Unsqueeze" not in [n.op_type for n in optimized.graph.node]


def test_below_opset_13_the_axes_are_an_attribute() -> None:
    model = attention_model(mask="add", mask_shape=(S, S), opset=12)
    optimized, report = optimize_with(model, ATTENTION_RULES, target="ort-cpu")
    assert rewrites(report, "FuseAttention") == 1
    unsqueeze = _producer(optimized, _bias_of_fused_op(optimized))
    assert unsqueeze.op_type == "Unsqueeze" and len(unsqueeze.input) == 1
    assert [list(a.ints) for a in unsqueeze.attribute if a.name == "axes"] == [[0, 1]]
    assert_same_outputs(model, optimized, feeds=_causal_feeds(model, (S, S)), rtol=1e-4, atol=1e-5)


def test_constant_causal_mask_folds_into_a_rank_4_constant() -> None:
    import graphopt

    model = attention_model(mask="add", mask_shape=(S, S))
    model.graph.input.remove(next(i for i in model.graph.input if i.name == "mask"))
    model.graph.initializer.append(init("mask", CAUSAL))
    optimized, _ = graphopt.optimize(model, target="ort-cpu")
    types = [n.op_type for n in optimized.graph.node]
    assert "Softmax" not in types and "Unsqueeze" not in types
    fused = next(n for n in optimized.graph.node if n.domain == MS and n.op_type in ("Attention", "MultiHeadAttention"))
    bias = {i.name: i for i in optimized.graph.initializer}[fused.input[5]]
    assert list(bias.dims) == [1, 1, S, S]
    assert_same_outputs(model, optimized, feeds=_feeds(model), rtol=1e-4, atol=1e-5)


def test_two_added_masks_of_lower_rank() -> None:
    # A [S, S] causal mask and a [1, S, S] bias, added one after the other: their sum [1, S, S] is unsqueezed.
    model = attention_model(mask="add", mask_shape=(S, S))
    model.graph.input.append(helper.make_tensor_value_info("mask2", TensorProto.FLOAT, [1, S, S]))
    add = next(n for n in model.graph.node if n.op_type == "Add" and "mask" in n.input)
    add.output[0] = "masked1"
    model.graph.node.insert(list(model.graph.node).index(add) + 1, helper.make_node("Add", ["masked1", "mask2"], ["masked"]))
    optimized, report = optimize_with(model, ATTENTION_RULES, target="ort-cpu")
    assert rewrites(report, "FuseAttention") == 1 and _mha_count(optimized) == 1
    unsqueeze = _producer(optimized, _bias_of_fused_op(optimized))
    assert unsqueeze.op_type == "Unsqueeze" and _producer(optimized, unsqueeze.input[0]).op_type == "Add"
    feeds = _causal_feeds(model, (S, S))
    feeds["mask2"] = np.random.default_rng(5).standard_normal((1, S, S)).astype(np.float32)
    assert_same_outputs(model, optimized, feeds=feeds, rtol=1e-4, atol=1e-5)


def test_boolean_mask_of_rank_2() -> None:
    model = attention_model(mask="keep", mask_shape=(S, S))
    optimized, report = optimize_with(model, ATTENTION_RULES, target="ort-cpu")
    assert rewrites(report, "FuseAttention") == 1
    unsqueeze = _producer(optimized, _bias_of_fused_op(optimized))
    assert unsqueeze.op_type == "Unsqueeze" and _producer(optimized, unsqueeze.input[0]).op_type == "Where"
    feeds = _feeds(model)
    feeds["keep"] = np.tril(np.ones((S, S), dtype=bool))
    assert_same_outputs(model, optimized, feeds=feeds, rtol=1e-4, atol=1e-5)


def test_standard_attention_takes_the_unsqueezed_mask_at_opset_23() -> None:
    # ONNX's attn_mask is "broadcastable to (B, N, S, L)": rank 4 is always such a shape.
    model = attention_model(mask="add", mask_shape=(S, S), opset=23)
    optimized, report = optimize_with(model, ATTENTION_RULES, target="onnx")
    assert rewrites(report, "FuseAttention") == 1
    assert [n.op_type for n in optimized.graph.node if n.domain == ""].count("Attention") == 1
    assert_same_outputs(model, optimized, feeds=_causal_feeds(model, (S, S)), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- must not fire


@pytest.mark.parametrize("shape", [(1, S), (S, 1), (B, S, 1)])
def test_mask_broadcast_over_queries_or_keys_is_a_near_miss(shape: tuple[int, ...]) -> None:
    # numpy broadcasts these over [B, N, S, S] scores, the fused ops do not: the last two dims must be [S, L].
    model = attention_model(mask="add", mask_shape=shape)
    optimized, report = optimize_with(model, ATTENTION_RULES, target="ort-cpu")
    assert rewrites(report, "FuseAttention") == 0 and _mha_count(optimized) == 0
    reasons = [m.reason for m in report.rules["FuseAttention"].near_misses]
    assert any(f"the mask has dims {list(shape)}" in r for r in reasons), reasons
    feeds = _feeds(model)
    assert_same_outputs(model, optimized, feeds=feeds, rtol=1e-4, atol=1e-5)


def test_rank_3_mask_whose_first_dim_is_not_the_heads_is_a_near_miss() -> None:
    # [3, S, S] aligned on the right puts 3 on the heads axis (N = 2): the scores would not broadcast.
    # Check the constraint alone on a graph whose shapes onnx cannot check (the Add is invalid).
    model = attention_model(mask="add", mask_shape=(3, S, S))
    _, report = optimize_with(model, ATTENTION_RULES, target="ort-cpu")
    assert rewrites(report, "FuseAttention") == 0
    reasons = [m.reason for m in report.rules["FuseAttention"].near_misses]
    assert any("the mask has dims [3, 5, 5]" in r for r in reasons), reasons


# ----------------------------------------------------------------------------- on FX graphs (the torch backend)


def test_fx_attention_with_a_rank_2_causal_mask() -> None:
    import math

    import torch
    from both_kinds import Case, run_case
    from both_kinds_cases import _ATTENTION_ALONG, _PROJECTIONS, fn

    def causal_attention(m, x):  # CLIP's text encoder: a [S, S] causal mask added to [B, N, S, S] scores
        heads = lambda t: t.reshape(2, 5, 2, 4).transpose(1, 2)  # noqa: E731
        q, k, v = heads(x @ m.wq + m.bq), heads(x @ m.wk + m.bk), heads(x @ m.wv + m.bv)
        scores = q @ k.transpose(-1, -2) / math.sqrt(4) + m.causal
        return (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(2, 5, 8)

    causal = lambda: torch.full((5, 5), torch.finfo(torch.float32).min).triu(1)  # noqa: E731
    module = fn(causal_attention, causal=causal, **_PROJECTIONS)
    outcome = run_case(Case("FuseAttention", module, lambda: (torch.randn(2, 5, 8),), 1, along=_ATTENTION_ALONG, kinds=("fx",), atol=1e-4))
    assert outcome.fx_problem is None, outcome.fx_problem
    assert outcome.fx_rewrites == 1
