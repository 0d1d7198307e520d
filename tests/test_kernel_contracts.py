"""The kernel contracts (graphopt/ops/fused_ops.py) tell an omitted optional input (None) from a given
input whose shape is unknown (UNKNOWN_SHAPE): where a contract needs a dim it refuses an unknown one
("shape of input X unknown: cannot prove ...", the near-miss's reason), an omitted optional input
still passes, a known good shape passes. And the driver's shapes: recorded, derived for a value a
rewrite just made, UNKNOWN_SHAPE where neither tells, None where omitted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphopt.ir.onnx_view import OnnxView
from graphopt.match.driver import _contract_shapes, _target_problem
from graphopt.ops.fused_ops import shared_kv_buffer
from graphopt.ops.opspec import GRAPHOPT_DOMAIN, UNKNOWN_SHAPE, is_given, known_shape
from graphopt.ops.targets import TARGETS

U = UNKNOWN_SHAPE


def _problem(target: str, op: str, attrs: dict[str, Any], shapes: Sequence[Any]) -> str:
    return TARGETS[target].contract_problem(GRAPHOPT_DOMAIN, op, attrs, shapes) or ""


def test_the_marker_is_not_an_omitted_input() -> None:
    shapes = [(2, 3), U, None]
    assert [is_given(shapes, i) for i in range(4)] == [True, True, False, False]
    assert [known_shape(shapes, i) for i in range(4)] == [(2, 3), None, None, None]


# ----------------------------------------------------------------------------- GroupNorm (ort-cuda)

GN = {"groups": 4, "activation": 1}


def test_group_norm_known_good_shape_passes() -> None:
    assert _problem("ort-cuda", "GroupNorm", GN, [(2, 32, 8, 8), (32,), (32,)]) == ""


def test_negative_group_norm_refuses_an_unknown_input_shape() -> None:
    """X of unknown rank: the kernel takes 4-D only (this passed before the marker)."""
    assert _problem("ort-cuda", "GroupNorm", GN, [U, (32,), (32,)]) == (
        "shape of input X unknown: cannot prove the 4-D input the CUDA GroupNorm kernel takes")
    assert _problem("ort-cuda", "GroupNorm", GN, [(2, 32, 8, 8), U, (32,)]).startswith("shape of input gamma unknown: cannot prove")
    assert _problem("ort-cuda", "GroupNorm", GN, [(2, 32, 8, 8), ("C",), (32,)]).startswith("shape of input gamma unknown")
    assert "4-D input, not rank 3" in _problem("ort-cuda", "GroupNorm", GN, [(2, 32, 64), (32,), (32,)])
    assert "even number of channels per group" in _problem("ort-cuda", "GroupNorm", GN, [(2, 36, 8, 8), (36,), (36,)])


# ----------------------------------------------------------------------------- BiasSplitGelu (GeGLU on ort-cuda)


def test_bias_split_gelu_known_good_shape_passes() -> None:
    assert _problem("ort-cuda", "GeGLU", {}, [(2, 64, 5120), (5120,)]) == ""
    assert _problem("ort-cuda", "GeGLU", {}, [("batch", "seq", 10240), (10240,)]) == ""  # symbolic dims it does not need


def test_negative_bias_split_gelu_refuses_unknown_shapes() -> None:
    assert _problem("ort-cuda", "GeGLU", {}, [U, (5120,)]).startswith("shape of input X unknown: cannot prove the 3-D input")
    assert _problem("ort-cuda", "GeGLU", {}, [(2, 64, "hidden"), (5120,)]).startswith("shape of input X unknown")
    assert _problem("ort-cuda", "GeGLU", {}, [(2, 64, 5120), U]).startswith("shape of input bias unknown")
    assert "not 4096" in _problem("ort-cuda", "GeGLU", {}, [(2, 64, 4096), (4096,)])
    assert "a bias of [5120], not [1, 5120]" in _problem("ort-cuda", "GeGLU", {}, [(2, 64, 5120), (1, 5120)])


# ----------------------------------------------------------------------------- GroupQueryAttention


def _gqa(head: int = 64, width: Any = 16, past: Any = 5, batch: Any = 1, seq: Any = 1, query_seqlens: bool = False,
         bias: Any = None) -> list[Any]:
    """GroupQueryAttention's input shapes: q [batch, seq, 4 * head], past [batch, 2, past, head], the caches
    [rows, width] (None: omitted, do_rotary 0), attention_bias, query_seqlens (trailing omitted inputs left out)."""
    past_kv = (batch, 2, past, head) if past is not U else U
    cache = None if width is None else (U if width is U else (9, width))
    shapes = [(batch, seq, 4 * head), U, U, past_kv, past_kv, (batch,), (), cache, cache, None, bias]
    shapes += [None] * 5 + [(batch,)] if query_seqlens else []
    while shapes and shapes[-1] is None:
        shapes.pop()
    return shapes


ROTARY = {"do_rotary": 1}


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_gqa_rotary_known_good_shapes_and_omitted_caches_pass(target: str) -> None:
    with shared_kv_buffer():
        assert _problem(target, "GroupQueryAttention", ROTARY, _gqa(width=16)) == ""
        assert _problem(target, "GroupQueryAttention", ROTARY, _gqa(width=24)) == ""  # partial: 48 of 64 dims
        # no rotary: the caches are omitted optional inputs, and unknown ones are not read
        assert _problem(target, "GroupQueryAttention", {}, _gqa(width=None)) == ""
        assert _problem(target, "GroupQueryAttention", {}, _gqa(width=U)) == ""


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_negative_gqa_rotary_refuses_unknown_cache_or_head(target: str) -> None:
    """The caches' width must be a multiple of 8 and <= head / 2: unproven where either is unknown (passed before)."""
    with shared_kv_buffer():
        assert _problem(target, "GroupQueryAttention", ROTARY, _gqa(width=U)) == (
            "shape of input cos_cache unknown: cannot prove a rotary cache width <= head / 2 (32) and a multiple of 8 (do_rotary)")
        assert _problem(target, "GroupQueryAttention", ROTARY, _gqa(width="rot")).startswith("shape of input cos_cache unknown")
        assert _problem(target, "GroupQueryAttention", ROTARY, _gqa(width=None)).startswith("shape of input cos_cache unknown")
        assert _problem(target, "GroupQueryAttention", ROTARY, _gqa(past=U)).startswith("shape of input past_key unknown")
        assert _problem(target, "GroupQueryAttention", ROTARY, _gqa(head="head")).startswith("shape of input past_key unknown")
        assert "multiple of 8, not 12" in _problem(target, "GroupQueryAttention", ROTARY, _gqa(width=12))
        mixed = _gqa(width=16)
        mixed[8] = (9, 8)
        assert "cos and sin caches of one width, not 16 and 8" in _problem(target, "GroupQueryAttention", ROTARY, mixed)


def test_cpu_gqa_batch_rule_passes_where_the_shapes_prove_it() -> None:
    """Without query_seqlens the CPU kernel runs several new tokens over a past at batch 1 only."""
    for shapes in (_gqa(batch=1, seq="seq", past="past"), _gqa(batch="b", seq=1, past="past"),
                   _gqa(batch="b", seq="seq", past=0), _gqa(batch="b", seq="seq", past="past", query_seqlens=True)):
        assert _problem("ort-cpu", "GroupQueryAttention", {}, shapes) == "", shapes
    given_unknown = _gqa(batch="b", seq="seq", past="past", query_seqlens=True)
    given_unknown[16] = U  # query_seqlens given, shape unknown: given is what counts
    assert _problem("ort-cpu", "GroupQueryAttention", {}, given_unknown) == ""


def test_negative_cpu_gqa_batch_rule_refuses_unknown_dims() -> None:
    assert _problem("ort-cpu", "GroupQueryAttention", {}, _gqa(batch="b", seq="seq", past="past")).startswith(
        "shape of input query unknown: cannot prove batch 1, one new token or no past")
    unknown_query = _gqa(query_seqlens=False)
    unknown_query[0] = U
    assert _problem("ort-cpu", "GroupQueryAttention", {}, unknown_query).startswith("shape of input query unknown")
    assert _problem("ort-cpu", "GroupQueryAttention", {}, _gqa(batch=2, seq=3, past="past")).startswith(
        "shape of input past_key unknown")
    assert "only at batch 1 (batch 2, 3 tokens, past 5)" in _problem("ort-cpu", "GroupQueryAttention", {}, _gqa(batch=2, seq=3))


def test_negative_cuda_gqa_refuses_an_attention_bias_of_unknown_shape() -> None:
    """Given is what the CUDA kernel refuses: an attention_bias of unknown shape passed before the marker."""
    with shared_kv_buffer():
        assert _problem("ort-cuda", "GroupQueryAttention", {}, _gqa(query_seqlens=False)) == ""  # omitted: passes
        assert "no attention_bias" in _problem("ort-cuda", "GroupQueryAttention", {}, _gqa(bias=U))
        assert "no attention_bias" in _problem("ort-cuda", "GroupQueryAttention", {}, _gqa(bias=(1, 1, 1, 6)))


def test_contracts_of_attributes_only_ignore_unknown_shapes() -> None:
    """FusedConv / FusedGemm (activation) and the CUDA MultiHeadAttention (kv_cache) read no shape."""
    assert _problem("ort-cpu", "FusedConv", {"activation": "Relu"}, [U, U, None, U]) == ""
    assert _problem("ort-cuda", "FusedConv", {"activation": "Relu"}, [U, U]) == ""
    assert "not Tanh" in _problem("ort-cuda", "FusedConv", {"activation": "Tanh"}, [U, U])
    assert _problem("ort-cpu", "GemmActivation", {"activation": "Relu"}, [U, U, U]) == ""
    assert _problem("ort-cuda", "MultiHeadAttention", {"num_heads": 4}, [U, U, U]) == ""


# ----------------------------------------------------------------------------- the driver's shapes


def _padded_cache_view(pad_output_shape: bool) -> tuple[OnnxView, Any]:
    """cos [seq, 8] padded by Shape(past)[2:3] rows in front (FoldRotaryIntoGroupQueryAttention's Pad),
    read by a node with an omitted input between two given ones."""
    nodes = [
        helper.make_node("Shape", ["past"], ["past_len"], start=2, end=3),
        helper.make_node("Concat", ["past_len", "zeros"], ["pads"], axis=0),
        helper.make_node("Pad", ["cos", "pads"], ["padded"]),
        helper.make_node("Identity", ["opaque_in"], ["opaque"]),
        helper.make_node("Reader", ["cos", "", "padded", "opaque", ""], ["y"], domain="test"),  # reads the values
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("cos", TensorProto.FLOAT, ["seq", 8]),
         helper.make_tensor_value_info("past", TensorProto.FLOAT, ["batch", 2, "past", 16]),
         helper.make_tensor_value_info("opaque_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.zeros(3, np.int64), "zeros")],
        value_info=[helper.make_tensor_value_info("padded", TensorProto.FLOAT, [None, 8])] if pad_output_shape else [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("test", 1)])
    view = OnnxView(ir.serde.deserialize_model(model))
    [reader] = [n for n in view.nodes(view.scopes()[0]) if n.op_type == "Reader"]
    return view, reader


def test_driver_shapes_recorded_derived_unknown_and_omitted() -> None:
    view, reader = _padded_cache_view(pad_output_shape=False)
    # cos as recorded; the omitted input None; the Pad's output (no shape recorded) derived: rows past + seq
    # (symbolic: unknown), width 8; Identity of a value of unknown shape: UNKNOWN_SHAPE; trailing omitted left out
    assert _contract_shapes(view, reader) == [("seq", 8), None, (None, 8), UNKNOWN_SHAPE]
    view, reader = _padded_cache_view(pad_output_shape=True)
    assert _contract_shapes(view, reader)[2] == (None, 8)


def _gqa_node_view(cos_shape: list[Any] | None) -> tuple[OnnxView, Any]:
    """One graphopt.GroupQueryAttention (do_rotary 1, heads of 16) over graph inputs; the caches of `cos_shape`
    (None: recorded with no shape, as a value a rewrite made whose dims nothing derives)."""
    f = TensorProto.FLOAT
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total", "cos", "sin", "", "", "", "", "", "", "", "qsl"]
    shapes = {"query": ["b", "s", 64], "key": ["b", "s", 32], "value": ["b", "s", 32], "past_key": ["b", 2, "p", 16],
              "past_value": ["b", 2, "p", 16], "seqlens_k": ["b"], "total": [], "cos": cos_shape, "sin": cos_shape, "qsl": ["b"]}
    ints = {"seqlens_k", "total", "qsl"}
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32 if n in ints else f, shapes[n]) for n in names if n]
    node = helper.make_node("GroupQueryAttention", names, ["out", "present_key", "present_value"], domain=GRAPHOPT_DOMAIN,
                            num_heads=4, kv_num_heads=2, do_rotary=1)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("out", f, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(GRAPHOPT_DOMAIN, 1)])
    view = OnnxView(ir.serde.deserialize_model(model))
    return view, view.nodes(view.scopes()[0])[0]


def test_driver_turns_an_unknown_cache_into_the_rewrites_reason() -> None:
    """What the near-miss says: the driver's target check of an emitted GroupQueryAttention with do_rotary."""
    view, node = _gqa_node_view(cos_shape=None)
    assert _target_problem(view, TARGETS["ort-cpu"], [node]) == (
        "shape of input cos_cache unknown: cannot prove a rotary cache width <= head / 2 (8) and a multiple of 8 (do_rotary)")
    view, node = _gqa_node_view(cos_shape=["rows", 8])
    assert _target_problem(view, TARGETS["ort-cpu"], [node]) is None
    view, node = _gqa_node_view(cos_shape=["rows", 4])
    assert "multiple of 8, not 4" in (_target_problem(view, TARGETS["ort-cpu"], [node]) or "")
