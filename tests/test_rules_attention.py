"""Golden tests for the attention fusion (rules/attention.pdll) and the
reshape/transpose canonicalization it relies on (rules/canonical.pdll).

Hand-built graphs cover the variants exporters write: scale on q and k, on the
scores, as Mul or Div; additive, Where(keep, ...) and Where(drop, ...) masks;
the TorchScript IsNaN guard; the key transposed directly or through dynamo's
flatten/transpose/unflatten chain. Exported tiny BERT / GPT-2 models check the
counts end to end.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.models import bert_tiny, example_inputs, gpt2_tiny
from tests.rule_testing import assert_same_outputs, init, make_model, optimize_with, rand, rewrites

B, S, N, H = 2, 5, 2, 4
D = N * H
MS = "com.microsoft"
ATTENTION_RULES = [
    "FuseAttention", "ComposeTransposes", "DropIdentityTranspose", "CollapseReshapes", "DropNoOpReshape",
    "UnflattenBatchedTranspose",
]


def _c(name: str, values, dtype=np.int64) -> onnx.TensorProto:
    return init(name, np.asarray(values, dtype=dtype))


def attention_model(
    *,
    scale: str = "qk",  # "qk": Mul on q and k (torch SDPA export); "div": Div on the scores; "mul": Mul on the scores; "none"
    mask: str = "add",  # "add", "keep", "drop", "none"
    guard: bool = False,
    fill: float = float(np.finfo(np.float32).min),
    key: str = "direct",  # "direct": Transpose(Reshape(k), [0,2,3,1]); "swap": Transpose(k4, [0,1,3,2]); "flat": dynamo's chain
    softmax_axis: int = -1,
    kv_heads: int = N,
    guard_value: float = 0.0,
    mask_shape: tuple[int, ...] = (B, 1, S, S),
    opset: int = 17,
) -> onnx.ModelProto:
    """x [B, S, D] -> q/k/v projections -> scaled dot-product attention -> [B, S, D]."""
    nodes, inits = [], [_c("to4", [0, 0, N, H]), _c("to4kv", [0, 0, kv_heads, H]), _c("to3", [0, 0, D])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, D])]
    kv_dim = kv_heads * H
    for name, width in (("q", D), ("k", kv_dim), ("v", kv_dim)):
        inits += [init(f"w{name}", rand(D, width)), init(f"b{name}", rand(width))]
        nodes += [
            helper.make_node("MatMul", ["x", f"w{name}"], [f"{name}_mm"]),
            helper.make_node("Add", [f"{name}_mm", f"b{name}"], [f"{name}_lin"]),
            helper.make_node("Reshape", [f"{name}_lin", "to4" if name == "q" else "to4kv"], [f"{name}_4"]),
        ]
    nodes.append(helper.make_node("Transpose", ["q_4"], ["q"], perm=[0, 2, 1, 3]))
    nodes.append(helper.make_node("Transpose", ["v_4"], ["v"], perm=[0, 2, 1, 3]))
    if key == "direct":
        nodes.append(helper.make_node("Transpose", ["k_4"], ["kt"], perm=[0, 2, 3, 1]))
    else:
        nodes.append(helper.make_node("Transpose", ["k_4"], ["k"], perm=[0, 2, 1, 3]))
        if key == "swap":
            nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]))
        else:  # dynamo: Reshape(k, [-1, S, H]) -> Transpose [0, 2, 1] -> Reshape(., [B, N, H, S])
            inits += [_c("flat", [-1, S, H]), _c("unflat", [B, kv_heads, H, S])]
            nodes += [
                helper.make_node("Reshape", ["k", "flat"], ["k_flat"]),
                helper.make_node("Transpose", ["k_flat"], ["kt_flat"], perm=[0, 2, 1]),
                helper.make_node("Reshape", ["kt_flat", "unflat"], ["kt"]),
            ]
    q, kt = "q", "kt"
    root_scale = float(1 / np.sqrt(H))
    if scale == "qk":
        inits.append(init("sqrt_scale", np.asarray(np.sqrt(root_scale), np.float32)))
        nodes += [helper.make_node("Mul", ["q", "sqrt_scale"], ["q_s"]), helper.make_node("Mul", ["kt", "sqrt_scale"], ["kt_s"])]
        q, kt = "q_s", "kt_s"
    nodes.append(helper.make_node("MatMul", [q, kt], ["scores"]))
    scores = "scores"
    if scale in ("div", "mul"):
        value = np.sqrt(H) if scale == "div" else root_scale
        inits.append(init("score_scale", np.asarray(value, np.float32)))
        nodes.append(helper.make_node("Div" if scale == "div" else "Mul", ["scores", "score_scale"], ["scores_s"]))
        scores = "scores_s"
    if mask == "add":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, list(mask_shape)))
        nodes.append(helper.make_node("Add", [scores, "mask"], ["masked"]))
        scores = "masked"
    elif mask in ("keep", "drop"):
        inputs.append(helper.make_tensor_value_info("keep", TensorProto.BOOL, list(mask_shape)))
        inits.append(init("fill", np.asarray(fill, np.float32)))
        args = ["keep", scores, "fill"] if mask == "keep" else ["keep", "fill", scores]
        nodes.append(helper.make_node("Where", args, ["masked"]))
        scores = "masked"
    nodes.append(helper.make_node("Softmax", [scores], ["probs"], axis=softmax_axis))
    probs = "probs"
    if guard:
        inits.append(init("zero", np.asarray([guard_value], np.float32)))
        nodes += [
            helper.make_node("IsNaN", ["probs"], ["nan"]),
            helper.make_node("Where", ["nan", "zero", "probs"], ["probs_g"]),
        ]
        probs = "probs_g"
    if kv_heads != N:  # grouped-query without repeated k/v: not fusable, but a valid model needs matching heads
        raise ValueError("use kv_heads only with the negative test below")
    nodes += [
        helper.make_node("MatMul", [probs, "v"], ["attn"]),
        helper.make_node("Transpose", ["attn"], ["attn_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["attn_t", "to3"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, D])]
    model = make_model(nodes, inputs, outputs, inits, opset=opset)
    if opset >= 23:
        model.ir_version = 10
    return model


def _feeds(model: onnx.ModelProto, fully_masked_row: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    feeds = {"x": rng.standard_normal((B, S, D)).astype(np.float32)}
    names = {i.name: i for i in model.graph.input}
    keep = np.ones((B, 1, S, S), dtype=bool)
    keep[1, :, :, S - 2:] = False  # padding: the last two keys of the second sample
    if fully_masked_row:
        keep[0, :, 1, :] = False  # query 1 of the first sample sees no key
    if "mask" in names:
        shape = [d.dim_value for d in names["mask"].type.tensor_type.shape.dim]
        fill = -np.inf if fully_masked_row else np.finfo(np.float32).min
        feeds["mask"] = np.broadcast_to(np.where(keep, 0.0, fill), (B, 1, S, S)).reshape(shape).astype(np.float32) if shape == [B, 1, S, S] else rng.standard_normal(shape).astype(np.float32)
    if "keep" in names:
        feeds["keep"] = keep
    return feeds


def _ops(model: onnx.ModelProto) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in model.graph.node]


def _fused(model: onnx.ModelProto, target: str = "ort-cpu"):
    return optimize_with(model, ATTENTION_RULES, target=target)


def _check_same(model, optimized, fully_masked_row: bool = False) -> None:
    feeds = _feeds(model, fully_masked_row)
    assert_same_outputs(model, optimized, feeds=feeds, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("scale", ["qk", "div", "mul", "none"])
@pytest.mark.parametrize("mask", ["add", "keep", "drop", "none"])
def test_attention_variants_fuse_into_one_op(scale: str, mask: str) -> None:
    model = attention_model(scale=scale, mask=mask)
    optimized, report = _fused(model)
    assert rewrites(report, "FuseAttention") == 1
    ops = _ops(optimized)
    assert (MS, "MultiHeadAttention") in ops
    # Only the projections and the fused op remain: every Transpose/Reshape of the layout is gone.
    assert [op for _, op in ops if op in ("Transpose", "Reshape", "Softmax")] == []
    where = 1 if mask in ("keep", "drop") else 0  # the boolean mask becomes an additive one
    assert len(optimized.graph.node) == 6 + 1 + where
    mha = next(n for n in optimized.graph.node if n.op_type == "MultiHeadAttention")
    attrs = {a.name: helper.get_attribute_value(a) for a in mha.attribute}
    assert attrs["num_heads"] == N
    expected = 1.0 if scale == "none" else 1 / np.sqrt(H)
    assert attrs["scale"] == pytest.approx(expected, rel=1e-6)
    _check_same(model, optimized)


def test_self_attention_without_a_cache_still_fuses_on_ort_cuda() -> None:
    """The ort-cuda guard against a growing KV cache (test_rules_gqa.py) leaves other attention
    alone: k and v are projections of the input, not a Concat of a graph input."""
    model = attention_model(mask="add")
    optimized, report = _fused(model, target="ort-cuda")
    assert rewrites(report, "FuseAttention") == 1
    [mha] = [n for n in optimized.graph.node if n.op_type == "MultiHeadAttention"]
    assert "kv_cache" not in {a.name for a in mha.attribute}
    misses = [m.reason for m in report.rules["FuseAttention"].near_misses]
    assert not [r for r in misses if "KV cache" in r], misses


@pytest.mark.parametrize("key", ["direct", "swap", "flat"])
def test_key_layouts(key: str) -> None:
    model = attention_model(key=key)
    optimized, report = _fused(model)
    assert rewrites(report, "FuseAttention") == 1
    assert not [n for n in optimized.graph.node if n.op_type in ("Transpose", "Reshape")]
    _check_same(model, optimized)


def test_nan_guard_goes_when_the_mask_is_finite() -> None:
    model = attention_model(mask="keep", guard=True)  # fill = finfo.min
    optimized, report = _fused(model)
    assert rewrites(report, "FuseAttention") == 1
    assert "IsNaN" not in [n.op_type for n in optimized.graph.node]
    _check_same(model, optimized)


def test_nan_guard_stays_on_the_output_when_the_mask_can_be_minus_inf() -> None:
    model = attention_model(mask="add", guard=True)  # the mask is a graph input: it may hold -inf
    optimized, report = _fused(model)
    assert rewrites(report, "FuseAttention") == 1
    types = [n.op_type for n in optimized.graph.node]
    assert "IsNaN" in types and "MultiHeadAttention" in types
    # A query that sees no key: NaN inside the fused op, 0 after the guard, as in the original.
    feeds = _feeds(model, fully_masked_row=True)
    from tests.rule_testing import run

    (before,), (after,) = run(model, feeds), run(optimized, feeds)
    assert np.all(before[0, 1] == 0) and not np.isnan(after).any()
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-5)


def test_where_fill_minus_inf_keeps_the_guard() -> None:
    model = attention_model(mask="keep", guard=True, fill=-np.inf)
    optimized, report = _fused(model)
    assert rewrites(report, "FuseAttention") == 1
    assert "IsNaN" in [n.op_type for n in optimized.graph.node]
    _check_same(model, optimized, fully_masked_row=True)


def test_standard_attention_on_onnx_target_at_opset_23() -> None:
    model = attention_model(opset=23)
    optimized, report = _fused(model, target="onnx")
    assert rewrites(report, "FuseAttention") == 1
    att = [n for n in optimized.graph.node if n.op_type == "Attention"]
    assert len(att) == 1 and att[0].domain == ""
    attrs = {a.name: helper.get_attribute_value(a) for a in att[0].attribute}
    assert attrs["q_num_heads"] == attrs["kv_num_heads"] == N
    _check_same(model, optimized)


def test_packed_projections_become_com_microsoft_attention() -> None:
    model = attention_model(mask="add")
    optimized, report = optimize_with(model, [*ATTENTION_RULES, "PackAttentionProjections"], target="ort-cpu")
    assert rewrites(report, "PackAttentionProjections") == 1
    assert _ops(optimized) == [(MS, "Attention")]
    weights = {i.name: i for i in optimized.graph.initializer}[optimized.graph.node[0].input[1]]
    assert list(weights.dims) == [D, 3 * D]
    _check_same(model, optimized)


def test_cross_attention_is_not_packed() -> None:
    model = attention_model(mask="none")
    # k and v project another input: not self-attention, so the weights cannot be packed.
    model.graph.input.append(helper.make_tensor_value_info("mem", TensorProto.FLOAT, [B, S, D]))
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in ("wk", "wv"):
            node.input[0] = "mem"
    optimized, report = optimize_with(model, [*ATTENTION_RULES, "PackAttentionProjections"], target="ort-cpu")
    assert rewrites(report, "FuseAttention") == 1 and rewrites(report, "PackAttentionProjections") == 0
    assert (MS, "MultiHeadAttention") in _ops(optimized)
    from tests.rule_testing import run

    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((B, S, D)).astype(np.float32), "mem": rng.standard_normal((B, S, D)).astype(np.float32)}
    np.testing.assert_allclose(run(optimized, feeds)[0], run(model, feeds)[0], rtol=1e-4, atol=1e-5)


def test_packed_projection_rules_do_not_apply_on_plain_onnx() -> None:
    optimized, report = optimize_with(attention_model(opset=23), [*ATTENTION_RULES, "PackAttentionProjections"], target="onnx")
    assert rewrites(report, "FuseAttention") == 1 and rewrites(report, "PackAttentionProjections") == 0
    assert [n.op_type for n in optimized.graph.node].count("Attention") == 1


# ----------------------------------------------------------------------------- must not fire


def test_not_fused_on_onnx_target_below_opset_23() -> None:
    optimized, report = _fused(attention_model(), target="onnx")
    assert rewrites(report, "FuseAttention") == 0
    assert "Softmax" in [n.op_type for n in optimized.graph.node]
    assert any("Attention" in m.reason for m in report.rules["FuseAttention"].near_misses)


def test_softmax_over_another_axis_is_not_attention() -> None:
    model = attention_model(softmax_axis=2)
    optimized, report = _fused(model)
    assert rewrites(report, "FuseAttention") == 0
    assert any("axis 2" in m.reason for m in report.rules["FuseAttention"].near_misses)
    _check_same(model, optimized)


def test_nonzero_guard_value_is_not_dropped() -> None:
    model = attention_model(mask="keep", guard=True, guard_value=0.5)
    optimized, report = _fused(model)
    assert rewrites(report, "FuseAttention") == 0
    _check_same(model, optimized)


def test_mask_that_broadcasts_over_queries_is_a_near_miss() -> None:
    model = attention_model(mask="add", mask_shape=(B, 1, 1, S))
    optimized, report = _fused(model)
    assert rewrites(report, "FuseAttention") == 0
    reasons = [m.reason for m in report.rules["FuseAttention"].near_misses]
    assert any("the mask has dims" in r for r in reasons), reasons
    _check_same(model, optimized)


def test_grouped_query_without_repeated_kv_is_a_near_miss() -> None:
    # q has 2 heads, k and v one: MatMul broadcasts the head axis. Not fused (yet), and the report says why.
    nodes = [
        helper.make_node("Transpose", ["kk"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vv"], ["y"]),
    ]
    model = make_model(
        nodes,
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, [B, N, S, H]),
         helper.make_tensor_value_info("kk", TensorProto.FLOAT, [B, 1, S, H]),
         helper.make_tensor_value_info("vv", TensorProto.FLOAT, [B, 1, S, H])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, N, S, H])],
    )
    optimized, report = _fused(model)
    assert rewrites(report, "FuseAttention") == 0
    reasons = [m.reason for m in report.rules["FuseAttention"].near_misses]
    assert any("grouped-query" in r for r in reasons), reasons


def test_scores_with_a_second_user_are_not_fused() -> None:
    model = attention_model(scale="none", mask="none")
    model.graph.output.append(helper.make_tensor_value_info("scores", TensorProto.FLOAT, [B, N, S, S]))
    optimized, report = _fused(model)
    assert rewrites(report, "FuseAttention") == 0
    _check_same(model, optimized)


# ----------------------------------------------------------------------------- exported models


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_exported_models_fuse_every_attention(family: str, exporter: str) -> None:
    import onnxruntime as ort

    import graphopt

    path = (bert_tiny if family == "bert" else gpt2_tiny)(exporter)
    model = onnx.load(str(path))
    optimized, report = graphopt.optimize(model, target="ort-cpu")
    ops = [n.op_type for n in optimized.graph.node]
    # q, k, v projections of one input are packed: com.microsoft.Attention, one GEMM per layer.
    packing = "PackAttentionProjections" if family == "bert" else "PackedProjectionAttention"
    assert rewrites(report, "FuseAttention") == 2 and rewrites(report, packing) == 2
    assert ops.count("Attention") == 2 and "MultiHeadAttention" not in ops
    assert "Softmax" not in ops and "Transpose" not in ops
    feeds = example_inputs(path, batch=2)  # the second sample pads its last quarter
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(optimized.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4)


def test_a_mask_that_masks_nothing_is_left_out() -> None:
    # dynamo's ViT export: Where(Expand(all-true constant), 0, min) added to the scores.
    model = attention_model(mask="none")
    graph = model.graph
    graph.initializer.extend([init("all_true", np.ones((1, 1, S, 1), dtype=bool)), _c("mask_shape", [B, 1, S, S]),
                              init("z", np.asarray(0.0, np.float32)), init("lowest", np.asarray(np.finfo(np.float32).min, np.float32))])
    softmax = next(n for n in graph.node if n.op_type == "Softmax")
    scores = softmax.input[0]
    extra = [
        helper.make_node("Expand", ["all_true", "mask_shape"], ["keep_all"]),
        helper.make_node("Where", ["keep_all", "z", "lowest"], ["noop_mask"]),
        helper.make_node("Add", [scores, "noop_mask"], ["masked_noop"]),
    ]
    index = list(graph.node).index(softmax)
    for offset, node in enumerate(extra):
        graph.node.insert(index + offset, node)
    softmax.input[0] = "masked_noop"
    optimized, report = _fused(model)
    assert rewrites(report, "FuseAttention") == 1
    mha = next(n for n in optimized.graph.node if n.op_type == "MultiHeadAttention")
    assert len(mha.input) == 3  # no attention_bias
    assert not [n for n in optimized.graph.node if n.op_type in ("Where", "Expand")]
    _check_same(model, optimized)


def test_keys_shared_across_the_batch_are_not_fused() -> None:
    # MatMul broadcasts a batch-1 key over the queries' batch; the fused ops do not.
    nodes = [
        helper.make_node("Transpose", ["kk"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vv"], ["y"]),
    ]
    model = make_model(
        nodes,
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, [B, N, S, H]),
         helper.make_tensor_value_info("kk", TensorProto.FLOAT, [1, N, S, H]),
         helper.make_tensor_value_info("vv", TensorProto.FLOAT, [1, N, S, H])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, N, S, H])],
    )
    optimized, report = _fused(model)
    assert rewrites(report, "FuseAttention") == 0
    assert any("batch sizes" in m.reason for m in report.rules["FuseAttention"].near_misses)


# ----------------------------------------------------------------------------- on FX graphs (the torch backend)
# graphopt.Attention runs on torch as one addmm of the packed weights, its thirds as q, k and v,
# and graphopt::attention. The positive cases, on both kinds: tests/both_kinds_cases.py.


def _fx_case(rule: str, module, count: int):
    import torch
    from both_kinds import Case, run_case
    from both_kinds_cases import _ATTENTION_ALONG

    outcome = run_case(Case(rule, module, lambda: (torch.randn(2, 5, 8),), count, along=_ATTENTION_ALONG, kinds=("fx",), atol=1e-4))
    assert outcome.fx_problem is None, outcome.fx_problem
    return outcome


def test_fx_cross_attention_projections_are_not_packed() -> None:
    import torch
    from both_kinds_cases import _PROJECTIONS, _attention, fn

    def cross(m, x):  # k and v project a function of x, not x itself
        mem = torch.tanh(x)
        heads = lambda t: t.reshape(2, 5, 2, 4).transpose(1, 2)  # noqa: E731
        o = _attention(m, heads(x @ m.wq + m.bq), heads(mem @ m.wk + m.bk), heads(mem @ m.wv + m.bv))
        return o.transpose(1, 2).reshape(2, 5, 8)

    assert _fx_case("FuseAttention", fn(cross, **_PROJECTIONS), 1).fx_rewrites == 1
    assert _fx_case("PackAttentionProjections", fn(cross, **_PROJECTIONS), 0).fx_rewrites == 0


def test_packed_attention_compiles_to_one_addmm_and_the_attention_op() -> None:
    import torch
    from both_kinds_cases import _PROJECTIONS, _self_attention, fn

    import graphopt
    import graphopt.kernels  # noqa: F401
    from graphopt.torch_backend import last_graph

    torch.manual_seed(0)
    model = fn(_self_attention, **_PROJECTIONS)().eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt", options={"inductor": False})(x)
        torch.testing.assert_close(got, model(x), atol=1e-4, rtol=1e-4)
    assert graphopt.last_report().rules["PackAttentionProjections"].applications == 1
    targets = [n.target for n in last_graph().graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.aten.addmm.default) == 1 and torch.ops.aten.mm.default not in targets
    assert targets.count(torch.ops.graphopt.attention.default) == 1


def test_fx_packed_projection_whose_thirds_are_not_q_k_v_is_not_attention() -> None:
    import torch
    from both_kinds_cases import _attention, const, fn

    def keys_as_values(m, x):  # the second third serves as keys and values: no packed q/k/v
        qkv = torch.addmm(m.b, x.reshape(-1, 8), m.w).reshape(2, 5, 24)
        q, k, _ = qkv.split(8, dim=2)
        heads = lambda t: t.reshape(2, 5, 2, 4).transpose(1, 2)  # noqa: E731
        return _attention(m, heads(q), heads(k), heads(k)).transpose(1, 2).reshape(2, 5, 8)

    module = fn(keys_as_values, w=const(8, 24), b=const(24))
    assert _fx_case("FuseAttention", module, 1).fx_rewrites == 1
    assert _fx_case("PackedProjectionAttention", module, 0).fx_rewrites == 0
