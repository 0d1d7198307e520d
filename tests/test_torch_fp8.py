"""precision="fp8" on the torch path (graphopt/passes/fx_fp8.py, issue 18 item 2).

No FP8 GPU here: the rewrite is exercised on CPU with the device check replaced (torch's CPU
`_scaled_mm` takes float8_e4m3fn with per-row scales), and its outputs compared with the same
model where every converted Linear is emulated (x and W quantized per row, dequantized, in
fp32). Without the replacement, the CPU is refused with the report line and the graph stays.
Inductor is off (it compiles C++ here, a minute a graph); benchmarks/fp8_bench.py runs the real
thing on the GPU.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch
import transformers
from test_report import validate

from graphopt import torch_backend
from graphopt.errors import GraphoptError
from graphopt.passes import fx_fp8
from graphopt.report.render import report_to_json
from graphopt.torch_options import TorchOptions

pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py

aten = torch.ops.aten


@pytest.fixture
def fp8_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the pass rewrite CPU graphs (the CPU _scaled_mm runs them)."""
    monkeypatch.setattr(fx_fp8, "device_refusal", lambda device: None)


def _tiny_llama() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    # vocab 128: the lm head is a 16-aligned GEMM, kept by name (not because it cannot run in FP8).
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=128, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).eval()


def _compiled(model: torch.nn.Module, **options: object) -> torch.nn.Module:
    torch._dynamo.reset()
    return torch.compile(model, backend="graphopt", options={"precision": "fp8", "inductor": False, **options})  # type: ignore[return-value]


def _scaled_mms(gm: torch.fx.GraphModule | None) -> int:
    assert gm is not None
    return sum(1 for n in gm.graph.nodes if n.target is aten._scaled_mm.default)


def _decisions(report: object) -> dict[str, str]:
    return {d.site: d.chosen for d in report.decisions if d.kind == "precision_fp8"}  # type: ignore[attr-defined]


class _EmulatedLinear(torch.nn.Module):
    """A Linear as the FP8 GEMM computes it: x and W quantized per row, dequantized, in fp32."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def dq(t: torch.Tensor) -> torch.Tensor:
            q, scale = fx_fp8.quantize_rows(t.reshape(-1, t.shape[-1]))
            return (q.float() * scale).reshape(t.shape)

        y = dq(x) @ dq(self.linear.weight).t()
        return (y if self.linear.bias is None else y + self.linear.bias).to(x.dtype)


def _emulated(model: torch.nn.Module, keep: tuple[str, ...] = ("lm_head",)) -> torch.nn.Module:
    import copy

    model = copy.deepcopy(model)
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear) and not any(k in f"{name}.{child_name}" for k in keep):
                setattr(module, child_name, _EmulatedLinear(child))
    return model


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


# --------------------------------------------------------------------------- options


def test_options_take_fp8_and_a_keep_list() -> None:
    opts = TorchOptions.parse({"precision": "fp8", "precision_keep": "*.lm_head.*"})
    assert (opts.precision, opts.precision_keep) == ("fp8", ["*.lm_head.*"])
    assert TorchOptions.parse({}).precision is None


@pytest.mark.parametrize(("options", "message"), [
    ({"precision": "fp4"}, "takes 'fp8' or None"),
    ({"precision": "FP16"}, "takes 'fp8' or None"),
    ({"precision": "fp8", "freeze": False}, "needs freeze=True"),
    ({"precision_keep": ["lm_head"]}, "only applies with precision='fp8'"),
    ({"precision": "fp8", "precision_keep": [3]}, "list of name patterns"),
    ({"precision": "fp8", "weights": "int4"}, "two ways to quantize the same GEMMs"),
])
def test_bad_fp8_options_fail_before_dynamo(options: dict[str, object], message: str) -> None:
    with pytest.raises(GraphoptError, match=message):
        torch_backend.check_options(options)


# --------------------------------------------------------------------------- quantization and the budget


def test_quantize_rows_round_trip_within_e4m3_precision() -> None:
    t = torch.randn(32, 64) * torch.logspace(-3, 3, 32)[:, None]  # rows six decades apart: per-row scales
    t[5] = 0.0
    q, scale = fx_fp8.quantize_rows(t)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (32, 1) and scale.dtype == torch.float32
    back = q.float() * scale
    assert torch.equal(back[5], torch.zeros(64))  # an all-zero row: zeros, not NaN
    assert float(q.float().abs().amax()) == 448.0
    normal = t.abs() >= scale * 2.0**-6  # E4M3's normal range: relative error at most 2^-4
    assert ((back - t).abs() <= t.abs() * 2.0**-4 + 1e-30)[normal].all()


def test_snr_of_a_normal_weight_is_above_the_budget_and_of_a_broken_one_below() -> None:
    weight = torch.randn(128, 256, generator=torch.Generator().manual_seed(1))
    snr = fx_fp8.snr_db(weight)
    assert fx_fp8.FP8_BUDGET_DB < snr < 32  # E4M3 keeps 3 mantissa bits: about 28-29 dB for both operands
    outlier = weight.clone()
    outlier[:, 7] *= 1000  # an outlier input channel: per-row scales keep the layer within budget
    assert fx_fp8.snr_db(outlier) > fx_fp8.FP8_BUDGET_DB
    broken = weight.clone()
    broken[3, 3] = math.inf
    assert fx_fp8.snr_db(broken) == -math.inf


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(64, 128)
        self.down = torch.nn.Linear(128, 64, bias=False)
        self.out = torch.nn.Linear(64, 256, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.down(torch.relu(self.up(x))))


def test_a_layer_under_budget_stays_and_is_named(fp8_on_cpu: None, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = _Mlp().eval()
    with torch.no_grad():
        model.down.weight[0, 0] = math.inf  # this layer's FP8 form is not finite: under any budget
    compiled = _compiled(model)
    with torch.no_grad():
        compiled(torch.randn(4, 64))
    report = torch_backend.last_report()
    assert _decisions(report) == {"up.weight": "fp8", "down.weight": "model type", "out.weight": "model type"}
    reasons = {d.site: d.reason for d in report.decisions}
    assert "under the 25 dB budget" in reasons["down.weight"] and "lm head" in reasons["out.weight"]
    assert any("down.weight" in w and "kept" in w for w in report.warnings)
    assert _scaled_mms(torch_backend.last_graph()) == 1
    summary = report.weight_quantization  # the same per-layer rows as weights int4/int8
    assert summary is not None and (summary.weights, summary.quantized, summary.kept, summary.min_snr_db) == ("fp8", 1, 2, 25.0)
    layers = {layer.node: layer for layer in summary.layers}
    assert layers["up.weight"].layer_form == "_scaled_mm" and layers["up.weight"].snr_db is not None and layers["up.weight"].snr_db > 25
    assert (layers["down.weight"].reason, layers["out.weight"].reason) == ("budget", "lm_head")
    assert (layers["up.weight"].k, layers["up.weight"].n) == (64, model.up.weight.shape[0])
    up = layers["up.weight"]
    assert "kept: down.weight (matmul 128x64): SNR -inf dB under the 25 dB budget" in str(report), str(report)
    assert f"fp8: up.weight ({up.op} 64x{up.n}): _scaled_mm, SNR {up.snr_db:.1f} dB" in str(report)
    validate(json.loads(report_to_json(report)))  # tests/test_report.py: the schema (the -inf weight SNR written as valid JSON)

    # A stricter budget (40 dB, above E4M3's ~28.5 dB) keeps every layer.
    monkeypatch.setattr(fx_fp8, "FP8_BUDGET_DB", 40.0)
    compiled = _compiled(_Mlp().eval(), precision_keep=[])
    with torch.no_grad():
        compiled(torch.randn(4, 64))
    assert set(_decisions(torch_backend.last_report()).values()) == {"model type"}
    assert _scaled_mms(torch_backend.last_graph()) == 0


def test_mlp_outputs_match_emulated_fp8(fp8_on_cpu: None) -> None:
    torch.manual_seed(0)
    model = _Mlp().eval()
    x = torch.randn(3, 5, 64)
    with torch.no_grad():
        got, want, exact = _compiled(model)(x), _emulated(model, keep=("out",))(x), model(x)
    # The unnamed last GEMM with the largest N is taken for the lm head and kept.
    assert _decisions(torch_backend.last_report()) == {"up.weight": "fp8", "down.weight": "fp8", "out.weight": "model type"}
    assert _relative(got, want) < 1e-3 < _relative(got, exact) < 0.1


class _TransposedInput(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(32, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.t())  # A is a column-major view: quantized into a row-major copy


def test_a_transposed_activation_is_quantized_row_major(fp8_on_cpu: None) -> None:
    torch.manual_seed(0)
    model = _TransposedInput().eval()
    x = torch.randn(32, 6)
    with torch.no_grad():
        got, want = _compiled(model, precision_keep=[])(x), _emulated(model, keep=())(x)
    gm = torch_backend.last_graph()
    assert _scaled_mms(gm) == 1 and gm is not None
    (scaled_mm,) = (n for n in gm.graph.nodes if n.target is aten._scaled_mm.default)
    assert scaled_mm.args[0].meta["val"].is_contiguous()  # CUDA's _scaled_mm takes row-major A only (CPU's takes any)
    assert scaled_mm.args[1].meta["val"].stride() == (1, 32)  # B column-major
    assert _relative(got, want) < 1e-3


# --------------------------------------------------------------------------- the tiny LLaMA


@pytest.mark.parametrize(("keep", "fp8_sites", "kept"), [
    # Per layer: q|k|v packed into one GEMM, o, gate|up packed, down: 4 GEMMs; the lm head kept.
    (None, 8, {"lm_head.weight"}),
    ([], 9, set()),
    (["*.mlp.*"], 5, {"model.layers.0.mlp.gate_proj.weight+model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
                      "model.layers.1.mlp.gate_proj.weight+model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight"}),
])
def test_tiny_llama_fp8_sites_and_kept_layers(fp8_on_cpu: None, keep: list[str] | None, fp8_sites: int, kept: set[str]) -> None:
    model = _tiny_llama()
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    options = {} if keep is None else {"precision_keep": keep}
    with torch.no_grad():
        got = _compiled(model, **options)(input_ids=ids, use_cache=False).logits
        exact = model(input_ids=ids, use_cache=False).logits
    decisions = _decisions(torch_backend.last_report())
    assert _scaled_mms(torch_backend.last_graph()) == fp8_sites
    assert {site for site, chosen in decisions.items() if chosen != "fp8"} == kept
    assert Counter(decisions.values())["fp8"] == fp8_sites
    if keep is None:
        with torch.no_grad():
            want = _emulated(model)(input_ids=ids, use_cache=False).logits
        assert _relative(got, want) < 1e-2 < _relative(got, exact) < 0.1
        assert (got.argmax(-1) == exact.argmax(-1)).float().mean() > 0.8


def test_inductor_is_handed_the_fp8_graph(fp8_on_cpu: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With inductor (the default) inductor gets graphopt's graph with the activation quantize as
    plain ATen ops before each _scaled_mm (inductor fuses them into the producer); a stand-in runs
    it here (inductor compiles C++ on this machine, a minute a graph)."""
    handed: list[torch.fx.GraphModule] = []

    def run_as_given(gm: torch.fx.GraphModule, inputs: object, opts: object, dynamo_gm: object) -> torch.fx.GraphModule:
        handed.append(gm)
        return gm

    monkeypatch.setattr(torch_backend, "_inductor", run_as_given)
    model = _Mlp().eval()
    x = torch.randn(4, 64)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt", options={"precision": "fp8"})(x)
        want = _emulated(model, keep=("out",))(x)
    assert len(handed) == 1 and _scaled_mms(handed[0]) == 2
    quantize = Counter(str(n.target) for n in handed[0].graph.nodes if n.op == "call_function")
    assert quantize["aten.amax.default"] == 2 and quantize["aten.clamp.default"] == 2
    assert not any(str(n.target).startswith("graphopt.") for n in handed[0].graph.nodes)  # no custom op between producer and quantize
    assert _relative(got, want) < 1e-3


def test_cpu_is_refused_with_one_line_and_the_graph_unchanged() -> None:
    model = _Mlp().eval()
    with pytest.warns(RuntimeWarning, match="fp8: not supported on this device"):
        with torch.no_grad():
            _compiled(model)(torch.randn(4, 64))
    report = torch_backend.last_report()
    assert any(w.startswith("fp8: not supported on this device (cpu; needs compute capability ≥ 8.9)") for w in report.warnings)
    assert _scaled_mms(torch_backend.last_graph()) == 0 and not _decisions(report)


# --------------------------------------------------------------------------- measured against the GEMM as it is


@pytest.mark.parametrize(("fp8_ms", "converted"), [(0.5, True), (0.99, False), (1.5, False)])
def test_fp8_is_kept_only_where_measured_faster(fp8_on_cpu: None, monkeypatch: pytest.MonkeyPatch, fp8_ms: float, converted: bool) -> None:
    # On CUDA each GEMM shape is timed both ways (at one row, a decode step, FP8 lost on an H100);
    # here a stand-in timer decides.
    from graphopt.passes import fx_weight_quant_forms

    monkeypatch.setattr(fx_fp8, "MEASURE_OFF_CUDA", True)
    monkeypatch.setattr(fx_weight_quant_forms, "_TIMES", {})
    monkeypatch.setattr(fx_weight_quant_forms, "TIMER", lambda name, fn: (fn(), fp8_ms if name == "fp8" else 1.0)[1])
    torch.manual_seed(0)
    with torch.no_grad():
        _compiled(_Mlp().eval())(torch.randn(4, 64))
    report = torch_backend.last_report()
    decisions = _decisions(report)
    assert decisions["up.weight"] == ("fp8" if converted else "model type") and decisions["down.weight"] == decisions["up.weight"]
    if not converted:
        assert "measured no faster in FP8 at 4 row(s)" in {d.site: d.reason for d in report.decisions}["up.weight"]
    assert _scaled_mms(torch_backend.last_graph()) == (2 if converted else 0)
