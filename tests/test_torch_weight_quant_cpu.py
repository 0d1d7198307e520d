"""Weight-only int8/int4 on the torch path, on the CPU (issue 18): the CPU's own forms, timed.

On the CPU graphopt's wq_linear is its torch reference (dequantize the whole weight, then the
GEMM: 30-40x slower than fp32 at one row), so the CPU times its packed kernels instead,
torch._weight_int4pack_mm_for_cpu and torch._weight_int8pack_mm (bf16 activations), against the
unquantized matmul, and keeps a quantized form only where it is measured faster by more than the
margin and its own output stays within the layer's SNR budget.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from test_torch_backend_llm import _tiny_llama
from test_torch_weight_quant import GEMMS_PER_LAYER, LAYERS, PROMPT, _calls, _compile, _greedy, _weight_decisions

from graphopt import torch_backend
from graphopt.kernels import gpu_timing
from graphopt.passes import fx_weight_quant, fx_weight_quant_forms
from graphopt.quant import blockwise

pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py

PACKED = {"int4": "int4pack", "int8": "int8pack"}


def _timed(monkeypatch: pytest.MonkeyPatch, speed: dict[str, float]) -> list[str]:
    """A stand-in clock: each candidate runs once and takes speed[name] ms; returns the names timed."""
    timed: list[str] = []

    def clock(name: str, fn: Any) -> float:
        fn()
        timed.append(name)
        return speed[name]

    monkeypatch.setattr(fx_weight_quant_forms, "TIMER", clock)
    monkeypatch.setattr(fx_weight_quant_forms, "_TIMES", {})
    return timed


def _form_calls(gm: Any, form: str) -> int:
    return sum(v for k, v in _calls(gm).items() if f"{form}_linear" in k)


@pytest.mark.parametrize("symmetric", [True, False])
def test_int4pack_on_the_cpu_computes_the_blockwise_product(symmetric: bool) -> None:
    k, n, group = 128, 64, 32
    weight = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    q = blockwise.quantize(weight, 4, group, symmetric=symmetric)
    packed = fx_weight_quant_forms.int4pack_weight(q, torch.device("cpu"))
    assert packed is not None
    x = torch.randn(2, 3, k, generator=torch.Generator().manual_seed(0))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(1))
    got = fx_weight_quant_forms.int4pack_linear(x, packed[0], packed[1], group, n, bias)
    want = x @ torch.from_numpy(blockwise.dequantize(q)) + bias
    assert got.shape == (2, 3, n) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=0.3, rtol=0.02)  # bf16 activations and scales


def test_int4pack_refuses_a_weight_tinygemm_cannot_take() -> None:
    q = blockwise.quantize(np.ones((48, 16), np.float32), 4, 32, symmetric=True)  # K padded to 64 in its last block
    assert fx_weight_quant_forms.int4pack_weight(q, torch.device("cpu")) is None


def test_int8pack_is_per_channel_and_within_the_int8_budget() -> None:
    weight = torch.randn(256, 96, generator=torch.Generator().manual_seed(0))  # [K, N]
    q, scales = fx_weight_quant_forms.int8pack_weight(weight)  # type: ignore[misc]
    assert q.dtype == torch.int8 and q.shape == (96, 256) and scales.shape == (96,)
    assert int(q.abs().amax()) == 127  # each channel's largest magnitude maps to 127
    bias = torch.randn(96)
    x = torch.randn(5, 256)
    torch.testing.assert_close(fx_weight_quant_forms.int8pack_linear(x, q, scales, 96, bias), x @ weight + bias, atol=0.5, rtol=0.02)  # |y| ~ 16, bf16 out
    snr = fx_weight_quant_forms.form_snr_db(lambda x: fx_weight_quant_forms.int8pack_linear(x, q, scales, 96, bias), weight, bias)
    assert 35.0 <= snr < 60.0, snr  # quantized (not exact), above the int8 budget


@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_the_cpu_times_its_packed_kernel_against_the_matmul_and_runs_the_faster(monkeypatch: pytest.MonkeyPatch, weights: str) -> None:
    form = PACKED[weights]
    timed = _timed(monkeypatch, {form: 1.0, "unquantized": 2.0})
    model = _tiny_llama()
    ids = torch.randint(0, 100, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    expected, expected_logits = _greedy(model.forward, model, ids)
    _, logits = _greedy(_compile(model, weights=weights), model, ids, forced=expected)

    assert set(timed) == {form, "unquantized"}, "the CPU's candidates: its packed kernel and the matmul as it was"
    gm = torch_backend.last_graph()
    assert _form_calls(gm, form) == LAYERS * GEMMS_PER_LAYER and _calls(gm)["graphopt.wq_linear.default"] == 0
    report = torch_backend.last_report()
    decision = _weight_decisions(report)["model.layers.0.mlp.down_proj"]
    assert (decision.chosen, decision.basis) == (form, "measured")
    assert {a.candidate: a.measured_ms for a in decision.alternatives} == {form: 1.0, "unquantized": 2.0}
    layer = next(layer for layer in report.weight_quantization.layers if layer.node == "model.layers.0.mlp.down_proj")
    assert layer.quantized and layer.layer_form == form and layer.snr_db is not None and layer.snr_db >= {"int4": 20, "int8": 35}[weights]
    assert 0 < report.weight_quantization.bytes_after < report.weight_quantization.bytes_before / (3 if weights == "int8" else 6)
    cosine = torch.nn.functional.cosine_similarity(logits.flatten(1), expected_logits.flatten(1)).min()
    assert cosine >= (0.9999 if weights == "int8" else 0.99), cosine
    assert not torch.allclose(logits, expected_logits, atol=1e-6), "the weights really were quantized"


def test_inside_the_margin_the_matmul_stays_as_it_came(monkeypatch: pytest.MonkeyPatch) -> None:
    _timed(monkeypatch, {"int4pack": 0.98, "unquantized": 1.0})  # 2 % faster: inside the 3 % margin
    model = _tiny_llama()
    ids = torch.randint(0, 100, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    _greedy(_compile(model, weights="int4"), model, ids)
    assert _form_calls(torch_backend.last_graph(), "int4pack") == 0
    report = torch_backend.last_report()
    assert report.passes["weight_quant"].changes == 0
    layers = [layer for layer in report.weight_quantization.layers if layer.node != "lm_head"]
    assert len(layers) == LAYERS * GEMMS_PER_LAYER and all(layer.reason == "speed_measured" for layer in layers)

    _timed(monkeypatch, {"int4pack": 0.96, "unquantized": 1.0})  # 4 %: outside it
    torch._dynamo.reset()
    _greedy(_compile(model, weights="int4"), model, ids)
    assert _form_calls(torch_backend.last_graph(), "int4pack") == LAYERS * GEMMS_PER_LAYER


def test_a_packed_form_under_the_budget_is_no_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    """int8pack has its own (per-channel) scales and a bf16 activation cast: its output SNR is measured,
    and below the budget it is refused even where it would be the fastest."""
    timed = _timed(monkeypatch, {"int8pack": 0.1, "unquantized": 1.0})
    monkeypatch.setattr(fx_weight_quant, "form_snr_db", lambda run, weight, bias: 30.0)
    model = _tiny_llama()
    ids = torch.randint(0, 100, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    expected, _ = _greedy(model.forward, model, ids)
    got, _ = _greedy(_compile(model, weights="int8"), model, ids)
    assert torch.equal(got, expected) and set(timed) == {"unquantized"}
    decision = _weight_decisions(torch_backend.last_report())["model.layers.0.mlp.down_proj"]
    assert decision.chosen == "unquantized" and "int8pack refused: SNR 30.0 dB < 35" in decision.reason


def test_the_cpu_clock_times_the_real_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    """No stand-in: the host clock times int4pack against fp32 on the tiny model's shapes (whichever
    wins, every site is decided by measurement, and the generation matches eager's closely)."""
    monkeypatch.setattr(fx_weight_quant_forms, "_TIMES", {})
    model = _tiny_llama()
    ids = torch.randint(0, 100, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    expected, expected_logits = _greedy(model.forward, model, ids)
    _, logits = _greedy(_compile(model, weights="int4"), model, ids, forced=expected)
    decisions = [d for d in _weight_decisions(torch_backend.last_report()).values() if d.site != "lm_head"]
    assert len(decisions) == LAYERS * GEMMS_PER_LAYER
    for decision in decisions:
        assert decision.basis == "measured" and decision.chosen in ("int4pack", "unquantized")
        times = {a.candidate: a.measured_ms for a in decision.alternatives}
        assert set(times) == {"int4pack", "unquantized"} and all(ms > 0 for ms in times.values())
    torch.testing.assert_close(logits, expected_logits, atol=0.25, rtol=0)


def test_the_host_clock_flushes_the_cpu_cache_between_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gpu_timing._cpu_flush_bytes() >= 64 << 20  # more than this machine's last-level cache
    monkeypatch.setattr(gpu_timing, "_cpu_flush_bytes", lambda: 1 << 20)
    gpu_timing.release_timing_buffers()
    flushes = []
    buffer_sums = []

    def call() -> None:
        flushes.append(1)
        buffer = gpu_timing._FLUSH.get(torch.device("cpu"))
        buffer_sums.append(None if buffer is None else int(buffer[0]))

    ms = gpu_timing.gpu_time_ms(call, runs=4, warmup=2)
    assert ms >= 0 and len(flushes) == 6
    assert buffer_sums == [None, None, 1, 2, 3, 4], "written before each timed run, not before the warm-ups"
    gpu_timing.release_timing_buffers()
    assert not gpu_timing._FLUSH
