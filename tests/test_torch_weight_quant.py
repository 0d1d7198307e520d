"""Weight-only int8/int4 on the torch path (issue 18): options={"weights": ...}.

The tiny LLaMA of the LLM tests generates greedily over a StaticCache, compiled with
inductor off (inductor compiles C++ on this machine: one test hands inductor's place to a
stand-in that runs the graph it is given). Each 2-layer graph has 4 quantizable GEMMs a layer
after packing (q/k/v packed, o, gate/up packed, down) and the LM head, kept by default.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers
from test_report import validate
from test_torch_backend_cudagraphs_llm import _generate as _generate_to_full_cache
from test_torch_backend_cudagraphs_llm import _static_cache, fake_cuda_graph_replays
from test_torch_backend_llm import _cache_kwarg, _tiny_llama

import graphopt
from graphopt import torch_backend
from graphopt.errors import GraphoptError
from graphopt.passes import fx_weight_quant, fx_weight_quant_forms
from graphopt.report.html import render_html
from graphopt.report.render import report_to_json

# tests/conftest.py; the form decision as on CUDA with graphopt's kernel timed fastest (these tests check the kernel,
# its budget and report; a test that times otherwise patches TIMER again)
pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back", "wq_linear_timed_fastest")

PROMPT, NEW_TOKENS, CACHE_LEN, BATCH = 8, 6, 32, 2
LAYERS = 2
GEMMS_PER_LAYER = 4  # qkv (packed), o, gate+up (packed), down
WQ = "graphopt.wq_linear.default"


def _greedy(forward: Callable[..., Any], model: transformers.LlamaForCausalLM, ids: torch.Tensor,
            forced: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy tokens and each step's logits; with `forced`, those tokens are fed instead of the
    argmax (teacher forcing: the logits stay comparable after a token differs)."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=CACHE_LEN)
    key = _cache_kwarg()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        out = forward(input_ids=ids, cache_position=torch.arange(PROMPT), use_cache=True, **{key: cache})
        tokens, logits = [out.logits[:, -1].argmax(-1, keepdim=True)], [out.logits[:, -1]]
        for step in range(NEW_TOKENS - 1):
            fed = tokens[-1] if forced is None else forced[:, step:step + 1]
            out = forward(input_ids=fed, cache_position=torch.tensor([PROMPT + step]), use_cache=True, **{key: cache})
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
            logits.append(out.logits[:, -1])
    return torch.cat(tokens, 1), torch.stack(logits, 1)


def _calls(gm: torch.fx.GraphModule | None) -> Counter[str]:
    assert gm is not None
    return Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


def _weight_decisions(report: Any) -> dict[str, Any]:
    return {d.site: d for d in report.decisions if d.kind == "weights"}


def _compile(model: transformers.LlamaForCausalLM, **options: Any) -> Callable[..., Any]:
    torch_backend.clear_reports()
    return torch.compile(model.forward, backend="graphopt", fullgraph=True, options={"inductor": False, **options})


@pytest.mark.parametrize("bad, message", [
    ({"weights": "int3"}, "'weights' takes 'int8' or 'int4'"),
    ({"weights": "int4", "block_size": 48}, "'block_size' takes one of 32, 64, 128"),
    ({"weights": "int4", "weights_keep": [3]}, "'weights_keep' takes a list of name globs"),
    ({"weights": "int8", "weights_min_snr": "high"}, "'weights_min_snr' takes a number of dB"),
    ({"weights": "int8", "freeze": False}, "needs freeze=True"),
])
def test_bad_weight_options_fail_before_dynamo_runs(bad: dict[str, Any], message: str) -> None:
    calls = []
    model = torch.nn.Linear(4, 4)
    with pytest.raises(GraphoptError, match=message):
        graphopt.compile(lambda x: calls.append(x) or model(x), options=bad)
    assert not calls


@pytest.mark.parametrize("weights, logits_atol, min_cosine", [("int8", 0.02, 0.9999), ("int4", 0.25, 0.99)])
def test_tiny_llama_generates_with_quantized_weights_and_keeps_the_lm_head(weights: str, logits_atol: float, min_cosine: float) -> None:
    model = _tiny_llama()
    ids = torch.randint(0, 100, (BATCH, PROMPT), generator=torch.Generator().manual_seed(0))
    expected, expected_logits = _greedy(model.forward, model, ids)
    got, _ = _greedy(_compile(model, weights=weights), model, ids)
    torch._dynamo.reset()
    _, logits = _greedy(_compile(model, weights=weights), model, ids, forced=expected)

    cosine = torch.nn.functional.cosine_similarity(logits.flatten(1), expected_logits.flatten(1)).min()
    assert cosine >= min_cosine, cosine
    torch.testing.assert_close(logits, expected_logits, atol=logits_atol, rtol=0)
    assert not torch.allclose(logits, expected_logits, atol=1e-6), "the weights really were quantized"
    if weights == "int8":  # 45 dB: the tiny model's greedy tokens do not move
        assert torch.equal(got, expected)

    reports = torch_backend.torch_reports()
    assert len(reports) == 2, "prefill and decode"
    assert _calls(torch_backend.last_graph())[WQ] == LAYERS * GEMMS_PER_LAYER
    for report in reports:
        assert report.passes["weight_quant"].changes == LAYERS * GEMMS_PER_LAYER
        decisions = _weight_decisions(report)
        assert decisions["lm_head"].chosen == "unquantized" and "block list" in decisions["lm_head"].reason
        quantized = [d for d in decisions.values() if d.chosen == "wq_linear"]
        assert len(quantized) == LAYERS * GEMMS_PER_LAYER
        assert "model.layers.0.self_attn.q_proj+model.layers.0.self_attn.k_proj+model.layers.0.self_attn.v_proj" in decisions
        assert all("SNR" in d.reason for d in quantized)
        assert any("lm_head" in w for w in report.warnings)


def test_a_layer_with_outliers_misses_the_int4_budget_and_stays_unquantized() -> None:
    model = _tiny_llama()
    weight = model.model.layers[1].mlp.down_proj.weight
    with torch.no_grad():  # one value of 40 sigma per block of 32: its scale rounds the other 31 to zero (~17.6 dB)
        weight[:, ::32] = 40 * weight.std()
    ids = torch.randint(0, 100, (BATCH, PROMPT), generator=torch.Generator().manual_seed(0))
    expected, expected_logits = _greedy(model.forward, model, ids)
    _, logits = _greedy(_compile(model, weights="int4"), model, ids, forced=expected)

    report = torch_backend.last_report()
    assert report is not None
    decisions = _weight_decisions(report)
    kept = decisions["model.layers.1.mlp.down_proj"]
    assert kept.chosen == "unquantized" and "< the 20 dB budget" in kept.reason, kept.reason
    assert decisions["model.layers.0.mlp.down_proj"].chosen == "wq_linear"
    assert _calls(torch_backend.last_graph())[WQ] == LAYERS * GEMMS_PER_LAYER - 1
    assert any("model.layers.1.mlp.down_proj (int4: SNR" in w for w in report.warnings), report.warnings
    assert torch.nn.functional.cosine_similarity(logits.flatten(1), expected_logits.flatten(1)).min() > 0.99

    # The report's weight_quantization: every layer with its SNR, form and reason, in the summary and the JSON.
    summary = report.weight_quantization
    assert summary is not None and summary.weights == "int4" and summary.form == "per layer" and summary.min_snr_db == 20
    layers = {layer.node: layer for layer in summary.layers}
    assert (summary.quantized, summary.kept, len(layers)) == (LAYERS * GEMMS_PER_LAYER - 1, 2, LAYERS * GEMMS_PER_LAYER + 1)
    bad = layers["model.layers.1.mlp.down_proj"]
    assert (bad.quantized, bad.reason, bad.layer_form) == (False, "budget", "") and bad.snr_db is not None and bad.snr_db < 20
    good = layers["model.layers.0.mlp.down_proj"]
    assert (good.quantized, good.reason, good.layer_form) == (True, "", "wq_linear") and good.snr_db is not None and good.snr_db >= 20
    assert (good.k, good.n) == tuple(model.model.layers[0].mlp.down_proj.weight.shape[::-1]) and good.weight_snr_db is not None
    assert (layers["lm_head"].reason, layers["lm_head"].snr_db) == ("lm_head", None)
    assert 0 < summary.bytes_after < summary.bytes_before / 4  # int4 + fp32 scales per 32 against fp32
    text = str(report)
    assert f"kept: model.layers.1.mlp.down_proj ({bad.op} {bad.k}x{bad.n}): SNR {bad.snr_db:.1f} dB < 20 dB" in text, text
    assert f"int4: model.layers.0.mlp.down_proj ({good.op} {good.k}x{good.n}): wq_linear, SNR {good.snr_db:.1f} dB" in text, text
    doc = json.loads(report_to_json(report))
    validate(doc)  # tests/test_report.py: the schema
    row = next(r for r in doc["weight_quantization"]["layers"] if r["node"] == "model.layers.1.mlp.down_proj")
    assert row["reason"] == "budget" and row["snr_db"] == pytest.approx(bad.snr_db)
    page = render_html(doc, drawings=False)
    assert f"weights kept: model.layers.1.mlp.down_proj ({bad.op}): budget, SNR {bad.snr_db:.1f} dB" in page
    assert f"weights int4: model.layers.0.mlp.down_proj ({good.op}): wq_linear, SNR {good.snr_db:.1f} dB" in page


def test_the_budget_option_and_the_block_list_option() -> None:
    model = _tiny_llama()
    ids = torch.randint(0, 100, (1, PROMPT))
    _greedy(_compile(model, weights="int8", weights_min_snr=60), model, ids)  # int8 gives ~45 dB: nothing passes
    assert _calls(torch_backend.last_graph())[WQ] == 0
    torch._dynamo.reset()
    _greedy(_compile(model, weights="int8", weights_keep=["*.mlp.*"]), model, ids)  # the head is no longer kept
    decisions = _weight_decisions(torch_backend.last_report())
    assert decisions["lm_head"].chosen == "wq_linear"
    assert decisions["model.layers.0.mlp.down_proj"].chosen == "unquantized"
    layers = {layer.node: layer for layer in torch_backend.last_report().weight_quantization.layers}
    assert layers["model.layers.0.mlp.down_proj"].reason == "keep_list" and "'*.mlp.*'" in layers["model.layers.0.mlp.down_proj"].detail
    assert layers["lm_head"].quantized and layers["lm_head"].layer_form == "wq_linear"
    assert _calls(torch_backend.last_graph())[WQ] == LAYERS * 2 + 1  # qkv and o a layer, and the head


def test_the_fastest_measured_form_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA each form is timed (fx_weight_quant_forms.fastest); here a stand-in timer decides."""
    speed = {"wq_linear": 3.0, "dequant": 1.0, "unquantized": 2.0}
    monkeypatch.setattr(fx_weight_quant, "MEASURE_OFF_CUDA", True)
    monkeypatch.setattr(fx_weight_quant_forms, "TIMER", lambda name, fn: (fn(), speed[name])[1])
    monkeypatch.setattr(fx_weight_quant_forms, "_TIMES", {})
    model = _tiny_llama()
    ids = torch.randint(0, 100, (1, PROMPT))
    expected, expected_logits = _greedy(model.forward, model, ids)
    _, logits = _greedy(_compile(model, weights="int8"), model, ids, forced=expected)
    calls = _calls(torch_backend.last_graph())
    assert calls[WQ] == 0 and sum(v for k, v in calls.items() if "dequant_linear" in k) == LAYERS * GEMMS_PER_LAYER
    decision = _weight_decisions(torch_backend.last_report())["model.layers.0.mlp.down_proj"]
    assert decision.chosen == "dequant" and decision.basis == "measured"
    assert {a.candidate: a.measured_ms for a in decision.alternatives} == speed
    torch.testing.assert_close(logits, expected_logits, atol=0.02, rtol=0)

    speed.update(unquantized=0.5)  # the unquantized matmul wins: nothing is quantized
    monkeypatch.setattr(fx_weight_quant_forms, "_TIMES", {})
    torch._dynamo.reset()
    _greedy(_compile(model, weights="int8"), model, ids)
    assert _calls(torch_backend.last_graph())[WQ] == 0
    assert torch_backend.last_report().passes["weight_quant"].changes == 0
    slower = [layer for layer in torch_backend.last_report().weight_quantization.layers if layer.reason == "speed_measured"]
    assert len(slower) == LAYERS * GEMMS_PER_LAYER and all(layer.snr_db is not None and "unquantized 0.5000 ms" in layer.detail for layer in slower)
    assert "measured slower quantized (SNR" in str(torch_backend.last_report())


def test_inductor_is_handed_the_quantized_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    handed = []

    def run_as_given(gm: torch.fx.GraphModule, inputs: Any, opts: Any, dynamo_gm: Any) -> Callable[..., Any]:
        handed.append(gm)
        return gm

    monkeypatch.setattr(torch_backend, "_inductor", run_as_given)
    model = _tiny_llama()
    ids = torch.randint(0, 100, (1, PROMPT))
    expected, _ = _greedy(model.forward, model, ids)
    torch_backend.clear_reports()
    compiled = torch.compile(model.forward, backend="graphopt", fullgraph=True, options={"weights": "int8"})
    got, _ = _greedy(compiled, model, ids)
    assert torch.equal(got, expected)
    assert len(handed) == 2 and all(_calls(gm)[WQ] == LAYERS * GEMMS_PER_LAYER for gm in handed), "graphopt's graph, not dynamo's"


def test_int4_generation_replays_as_cuda_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """graphopt's own CUDA graphs (inductor off, reduce-overhead), captured and replayed by the CPU fake:
    the quantized op neither syncs nor reads the host during capture."""
    cuda, made = fake_cuda_graph_replays(monkeypatch)
    model = _tiny_llama()
    ids = torch.randint(0, 100, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    uncaptured = _generate_to_full_cache(_compile(model, weights="int4"), ids, _static_cache(model))
    torch._dynamo.reset()
    compiled = torch.compile(model.forward, backend="graphopt", fullgraph=True, dynamic=False,
                             options={"inductor": False, "mode": "reduce-overhead", "weights": "int4"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a failed capture warns: here it must not
        got = _generate_to_full_cache(compiled, ids, _static_cache(model))
    assert [r.failed for r in made] == [None, None] and made[1].graph.replays > 0
    assert torch.equal(got, uncaptured)
    assert _calls(torch_backend.last_graph())[WQ] == LAYERS * GEMMS_PER_LAYER


def test_an_mlp_keeps_its_output_layer_by_structure_and_quantizes_a_fused_relu_gemm() -> None:
    """Sequential(Linear, GELU, Linear, ReLU, Linear): no name says "head"; the last Linear's
    product is the graph's output, so the default block list keeps it. The middle one is
    GemmActivation's aten._addmm_activation (bias + ReLU): quantized, its ReLU after."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 32)).eval()
    x = torch.randn(4, 64)
    with torch.no_grad():
        expected = model(x)
        torch_backend.clear_reports()
        got = torch.compile(model, backend="graphopt", options={"inductor": False, "weights": "int8"})(x)
    torch.testing.assert_close(got, expected, atol=5e-3, rtol=0)
    decisions = _weight_decisions(torch_backend.last_report())
    assert {site: d.chosen for site, d in decisions.items()} == {"0": "wq_linear", "2": "wq_linear", "4": "unquantized"}
    assert "head" in decisions["4"].reason
    calls = _calls(torch_backend.last_graph())
    assert calls[WQ] == 2 and calls["aten.relu.default"] == 1 and calls["aten._addmm_activation.default"] == 0

    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt", options={"inductor": False, "weights": "int8", "weights_keep": []})(x)
    torch.testing.assert_close(got, expected, atol=5e-3, rtol=0)
    assert _calls(torch_backend.last_graph())[WQ] == 3


@pytest.mark.parametrize("symmetric", [True, False])
def test_tinygemm_operands_mean_the_blockwise_weight(symmetric: bool) -> None:
    """torch._weight_int4pack_mm's scales_and_zeros from our (q, scale, zero point): checked with
    its CPU twin (same scales_and_zeros contract; the CUDA packing's nibble order is the GPU run's)."""
    import numpy as np

    from graphopt.quant import blockwise

    k, n, group = 128, 64, 32
    q = blockwise.quantize(np.random.default_rng(0).standard_normal((k, n)).astype(np.float32), 4, group, symmetric=symmetric)
    flat, scales_and_zeros = fx_weight_quant_forms.tinygemm_operands(q)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    got = torch._weight_int4pack_mm_for_cpu(x, torch._convert_weight_to_int4pack_for_cpu(flat, 2), group, scales_and_zeros.to(torch.bfloat16))
    want = x.float() @ torch.from_numpy(blockwise.dequantize(q))
    torch.testing.assert_close(got.float(), want, atol=0.3, rtol=0.02)  # bf16 scales and output


@pytest.mark.parametrize("bits,block,symmetric", [(4, 32, True), (4, 64, False), (8, 32, True), (8, 128, False)])
def test_quantizing_on_the_device_gives_numpys_values(bits: int, block: int, symmetric: bool) -> None:
    """A CUDA weight is quantized by torch ops on the GPU (fx_weight_quant_forms._quantize_on_device):
    the same q, scales and zero points as graphopt.quant.blockwise (the ONNX path's numpy), here run
    on CPU tensors; K not a multiple of the block, an all-zero block, exact ties (x.5 steps)."""
    import numpy as np

    from graphopt.quant import blockwise

    gen = torch.Generator().manual_seed(bits * block)
    weight = torch.randn(block * 3 + 8, 20, generator=gen)  # [K, N], K padded in the last block
    weight[:block, 0] = 0.0  # a zero block: scale 1
    weight[:block, 1] = torch.arange(block, dtype=torch.float32) * 0.25 - 2.0  # steps that round half to even
    q, scales, zero_points = fx_weight_quant_forms.blockwise_quantize_torch(weight, bits, block, symmetric)
    want = blockwise.quantize(weight.numpy(), bits, block, symmetric)
    assert np.array_equal(q.numpy(), want.q) and np.array_equal(scales.numpy(), want.scales)
    assert np.array_equal(zero_points.numpy(), want.zero_points)
    on_device = fx_weight_quant_forms._quantize_on_device(weight.half(), bits, block, {4: 20.0, 8: 35.0}[bits])
    on_host = fx_weight_quant_forms.quantize_weight(weight.half(), bits, block, {4: 20.0, 8: 35.0}[bits])
    assert torch.equal(on_device.packed, on_host.packed) and torch.equal(on_device.scales, on_host.scales)
    assert (on_device.zeros is None) == (on_host.zeros is None)
    assert on_device.snr_db == pytest.approx(on_host.snr_db, abs=1e-3)
    assert on_device.weight_snr_db == pytest.approx(on_host.weight_snr_db, abs=1e-6)
    assert np.array_equal(on_device.blocks.q, on_host.blocks.q) and on_device.blocks.symmetric == on_host.blocks.symmetric
