"""Golden tests for gqa.pdll: attention over Concat(past, new) k / v (repeat_kv or none) ->
graphopt.GroupQueryAttention (com.microsoft.GroupQueryAttention on onnxruntime), on the
decoder block of tests/llm_decoders.py and on a real dynamo export of a tiny LLaMA with a
KV cache; negative cases with the reasons the rule gives."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from llm_decoders import decoder_block, feeds
from rule_testing import run

import graphopt
from graphopt.ops.fused_ops import shared_kv_buffer
from graphopt.ops.opspec import GRAPHOPT_DOMAIN, UNKNOWN_SHAPE
from graphopt.ops.targets import TARGETS

RULE = "FuseGroupQueryAttention"
GQA = "com.microsoft.GroupQueryAttention"
# prefill (empty past), decode steps (with and without left padding in the past), several new
# tokens over a past at batch 1 and at batch 2 (onnxruntime needs query_seqlens for that)
STEPS = [(2, 5, 0, 0), (2, 1, 7, 0), (2, 1, 7, 3), (1, 4, 3, 0), (2, 4, 3, 2)]


def _ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(f"{n.domain}.{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


def _optimize(model: onnx.ModelProto, target: str = "ort-cpu", **kwargs):
    return graphopt.optimize(model, target=target, **kwargs)


def _assert_steps_equal(original: onnx.ModelProto, optimized: onnx.ModelProto, steps=STEPS, atol: float = 1e-5) -> None:
    for batch, seq, past, pad in steps:
        inputs = feeds(original, batch, seq, past, pad)
        names = {i.name for i in original.graph.input}
        inputs = {k: v for k, v in inputs.items() if k in names}
        expected, actual = run(original, inputs), run(optimized, inputs)
        for name, e, a in zip(["out", "present_key", "present_value"], expected, actual, strict=True):
            assert a.shape == e.shape, (batch, seq, past, name)
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=atol, err_msg=f"{name} at batch {batch}, seq {seq}, past {past}, pad {pad}")


def _near_miss(report) -> str:
    misses = report.rules[RULE].near_misses if RULE in report.rules else []
    return misses[0].reason if misses else ""


def test_golden_the_cached_attention_becomes_one_group_query_attention() -> None:
    model = decoder_block()
    optimized, report = _optimize(model)
    assert report.rules[RULE].applications == 1
    ops = _ops(optimized)
    assert ops[GQA] == 1
    assert ops["com.microsoft.MultiHeadAttention"] == 0 and ops["Softmax"] == 0 and ops["Tile"] == 0
    # the repeats are gone: nothing reads the presents (graph outputs only)
    assert not [n.op_type for n in optimized.graph.node if {"present_key", "present_value"} & set(n.input)]
    # 76 nodes -> 56: the repeats, the k^T chain, scores, Softmax, rotary's 14 ops (2 RotaryEmbedding)
    # go; the seqlens_k / total / query_seqlens arithmetic (9 small int ops) comes; reshape targets
    # computed from the batch become constants with 0 / -1 (ConstantReshapeTarget), one Concat less
    assert (len(model.graph.node), len(optimized.graph.node)) == (76, 56)
    [node] = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["num_heads"], attrs["kv_num_heads"]) == (4, 2) and "causal" not in attrs  # the default, 1
    assert attrs["scale"] == pytest.approx(8 ** -0.5)
    assert node.input[3:5] == ["past_key", "past_value"] and node.input[10] == "bias"  # the padding mask stays, as attention_bias
    assert len(node.input) == 17 and node.input[16]  # query_seqlens: batched chunks over a past run
    assert list(node.output[1:]) == ["present_key", "present_value"]  # the presents come from the op
    _assert_steps_equal(model, optimized)


def test_a_left_padded_prompt_differs_only_in_rows_that_see_no_key() -> None:
    """Rows 0 and 1 of the padded sequence are padding: every key they could see is masked. The
    original gives them the mean of all values, GroupQueryAttention the mean of their causal
    prefix; no other row reads them (they are masked keys). Everything else is equal."""
    model = decoder_block()
    optimized, _ = _optimize(model)
    inputs = feeds(model, 2, 5, 0, left_pad=2)
    expected, actual = run(model, inputs), run(optimized, inputs)
    visible = np.ones((2, 5), bool)
    visible[1, :2] = False
    np.testing.assert_allclose(actual[0][visible], expected[0][visible], rtol=1e-5, atol=1e-5)
    assert not np.allclose(actual[0][~visible], expected[0][~visible], atol=1e-3)  # the documented difference
    for e, a in zip(expected[1:], actual[1:]):
        np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-6)


def test_a_causal_only_mask_goes_away() -> None:
    """A mask that is only kv_pos <= q_pos is GroupQueryAttention's causal = 1: no attention_bias."""
    model = decoder_block(mask="causal")
    optimized, report = _optimize(model)
    assert report.rules[RULE].applications == 1
    ops = _ops(optimized)
    assert ops[GQA] == 1 and ops["Where"] == 0 and ops["LessOrEqual"] == 0
    [node] = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(node.input) == 17 and node.input[10] == ""  # attention_bias omitted; query_seqlens given
    _assert_steps_equal(model, optimized, STEPS + [(2, 5, 0, 2)])  # no padding: every row equal


def test_multi_head_attention_over_a_cache_has_no_repeat() -> None:
    model = decoder_block(heads=4, kv_heads=4, repeat="none")
    optimized, report = _optimize(model)
    assert report.rules[RULE].applications == 1
    [node] = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["num_heads"], attrs["kv_num_heads"]) == (4, 4)
    _assert_steps_equal(model, optimized)


def test_without_rotary_the_projections_feed_the_op_directly() -> None:
    model = decoder_block(rotary=False, heads=8, kv_heads=2, hidden=64)
    optimized, report = _optimize(model)
    assert report.rules[RULE].applications == 1
    [node] = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["num_heads"], attrs["kv_num_heads"]) == (8, 2)
    assert _ops(optimized)["Transpose"] == 0  # q, k, v go in as [batch, seq, heads * head]
    _assert_steps_equal(model, optimized)


def test_golden_rotary_goes_into_the_op() -> None:
    """q and k rotated by one cos / sin pair: do_rotary = 1, the exported caches padded by `past`
    rows so that the op reads them at absolute positions; no RotaryEmbedding, no Transpose left."""
    model = decoder_block(hidden=64)  # head 16: the CPU kernel rotates multiples of 16
    optimized, report = _optimize(model)
    assert report.rules[RULE].applications == 1
    assert report.rules["FoldRotaryIntoGroupQueryAttention"].applications == 1
    ops = _ops(optimized)
    assert ops[GQA] == 1 and ops["com.microsoft.RotaryEmbedding"] == 0 and ops["Transpose"] == 0 and ops["Pad"] == 2
    [node] = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert (attrs["do_rotary"], attrs["rotary_interleaved"]) == (1, 0)
    # the rotary ops and the q, k layout changes go; the padded caches come; q, k, v one packed MatMul (pack_qkv)
    assert (len(model.graph.node), len(optimized.graph.node)) == (76, 47)
    _assert_steps_equal(model, optimized)


def test_rotary_stays_outside_where_the_cpu_kernel_cannot_rotate() -> None:
    model = decoder_block()  # head 8
    optimized, report = _optimize(model)
    assert report.rules[RULE].applications == 1
    assert report.rules["FoldRotaryIntoGroupQueryAttention"].applications == 0
    reasons = [m.reason for m in report.rules["FoldRotaryIntoGroupQueryAttention"].near_misses]
    assert any("multiple of 16 only, not 8" in r for r in reasons), reasons
    assert _ops(optimized)["com.microsoft.RotaryEmbedding"] == 2


# ----------------------------------------------------------------------------- targets


def test_target_onnx_keeps_the_attention_as_it_is() -> None:
    model = decoder_block()
    optimized, report = _optimize(model, target="onnx")
    assert report.rules.get(RULE) is None or report.rules[RULE].applications == 0
    assert _ops(optimized)[GQA] == 0
    _assert_steps_equal(model, optimized)


GROWS = "onnxruntime's CUDA attention over a KV cache that grows each call (Concat of past and new) rebuilds its plan every step"


def _attention_misses(report) -> list[str]:
    return [m.reason for m in report.rules["FuseAttention"].near_misses] if "FuseAttention" in report.rules else []


@pytest.mark.parametrize("mask", ["causal", "padding"])
@pytest.mark.parametrize("precision", [None, "fp16"])
def test_ort_cuda_leaves_attention_over_a_growing_cache_unfused(mask: str, precision: str | None) -> None:
    """On onnxruntime's CUDA provider attention over Concat(past input, new) k / v rebuilds its plan
    every step fused (40.6 ms/step GroupQueryAttention, 78.9 MultiHeadAttention, 2.28 unfused on an
    H100): neither GroupQueryAttention nor MultiHeadAttention there, and FuseAttention says why."""
    model = decoder_block(mask=mask, hidden=64)
    kwargs = {"precision": precision} if precision else {}
    optimized, report = _optimize(model, target="ort-cuda", **kwargs)
    ops = _ops(optimized)
    assert ops[GQA] == 0 and ops["com.microsoft.MultiHeadAttention"] == 0 and ops["com.microsoft.Attention"] == 0
    assert ops["Softmax"] == 1  # the attention as exported
    reasons = _attention_misses(report)
    assert any(r.startswith(GROWS) and "40.6 ms/step against 2.28 unfused" in r and "fixed-size KV buffer" in r for r in reasons), reasons
    assert report.rules.get(RULE) is None or report.rules[RULE].applications == 0
    # ort-cpu keeps fusing the same model (no loss measured there)
    on_cpu, _ = _optimize(model, target="ort-cpu", **kwargs)
    assert _ops(on_cpu)[GQA] + _ops(on_cpu)["com.microsoft.MultiHeadAttention"] == 1


def test_float16_group_query_attention_on_ort_cpu() -> None:
    """onnxruntime's CPU provider has float16 GroupQueryAttention: the numbers, in float16 (without
    query_seqlens the CPU kernel refuses several new tokens over a past at batch 2, so it is given)."""
    model = decoder_block(mask="causal", hidden=64)
    optimized, report = _optimize(model, target="ort-cpu", precision="fp16")
    assert report.rules[RULE].applications == 1
    assert _ops(optimized)[GQA] == 1 and _ops(optimized)["Softmax"] == 0
    _assert_steps_equal(model, optimized, atol=5e-3)


def test_ort_cuda_contract_refuses_group_query_attention() -> None:
    """GroupQueryAttention grows its cache by construction (present = Concat(past, new)): its
    ort-cuda contract refuses it with the measured reason, after the inputs the kernels refuse."""
    cuda, cpu = TARGETS["ort-cuda"], TARGETS["ort-cpu"]
    shapes = [[1, 1, 64]] * 7
    assert (cuda.contract_problem(GRAPHOPT_DOMAIN, "GroupQueryAttention", {}, shapes) or "").startswith(GROWS)
    assert "no attention_bias" in (cuda.contract_problem(GRAPHOPT_DOMAIN, "GroupQueryAttention", {}, [*shapes, None, None, None, [1, 1, 1, 5]]) or "")
    assert cpu.contract_problem(GRAPHOPT_DOMAIN, "GroupQueryAttention", {}, shapes) is None
    # MultiHeadAttention: refused on ort-cuda only where FuseAttention marked a growing cache
    assert (cuda.contract_problem(GRAPHOPT_DOMAIN, "MultiHeadAttention", {"num_heads": 4, "kv_cache": 1}, []) or "").startswith(GROWS)
    assert cuda.contract_problem(GRAPHOPT_DOMAIN, "MultiHeadAttention", {"num_heads": 4}, []) is None
    assert cpu.contract_problem(GRAPHOPT_DOMAIN, "MultiHeadAttention", {"num_heads": 4, "kv_cache": 1}, []) is None


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_contract_refuses_rotary_caches_onnxruntime_cannot_rotate_with(target: str) -> None:
    """do_rotary: the caches' width (half the rotated dims) at most head / 2 and a multiple of 8 on both providers
    ("cos_cache dimension 1 must be <= head_size / 2 and a multiple of 8"): a partial rotary of 48 of 64 dims (Phi-4-mini)
    passes, one of 12 of 16 (width 6) does not."""
    t = TARGETS[target]
    rotary = {"do_rotary": 1}

    def problem(head: int, width: int) -> str:
        shapes = [[1, 1, 4 * head], UNKNOWN_SHAPE, UNKNOWN_SHAPE, [1, 2, 5, head], [1, 2, 5, head], [1], [], [9, width], [9, width]]
        with shared_kv_buffer():
            return t.contract_problem(GRAPHOPT_DOMAIN, "GroupQueryAttention", rotary, shapes) or ""

    assert problem(64, 24) == "" and problem(64, 32) == ""
    assert "multiple of 8, not 6" in problem(16, 6)
    assert "not 40" in problem(64, 40)  # wider than half the head


def test_negative_a_partial_rotary_onnxruntime_cannot_rotate_stays_outside() -> None:
    """Phi-2 (tests/architectures.py "phi2-kv": heads of 16, partial rotary 0.5): 8 rotated dims, caches of width 4,
    not a multiple of 8: GroupQueryAttention without do_rotary, RotaryEmbedding outside; outputs equal."""
    pytest.importorskip("transformers")
    from architectures import build

    path, inputs = build("phi2-kv", "dynamo")
    model = onnx.load(str(path))
    optimized, report = _optimize(model)
    assert report.rules[RULE].applications == 2
    assert "FoldRotaryIntoGroupQueryAttention" not in report.rules or report.rules["FoldRotaryIntoGroupQueryAttention"].applications == 0
    misses = report.rules["FoldRotaryIntoGroupQueryAttention"].near_misses
    assert "multiple of 8, not 4" in misses[0].reason
    assert _ops(optimized)["com.microsoft.RotaryEmbedding"] == 4
    for e, a in zip(run(model, inputs), run(optimized, inputs), strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- sliding window (Mistral, Gemma-2)


def _gqa_node(model: onnx.ModelProto) -> onnx.NodeProto:
    [node] = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    return node


def _window(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "local_window_size"), -1)


@pytest.mark.parametrize("target", ["ort-cpu", "ort-cuda"])
def test_golden_a_sliding_window_mask_becomes_local_window_size(target: str) -> None:
    """causal And kv_pos > q_pos - 3: causal = 1 with local_window_size = 3 (onnxruntime's left window counts the
    query's own key, as transformers' sliding_window does), the mask gone; equal over prefill and decode steps longer
    than the window on ort-cpu (ort-cuda, float16 and a shared buffer: tests/test_llm_families.py runs Mistral's)."""
    model = decoder_block(mask="causal", hidden=64, window=3, dtype=np.float16 if target == "ort-cuda" else np.float32)
    optimized, report = _optimize(model, target=target, kv_buffer="shared" if target == "ort-cuda" else "growing")
    assert report.rules[RULE].applications == 1
    node = _gqa_node(optimized)
    assert _window(node) == 3 and (len(node.input) <= 10 or node.input[10] == "")
    if target == "ort-cpu":
        _assert_steps_equal(model, optimized)


def test_a_sliding_window_with_padding_goes_in_as_the_bias() -> None:
    """With an attention_mask too, the whole mask (window included) is the attention_bias; no local window."""
    model = decoder_block(mask="causal_padding", hidden=64, window=3)
    optimized, report = _optimize(model)
    assert report.rules[RULE].applications == 1
    node = _gqa_node(optimized)
    assert _window(node) == -1 and node.input[10] != ""
    _assert_steps_equal(model, optimized)


def test_negative_a_window_of_run_time_width_is_not_a_local_window() -> None:
    """kv_pos > q_pos - w with w read from a shape: not known to be one width; on ort-cpu the mask stays the bias,
    on ort-cuda (no attention_bias there) the attention stays unfused."""
    model = decoder_block(mask="causal", hidden=64, window="input")
    optimized, report = _optimize(model)
    assert report.rules[RULE].applications == 1
    node = _gqa_node(optimized)
    assert _window(node) == -1 and node.input[10] != ""
    # (the width here is the past length: with no past every key is hidden, a row the rule does not keep equal)
    _assert_steps_equal(model, optimized, [(2, 1, 7, 0), (2, 1, 7, 3), (1, 4, 3, 0)])
    _, cuda = _optimize(decoder_block(mask="causal", hidden=64, window="input", dtype=np.float16), target="ort-cuda", kv_buffer="shared")
    assert RULE not in cuda.rules or cuda.rules[RULE].applications == 0
    assert "no attention_bias" in _near_miss(cuda)


def test_ort_cpu_lowering_drops_the_kv_cache_mark() -> None:
    """kv_cache is graphopt's own: the com.microsoft.MultiHeadAttention the CPU keeps (no GroupQueryAttention
    for a Tile repeat) has no such attribute."""
    optimized, _ = _optimize(decoder_block(repeat="tile"))
    [node] = [n for n in optimized.graph.node if n.op_type == "MultiHeadAttention"]
    assert "kv_cache" not in {a.name for a in node.attribute}


# ----------------------------------------------------------------------------- negative cases


def test_negative_tile_repeats_the_kv_heads_as_a_block() -> None:
    model = decoder_block(repeat="tile")
    optimized, report = _optimize(model)
    assert report.rules[RULE].applications == 0
    assert "repeated with Tile, as a block" in _near_miss(report)
    assert _ops(optimized)["com.microsoft.MultiHeadAttention"] == 1
    _assert_steps_equal(model, optimized)


def test_negative_a_repeat_on_axis_1_is_another_grouping() -> None:
    model = decoder_block(repeat="expand_axis1")
    _, report = _optimize(model)
    assert report.rules[RULE].applications == 0
    assert "query head i would not read kv head i // 2" in _near_miss(report)


def test_negative_no_mask_is_bidirectional() -> None:
    _, report = _optimize(decoder_block(mask="none"))
    assert report.rules[RULE].applications == 0
    assert "has no mask" in _near_miss(report)


def test_negative_a_padding_mask_without_causality() -> None:
    model = decoder_block(mask="padding")
    optimized, report = _optimize(model)
    assert report.rules[RULE].applications == 0
    assert "not known to hide every key after the query's position" in _near_miss(report)
    _assert_steps_equal(model, optimized)


# ----------------------------------------------------------------------------- a real export


def test_tiny_llama_exported_with_a_cache() -> None:
    """SmolLM-style LLaMA (4 query heads over 2 kv heads, 2 layers) exported by torch.onnx's
    dynamo exporter with a DynamicCache: both layers' attention becomes GroupQueryAttention and
    the outputs (hidden states and the four presents) stay equal (batch 2, 6 new tokens over 5
    cached, the last row left-padded)."""
    pytest.importorskip("transformers")
    from architectures import build

    path, inputs = build("smollm-kv", "dynamo")
    model = onnx.load(str(path))
    optimized, report = _optimize(model)
    assert report.rules[RULE].applications == 2
    assert report.rules["FoldRotaryIntoGroupQueryAttention"].applications == 2  # head 16
    ops = _ops(optimized)
    assert ops[GQA] == 2 and ops["com.microsoft.MultiHeadAttention"] == 0 and ops["com.microsoft.RotaryEmbedding"] == 0
    expected, actual = run(model, inputs), run(optimized, inputs)
    for e, a in zip(expected, actual, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


def test_tiny_llama_generates_the_same_over_several_decode_steps() -> None:
    """Prefill of 6 tokens (empty cache, batch 2), then 4 one-token steps, each step's presents fed
    back as the next past, in the export and in graphopt's ort-cpu output: every step's hidden
    states and presents stay equal (the cache grows from 6 to 10 inside both)."""
    pytest.importorskip("transformers")
    from architectures import build

    path, inputs = build("smollm-kv", "dynamo")
    model = onnx.load(str(path))
    optimized, report = _optimize(model)
    assert report.rules[RULE].applications == 2
    rng = np.random.default_rng(3)
    pasts = [name for name in inputs if name.startswith("past")]
    shape = inputs[pasts[0]].shape
    caches = {which: {name: np.zeros((2, shape[1], 0, shape[3]), np.float32) for name in pasts} for which in ("original", "graphopt")}
    length = 0
    for seq in (6, 1, 1, 1, 1):
        length += seq
        step = {"input_ids": rng.integers(0, 97, (2, seq)).astype(np.int64), "attention_mask": np.ones((2, length), np.int64)}
        expected = run(model, {**step, **caches["original"]})
        actual = run(optimized, {**step, **caches["graphopt"]})
        for e, a in zip(expected, actual, strict=True):
            np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5, err_msg=f"cache length {length}")
        caches["original"] = dict(zip(pasts, expected[1:], strict=True))
        caches["graphopt"] = dict(zip(pasts, actual[1:], strict=True))
    assert caches["graphopt"][pasts[0]].shape[2] == 10


def test_static_shapes_fold_the_positions_and_the_rule_still_reads_the_mask() -> None:
    """With the input shapes pinned (`--input-shape`), constant folding turns the positions and
    the causal part of the mask into constants: the rule reads them as such (the tiny LLaMA
    export, a decode step at batch 2 over 5 cached tokens, the last row left-padded)."""
    pytest.importorskip("transformers")
    import onnx_ir as ir
    from architectures import build

    from graphopt.explain import pin_input_shapes

    path, _ = build("smollm-kv", "dynamo")
    model = onnx.load(str(path))
    pinned = ir.serde.deserialize_model(model)
    past = {f"past_{kv}{i}": [2, 2, 5, 16] for i in range(2) for kv in "kv"}
    pin_input_shapes(pinned, {"input_ids": [2, 1], "attention_mask": [2, 6], **past})  # as `--input-shape` does
    result, report = _optimize(pinned)
    assert report.rules[RULE].applications == 2, [m.reason for m in report.rules[RULE].near_misses]
    optimized = ir.serde.serialize_model(result)
    rng = np.random.default_rng(5)
    mask = np.ones((2, 6), np.int64)
    mask[1, :2] = 0
    inputs = {"input_ids": rng.integers(0, 97, (2, 1)).astype(np.int64), "attention_mask": mask,
              **{name: rng.standard_normal(dims).astype(np.float32) for name, dims in past.items()}}
    for e, a in zip(run(model, inputs), run(optimized, inputs), strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mask", ["causal_padding", "causal"])
def test_static_shapes_on_the_decoder_block(mask: str) -> None:
    """The same on the decoder block, where folding also turns a causal-only mask into one constant
    (the rule reads it back as the causal pattern and drops it)."""
    import onnx_ir as ir

    from graphopt.explain import pin_input_shapes

    model = decoder_block(hidden=64, mask=mask)
    pinned = ir.serde.deserialize_model(model)
    shapes = {"hidden": [2, 1, 64], "past_key": [2, 2, 7, 16], "past_value": [2, 2, 7, 16]}
    if mask == "causal_padding":
        shapes["attention_mask"] = [2, 8]
    pin_input_shapes(pinned, shapes)
    result, report = _optimize(pinned)
    assert report.rules[RULE].applications == 1, [m.reason for m in report.rules[RULE].near_misses]
    optimized = ir.serde.serialize_model(result)
    [node] = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    assert (len(node.input) > 10 and node.input[10] != "") == (mask == "causal_padding")
    _assert_steps_equal(model, optimized, [(2, 1, 7, 0), (2, 1, 7, 3)] if mask == "causal_padding" else [(2, 1, 7, 0)])
