"""The LLM rewrites on each decoder family of tests/llm_families.py (issue 17), on real dynamo exports with a KV
cache: golden counts per family and target, outputs equal to the export's over a prefill and decode steps in
onnxruntime's CPU provider; and on the torch path, the families whose form differs from LLaMA's (Qwen2's biased
q/k/v, Gemma's norm and MLP) against eager. What a family still misses is asserted with its reason, so that a fix
(or a regression) shows here. benchmarks/llm_family_survey.py prints the same as a table."""

from __future__ import annotations

from collections import Counter
from typing import Any

import onnx
import pytest

pytest.importorskip("transformers")

from architectures import build  # noqa: E402
from llm_families import config, max_step_difference  # noqa: E402

import graphopt  # noqa: E402

GQA = "com.microsoft.GroupQueryAttention"

#: per family: (GroupQueryAttention, with do_rotary, packed QKV, com.microsoft.RotaryEmbedding left outside)
ATTENTION = {
    "llama": (2, 2, 2, 0),
    "llama3": (2, 2, 2, 0),
    "qwen2": (2, 2, 2, 0),  # packed with its biases: MatMul + Add (pack_qkv)
    "mistral": (2, 2, 2, 0),  # its cache cropped to window - 1 in the graph, proven idle (test_mistral_default_export_*)
    "phi3": (2, 2, 2, 0),  # the partial rotary inside, q / k / v the Slices of the checkpoint's qkv_proj: the product itself
    "gemma": (2, 2, 2, 0),  # head_dim 32 != hidden / heads, one kv head
}
#: the first near-miss of a rule a family still misses
MISSES: dict[str, tuple[str, str]] = {}
#: per family, where a shared KV buffer is refused: (its attention counts as in ATTENTION, the report's warning)
SHARED_MISSES = {
    # the export rotates at the cropped past's length: a buffer of every token would not (sliding_window_cache.py)
    "mistral": ((0, 0, 0, 4), "not uncropped for a shared KV buffer: the export rotates the new tokens at the past input's length"),
}


def _ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type for n in model.graph.node)


def _attention_counts(model: onnx.ModelProto) -> tuple[int, int, int, int]:
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    rotary = sum(any(a.name == "do_rotary" and a.i == 1 for a in n.attribute) for n in gqa)
    packed = sum(n.input[1] == "" and n.input[2] == "" for n in gqa)
    return len(gqa), rotary, packed, _ops(model)["com.microsoft.RotaryEmbedding"]


def _miss(report: Any, rule: str) -> str:
    stats = report.rules.get(rule)
    return stats.near_misses[0].reason if stats is not None and stats.near_misses else ""


@pytest.mark.parametrize("family", list(ATTENTION))
def test_family_on_ort_cpu(family: str) -> None:
    """float32 export with an attention_mask (the last row left-padded at export), --target ort-cpu."""
    path, _ = build(f"{family}-kv", "dynamo")
    model = onnx.load(str(path))
    optimized, report = graphopt.optimize(model, target="ort-cpu")
    assert _attention_counts(optimized) == ATTENTION[family]
    ops = _ops(optimized)
    # 2 norms a layer and the final one; the residual ones stay unfused on ort-cpu (the skip_norm decision)
    assert ops["SimplifiedLayerNormalization"] == 5 and ops["Softmax"] == 0
    if family in MISSES:
        rule, reason = MISSES[family]
        assert reason in _miss(report, rule)
    assert max_step_difference(model, optimized, config(family).vocab_size, shared=False) < 1e-5


@pytest.mark.parametrize("export, target", [("mistral-kv-causal-full", "ort-cpu"), ("mistral-kv-causal-fp16-full", "ort-cuda"),
                                            ("mistral-kv-full", "ort-cpu")])
def test_mistral_with_a_cache_of_every_token(export: str, target: str) -> None:
    """Mistral exported with a DynamicCache that keeps every token (not cropped to the window): GroupQueryAttention
    with local_window_size 8 (the window) and no mask where the export has no attention_mask; with one the whole mask,
    window included, is the attention_bias (ort-cpu). Equal over a prefill of 6 and 4 steps: the cache outgrows the
    window (10 > 8)."""
    path, _ = build(export, "dynamo")
    model = onnx.load(str(path))
    shared = target == "ort-cuda"
    optimized, _ = graphopt.optimize(model, target=target, kv_buffer="shared" if shared else "growing")
    gqa = [n for n in optimized.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2 and _ops(optimized)["Softmax"] == 0
    masked = "causal" not in export
    for node in gqa:
        assert next(a.i for a in node.attribute if a.name == "local_window_size") == (-1 if masked else 8)
        assert (len(node.input) > 10 and node.input[10] != "") == masked
    assert max_step_difference(model, optimized, config("mistral").vocab_size, shared=shared) < (1e-2 if shared else 1e-5)


@pytest.mark.parametrize("family", list(ATTENTION))
def test_family_on_ort_cuda_in_float16_with_a_shared_buffer(family: str) -> None:
    """float16 export without an attention_mask (as benchmarks/llm_onnx_decode.py makes it for the GPU), --target
    ort-cuda --kv-buffer shared; run in onnxruntime's CPU provider (batch 1: its kernel prefills over a shared buffer
    only there). Every family's residual norms fuse (Gemma's once FuseRMSNormDowncast takes its float32 scale)."""
    path, _ = build(f"{family}-kv-causal-fp16", "dynamo")
    model = onnx.load(str(path))
    optimized, report = graphopt.optimize(model, target="ort-cuda", kv_buffer="shared")
    expected, warning = SHARED_MISSES.get(family, (ATTENTION[family], ""))
    assert _attention_counts(optimized) == expected
    assert not warning or any(warning in w for w in report.warnings)
    ops = _ops(optimized)
    assert ops["com.microsoft.SkipSimplifiedLayerNormalization"] == 4 and ops["SimplifiedLayerNormalization"] == 1
    if family == "gemma":
        assert report.rules["FuseRMSNormDowncast"].applications == 5
    diff = max_step_difference(model, optimized, config(family).vocab_size, shared=expected[0] > 0)
    assert diff < 1e-2, diff  # float16: a few units in the last place of the hidden states


def test_negative_gemma_float32_needs_no_downcast() -> None:
    """In float32 the (1 + w) scale is folded into FuseRMSNorm's weight: FuseRMSNormDowncast has nothing to take."""
    path, _ = build("gemma-kv", "dynamo")
    _, report = graphopt.optimize(onnx.load(str(path)), target="ort-cpu")
    assert report.rules["FuseRMSNorm"].applications == 5
    assert "FuseRMSNormDowncast" not in report.rules or report.rules["FuseRMSNormDowncast"].applications == 0


# ----------------------------------------------------------------------------- torch


def _torch_family(family: str, half: bool = False) -> dict[str, Any]:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from llm_family_survey import torch_family

    return torch_family(family, half=half)


@pytest.mark.usefixtures("graphopt_never_falls_back")
@pytest.mark.parametrize("family, gemms, swiglu, gated_gelu", [("qwen2", 9, 2, 0), ("gemma", 9, 0, 2)])
def test_family_decode_step_on_the_torch_path(family: str, gemms: int, swiglu: int, gated_gelu: int) -> None:
    """The decode step over a StaticCache (inductor off): the same rewrites as LLaMA's (RMSNorm 5, 4 with the
    residual, rotary 4, attention 2, the repeated kv heads out), Qwen2's biased q/k/v packed into one GEMM like
    LLaMA's (9 GEMMs: 2 x (qkv, o, gate|up, down) + the LM head), Gemma's GELU gate of two projections
    (gelu_tanh(gate) * up) one graphopt::geglu like LLaMA's SwiGLU; greedy tokens equal eager's."""
    result = _torch_family(family)
    decode = result["graphs"][-1]
    assert {r: decode.get(r, 0) for r in ("FuseRMSNorm", "FuseSkipRMSNorm", "FuseRotaryEmbedding", "FuseScaledDotProductAttention",
                                         "FuseGroupedKV", "FuseSwiGLU", "FuseGatedGelu")} == {
        "FuseRMSNorm": 5, "FuseSkipRMSNorm": 4, "FuseRotaryEmbedding": 4, "FuseScaledDotProductAttention": 2, "FuseGroupedKV": 2,
        "FuseSwiGLU": swiglu, "FuseGatedGelu": gated_gelu}
    calls = result["decode_calls"]
    assert calls.get("graphopt.geglu.default", 0) == gated_gelu and calls.get("graphopt.swiglu.default", 0) == swiglu
    assert sum(calls.get(f"aten.{g}.default", 0) for g in ("mm", "addmm", "matmul")) == gemms
    assert result["tokens_equal"], result
    assert result["logits_max_diff"] < 1e-4


@pytest.mark.usefixtures("graphopt_never_falls_back")
def test_gemma_in_float16_on_the_torch_path_fuses_its_norms_as_llama_does() -> None:
    """In float16 Gemma's norm is Cast((norm(Cast(h, float)) * (1 + w)), float16): FuseRMSNormDowncast makes it
    graphopt.RMSNorm on h (5), so the residual adds fuse as LLaMA's (4); tokens equal eager's (float16, CPU)."""
    result = _torch_family("gemma", half=True)
    decode = result["graphs"][-1]
    assert (decode.get("FuseRMSNormDowncast"), decode.get("FuseSkipRMSNorm"), decode.get("FuseGatedGelu")) == (5, 4, 2)
    assert result["tokens_equal"], result
    assert result["logits_max_diff"] < 1e-2
