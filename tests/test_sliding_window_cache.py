"""Mistral as transformers exports it by default (graphopt/passes/sliding_window_cache.py): its sliding-window cache
cropped to window - 1 tokens inside the graph, proven idle from the graph (the scores' cropped length meets the
mask's full one in one Add), becomes GroupQueryAttention with local_window_size = window over the growing cache;
equal to the export over a prompt and more decode steps than the window, each step fed the previous presents (the
last window - 1 tokens, as the export keeps them). Negative cases: a shared KV buffer (never equal: rotary
positions), crops of different widths, and a crop that nothing proves idle."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

pytest.importorskip("transformers")

from architectures import build  # noqa: E402
from llm_families import TINY_WINDOW, config, decode_steps  # noqa: E402

import graphopt  # noqa: E402

#: a prompt longer than the window (the window masks inside the prefill), then more steps than the window
LONG = (10,) + (1,) * 12


def _window(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "local_window_size"), -1)


def _steps_difference(original: onnx.ModelProto, optimized: onnx.ModelProto, batch: int) -> float:
    vocab = config("mistral").vocab_size
    expected = decode_steps(original, vocab, shared=False, seqs=LONG, batch=batch)
    actual = decode_steps(optimized, vocab, shared=False, seqs=LONG, batch=batch)
    for step in expected:  # the export's presents stay cropped: the last window - 1 tokens
        assert all(cache.shape[2] == TINY_WINDOW - 1 for cache in step[1:])
    return max(float(np.max(np.abs(a - e))) for es, as_ in zip(expected, actual, strict=True) for e, a in zip(es, as_, strict=True))


@pytest.mark.parametrize("export, batch", [("mistral-kv-causal", 1), ("mistral-kv-causal", 2), ("mistral-kv", 2)])
def test_golden_the_default_export_lowers_to_group_query_attention_with_the_window(export: str, batch: int) -> None:
    """Without an attention_mask: local_window_size 8 and no mask; with one, the whole mask (window included) is the
    attention_bias. 4 crops and the one kv_offset replaced; rotary inside, q / k / v packed; the presents stay the
    export's Slices; outputs and presents equal over 10 + 12 tokens (the cache passes the window 8 at once)."""
    path, _ = build(export, "dynamo")
    model = onnx.load(str(path))
    optimized, report = graphopt.optimize(model, target="ort-cpu")
    assert report.pass_stats("sliding_window_cache").changes == 5
    gqa = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    masked = "causal" not in export
    assert len(gqa) == 2 and not any(n.op_type == "Softmax" for n in optimized.graph.node)
    for node in gqa:
        assert _window(node) == (-1 if masked else TINY_WINDOW)
        assert (len(node.input) > 10 and node.input[10] != "") == masked
        assert next(a.i for a in node.attribute if a.name == "do_rotary") == 1
    presents = {o.name for o in optimized.graph.output if o.name.startswith("present")}
    assert {n.output[0] for n in optimized.graph.node if n.op_type == "Slice"} >= presents
    assert _steps_difference(model, optimized, batch) < 1e-5


def test_a_past_longer_than_the_crop_runs_after_the_rewrite_where_the_export_refuses_it() -> None:
    """The proof's premise: the export fails on a past of window tokens (scores of 7 + 1 columns, mask of 8 + 1);
    the rewritten model attends over all of it, the window in the op."""
    import onnxruntime as ort

    path, _ = build("mistral-kv-causal", "dynamo")
    model = onnx.load(str(path))
    optimized, _ = graphopt.optimize(model, target="ort-cpu")
    feeds = {"input_ids": np.zeros((1, 1), np.int64)}
    feeds |= {i.name: np.zeros((1, 2, TINY_WINDOW, 16), np.float32) for i in model.graph.input if i.name.startswith("past")}
    with pytest.raises(Exception, match="[Bb]roadcast|dimension|shape"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    out = ort.InferenceSession(optimized.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert out[1].shape == (1, 2, TINY_WINDOW - 1, 16)


def test_negative_a_shared_buffer_keeps_the_crop_and_says_why() -> None:
    """--kv-buffer shared: the crop stays (a buffer of every token would rotate at absolute positions, the export at
    the cropped past's length), so FuseAttention does not fire (the lengths differ) and the warning says why."""
    path, _ = build("mistral-kv-causal-fp16", "dynamo")
    optimized, report = graphopt.optimize(onnx.load(str(path)), target="ort-cuda", kv_buffer="shared")
    assert report.pass_stats("sliding_window_cache").changes == 0
    assert not any(n.op_type == "GroupQueryAttention" for n in optimized.graph.node)
    assert any("not uncropped for a shared KV buffer" in w and "local_window_size 8" in w for w in report.warnings)


def test_negative_crops_of_different_widths_are_kept() -> None:
    path, _ = build("mistral-kv-causal", "dynamo")
    model = onnx.load(str(path))
    crop = next(n for n in model.graph.node if n.op_type == "Slice" and n.input[0] == "past_k1")
    start = helper.make_node("Constant", [], ["other_start"], value=helper.make_tensor("v", TensorProto.INT64, [1], [-6]))
    model.graph.node.insert(0, start)
    crop.input[1] = "other_start"
    optimized, report = graphopt.optimize(model, target="ort-cpu")
    assert report.pass_stats("sliding_window_cache").changes == 0
    assert any("differ in the tokens kept ([6, 7])" in w for w in report.warnings)
    assert not any(n.op_type == "GroupQueryAttention" for n in optimized.graph.node)


def test_negative_a_crop_nothing_proves_idle_is_kept() -> None:
    """Slice(past, -3:) then Concat with the new tokens, and no node that meets the cropped length with the full one:
    the crop changes the output for a past longer than 3, so it stays."""
    past = helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, 2, "past", 4])
    new = helper.make_tensor_value_info("new", TensorProto.FLOAT, [1, 2, "seq", 4])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    consts = [helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [1], [v]))
              for name, v in (("s", -3), ("e", 2**63 - 1), ("a", 2), ("st", 1))]
    nodes = consts + [helper.make_node("Slice", ["past", "s", "e", "a", "st"], ["cropped"]),
                      helper.make_node("Concat", ["cropped", "new"], ["out"], axis=2)]
    model = helper.make_model(helper.make_graph(nodes, "crop", [past, new], [out]), opset_imports=[helper.make_opsetid("", 18)])
    optimized, report = graphopt.optimize(model, target="onnx")
    assert any(n.op_type == "Slice" for n in optimized.graph.node)
    assert any("crop of the past to its last 3 tokens is not proven idle" in w for w in report.warnings)
