"""graphopt::gemv_linear (graphopt/kernels/gemv.py) as the op and as a site inductor autotunes
(options={"gemv": True}: graphopt/passes/fx_gemv.py writes graphopt::tuned_gemv_linear, graphopt/inductor_choices.py
registers it with inductor's custom-op autotuning).

On the CPU: the op's reference and fake kernels; which GEMMs become sites (fx_gemv.OFFER_OFF_CUDA lets the CPU stand in
for CUDA, as sites are written only there); and that inductor keeps graphopt's kernel only where its timing wins (the
autotuner's benchmarks patched: the op itself, graphopt's kernel, is the extern fallback choice; inductor's compiled
linear the subgraph choice). The kernel's own cases: tests/test_gemv_kernel.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn as nn

import graphopt
import graphopt.inductor_choices  # noqa: F401  (registers torch.ops.graphopt.tuned_gemv_linear)
import graphopt.kernels  # noqa: F401  (registers torch.ops.graphopt.gemv_linear)
from graphopt.errors import GraphoptError
from graphopt.passes import fx_gemv
from graphopt.torch_backend import last_graph
from graphopt.torch_options import TorchOptions

pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py
F16 = torch.float16
TUNED = "graphopt.tuned_gemv_linear.default"


@pytest.fixture
def fresh_inductor() -> Iterator[None]:
    """No FX-graph or autotune cache from another test (a cached compile would skip the autotuning)."""
    from torch._inductor.utils import fresh_cache

    with fresh_cache():
        yield


@pytest.fixture
def cpu_sites(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fx_gemv, "OFFER_OFF_CUDA", True)


def _timed(monkeypatch: pytest.MonkeyPatch, graphopt_ms: float, inductor_ms: float) -> list[str]:
    """Fixed times for the autotuner's two kinds of choice; returns the names of the choices it timed."""
    from torch._inductor.codegen.subgraph import SubgraphChoiceCaller
    from torch._inductor.select_algorithm import ExternKernelCaller

    seen: list[str] = []

    def timed(ms: float) -> Any:
        def benchmark(self: Any, *args: Any, out: Any) -> float:
            seen.append(self.name)
            return ms
        return benchmark

    monkeypatch.setattr(ExternKernelCaller, "benchmark", timed(graphopt_ms))  # the op itself: graphopt's kernel
    monkeypatch.setattr(SubgraphChoiceCaller, "benchmark", timed(inductor_ms))  # inductor's compiled linear
    return seen


class Mlp(nn.Module):
    """A bias-free linear on a 3-D input (aten.matmul / mm of a transposed weight) and a biased one (addmm)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 48, bias=False)
        self.down = nn.Linear(48, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class Projections(nn.Module):
    """Three projections of one input: packed into one GEMM with a [K, N] constant (graphopt.passes.fx_pack)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(64, 32, bias=False), nn.Linear(64, 16, bias=False), nn.Linear(64, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.relu(self.q(x)), torch.tanh(self.k(x)), self.v(x)], dim=-1)


def _compile(model: nn.Module, x: torch.Tensor, **options: Any) -> tuple[torch.Tensor, str]:
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with torch.no_grad():
        out, codes = run_and_get_code(torch.compile(model, backend="graphopt", options={"mode": "reduce-overhead", **options}), x)
    return out, codes[-1] if codes else ""


def _sites() -> list[torch.fx.Node]:
    gm = last_graph()
    assert gm is not None
    return [n for n in gm.graph.nodes if n.op == "call_function" and str(n.target) == TUNED]


def _gemv_decisions() -> list[Any]:
    report = graphopt.last_report()
    assert report is not None
    return [d for d in report.decisions if d.kind == "kernel" and any(a.candidate == "graphopt::gemv_linear" for a in d.alternatives)]


# --------------------------------------------------------------------------- the op


@pytest.mark.parametrize("dtype", [torch.float32, F16, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_the_op_on_cpu_is_torchs_linear(dtype: torch.dtype, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 3, 40, generator=gen).to(dtype), torch.randn(24, 40, generator=gen).to(dtype)
    bias = torch.randn(24, generator=gen).to(dtype) if with_bias else None
    got = torch.ops.graphopt.gemv_linear(x, w, bias)
    assert got.shape == (2, 3, 24) and got.dtype == dtype
    assert torch.equal(got, torch.nn.functional.linear(x, w, bias))
    no_bias = torch.zeros(0, dtype=dtype)
    assert torch.equal(torch.ops.graphopt.tuned_gemv_linear(x, w, bias if with_bias else no_bias), got)


def test_fake_kernels_give_the_shape_and_check_it() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w, b = torch.empty(5, 1, 96, dtype=F16), torch.empty(40, 96, dtype=F16), torch.empty(40, dtype=F16)
        assert torch.ops.graphopt.gemv_linear(x, w, b).shape == (5, 1, 40)
        assert torch.ops.graphopt.tuned_gemv_linear(x, w, torch.empty(0, dtype=F16)).shape == (5, 1, 40)
        with pytest.raises(RuntimeError, match="must end in K = 96"):
            torch.ops.graphopt.gemv_linear(torch.empty(1, 95, dtype=F16), w, None)
        with pytest.raises(RuntimeError, match="bias"):
            torch.ops.graphopt.gemv_linear(x, w, torch.empty(39, dtype=F16))


def test_the_option_is_a_bool_and_off_by_default() -> None:
    assert TorchOptions.parse({}).gemv is False and TorchOptions.parse({"gemv": True}).gemv is True
    with pytest.raises(GraphoptError, match="'gemv' takes True or False"):
        TorchOptions.parse({"gemv": "yes"})


# --------------------------------------------------------------------------- offered, then decided by inductor's timing


@pytest.mark.parametrize("graphopt_wins", [True, False])
def test_inductor_keeps_the_faster_side_per_site(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None, cpu_sites: None,
                                                 graphopt_wins: bool) -> None:
    seen = _timed(monkeypatch, graphopt_ms=1.0 if graphopt_wins else 3.0, inductor_ms=2.0)
    torch.manual_seed(0)
    model = Mlp().eval().to(F16)
    x = torch.randn(1, 3, 64, dtype=F16)
    out, code = _compile(model, x, gemv=True)
    torch.testing.assert_close(out, model(x), atol=2e-3, rtol=2e-3)
    sites = _sites()
    assert len(sites) == 2
    weights = [s.args[1].meta["val"] for s in sites]
    assert [tuple(w.shape) for w in weights] == [(48, 64), (32, 48)] and all(w.is_contiguous() for w in weights)
    assert [s.args[2].meta["val"].numel() for s in sites] == [0, 32]  # absent bias: 0 elements; the addmm's bias
    gm = last_graph()
    assert gm is not None  # nn.Linear's weight is the kernel's operand as it is: nothing copied
    assert [getattr(gm, str(s.args[1].target)).data_ptr() for s in sites] == [model.up.weight.data_ptr(), model.down.weight.data_ptr()]
    assert any(name.endswith("_fallback") for name in seen) and any("linear_by_inductor" in name for name in seen)
    decisions = _gemv_decisions()
    assert len(decisions) == 2
    assert {d.chosen for d in decisions} == {"graphopt" if graphopt_wins else "inductor"}
    assert all(d.basis == "measured" for d in decisions)
    assert all(f"graphopt {'2.00' if graphopt_wins else '0.67'}x" in d.reason for d in decisions)
    # graphopt's kernel is called only where it won; else inductor inlined its own linear
    assert code.count("torch.ops.graphopt.tuned_gemv_linear.default(") == (2 if graphopt_wins else 0)


def test_every_site_gets_graphopts_kernel_as_a_choice(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None,
                                                      cpu_sites: None) -> None:
    """An older inductor skips the fallback choice where extern_kernels already has its name (registered at the first
    site): the name is removed before each gemv site is lowered."""
    from torch._inductor.select_algorithm import extern_kernels

    stale = "graphopt_gemv_linear_fallback_default"
    placeholder = lambda *args: None  # noqa: E731
    setattr(extern_kernels, stale, placeholder)
    seen = _timed(monkeypatch, graphopt_ms=1.0, inductor_ms=2.0)
    model = Mlp().eval().to(F16)
    try:
        _compile(model, torch.randn(1, 3, 64, dtype=F16), gemv=True)
        assert getattr(extern_kernels, stale, None) is not placeholder
    finally:
        if getattr(extern_kernels, stale, None) is placeholder:
            delattr(extern_kernels, stale)
    assert sum(name.endswith("_fallback") or name.endswith("_fallback_default") for name in seen) == 2  # one per site
    assert len(_gemv_decisions()) == 2


class NormedLinear(nn.Module):
    """An RMSNorm feeding a linear, as every decoder layer's q/k/v: inductor fuses the norm into a Pointwise that
    the GEMM site reads unrealized (on torch 2.11 the custom-op autotuning then failed reading its strides)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(64))
        self.proj = nn.Linear(64, 48, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * self.weight
        return self.proj(normed)


@pytest.mark.parametrize("graphopt_wins", [True, False])
def test_a_site_reading_a_fused_norm_compiles(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None, cpu_sites: None,
                                              graphopt_wins: bool) -> None:
    _timed(monkeypatch, graphopt_ms=1.0 if graphopt_wins else 3.0, inductor_ms=2.0)
    torch.manual_seed(0)
    model = NormedLinear().eval().to(F16)
    x = torch.randn(1, 1, 64, dtype=F16)
    out, _ = _compile(model, x, gemv=True)
    torch.testing.assert_close(out, model(x), atol=2e-3, rtol=2e-3)
    assert len(_sites()) == 1 and len(_gemv_decisions()) == 1


def test_site_lowerings_realize_their_tensor_inputs_first() -> None:
    # torch 2.11's custom-op autotuning reads every input's strides; an unrealized Pointwise has none. The
    # lowering graphopt registers realizes tensor arguments (TensorBoxes: anything with realize()) before it.
    from graphopt.inductor_choices import realizing_inputs

    class Box:
        def __init__(self) -> None:
            self.realized = False

        def realize(self) -> None:
            self.realized = True

    seen: list[bool] = []
    lower = realizing_inputs(lambda *args, **kwargs: seen.extend(a.realized for a in args if isinstance(a, Box)) or "lowered")
    boxes = [Box(), Box()]
    assert lower(boxes[0], boxes[1], 4, bits=4) == "lowered" and seen == [True, True]


def test_a_tie_keeps_inductor(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None, cpu_sites: None) -> None:
    _timed(monkeypatch, graphopt_ms=2.0, inductor_ms=2.0)
    model = nn.Linear(32, 16).eval().to(F16)
    _, code = _compile(model, torch.randn(4, 32, dtype=F16), gemv=True)
    (decision,) = _gemv_decisions()
    assert decision.chosen == "inductor" and "torch.ops.graphopt.tuned_gemv_linear.default(" not in code and "extern_kernels.addmm" in code


def test_a_packed_weight_is_transposed_once(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None, cpu_sites: None) -> None:
    """Projection packing writes x @ [Wq | Wk | Wv] as a [K, N] constant: the site gets it as [N, K], contiguous."""
    _timed(monkeypatch, graphopt_ms=1.0, inductor_ms=2.0)
    torch.manual_seed(0)
    model = Projections().eval().to(F16)
    x = torch.randn(2, 64, dtype=F16)
    out, _ = _compile(model, x, gemv=True)
    torch.testing.assert_close(out, model(x), atol=2e-3, rtol=2e-3)
    (site,) = _sites()
    gm = last_graph()
    assert gm is not None and site.args[1].op == "get_attr"
    weight = getattr(gm, str(site.args[1].target))
    assert tuple(weight.shape) == (64, 64) and weight.is_contiguous()
    assert torch.equal(weight, torch.cat([model.q.weight, model.k.weight, model.v.weight]))


@pytest.mark.parametrize("case", ["rows_above_16", "fp32", "option_off", "not_cuda", "symbolic_rows", "no_inductor", "no_cuda_graphs"])
def test_gemms_not_offered(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None, case: str) -> None:
    if case != "not_cuda":
        monkeypatch.setattr(fx_gemv, "OFFER_OFF_CUDA", True)
    seen = _timed(monkeypatch, graphopt_ms=1.0, inductor_ms=2.0)
    torch.manual_seed(0)
    model = Mlp().eval().to(torch.float32 if case == "fp32" else F16)
    rows = 17 if case == "rows_above_16" else 3
    x = torch.randn(1, rows, 64, dtype=torch.float32 if case == "fp32" else F16)
    options: dict[str, Any] = {"gemv": case != "option_off"}
    if case == "no_inductor":
        options["inductor"] = False
    if case == "no_cuda_graphs":
        options["mode"] = "default"
    if case == "symbolic_rows":
        torch._dynamo.reset()
        torch._dynamo.mark_dynamic(x, 1)
        with torch.no_grad():
            out = torch.compile(model, backend="graphopt", options={"mode": "reduce-overhead", **options})(x)
    else:
        out, _ = _compile(model, x, **options)
    torch.testing.assert_close(out, model(x), atol=2e-3, rtol=2e-3)
    gm = last_graph()
    assert gm is not None and not _sites() and not _gemv_decisions()
    assert not any("gemv_linear" in name for name in seen)
    report = graphopt.last_report()
    assert report is not None
    if case == "no_inductor":
        assert any("gemv: no graphopt::gemv_linear site written: it needs inductor" in w for w in report.warnings)
    elif case == "no_cuda_graphs":
        assert any("gemv: no graphopt::gemv_linear site written: it needs inductor's CUDA graphs" in w for w in report.warnings)
    else:
        assert not any(w.startswith("gemv:") for w in report.warnings)


def test_a_llama_decode_step_offers_every_gemm_and_prefill_none(monkeypatch: pytest.MonkeyPatch, cpu_sites: None) -> None:
    """A tiny LLaMA (2 layers) in fp16 with a static cache: the decode step's GEMMs at 2 rows (batch 2) become sites
    (per layer the packed q|k|v, o_proj, the packed gate|up, down_proj; the LM head), the prefill's 24 rows none.
    inductor's place is taken by a stand-in that runs the graph as given (the sites' op runs its CPU reference)."""
    import inspect
    import warnings

    import transformers

    from graphopt import torch_backend

    handed: list[torch.fx.GraphModule] = []

    def run_as_given(gm: torch.fx.GraphModule, inputs: Any, opts: Any, dynamo_gm: Any) -> Any:
        handed.append(gm)
        return gm

    monkeypatch.setattr(torch_backend, "_inductor", run_as_given)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=100, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).eval().to(F16)
    key = "cache" if "cache" in inspect.signature(transformers.LlamaForCausalLM.forward).parameters else "past_key_values"
    ids = torch.randint(0, 100, (2, 12))

    def greedy(forward: Any) -> tuple[torch.Tensor, torch.Tensor]:
        cache = transformers.StaticCache(config=model.config, max_cache_len=32)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            out = forward(input_ids=ids, cache_position=torch.arange(12), use_cache=True, **{key: cache})
            tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
            for step in range(3):
                out = forward(input_ids=tokens[-1], cache_position=torch.tensor([12 + step]), use_cache=True, **{key: cache})
                tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
        return torch.cat(tokens, 1), out.logits

    expected, expected_logits = greedy(model.forward)
    torch._dynamo.reset()
    torch_backend.clear_reports()
    got, logits = greedy(torch.compile(model.forward, backend="graphopt", fullgraph=True, options={"mode": "reduce-overhead", "gemv": True}))
    torch.testing.assert_close(logits.float(), expected_logits.float(), atol=2e-2, rtol=2e-2)
    assert torch.equal(got, expected), (got, expected)
    prefill, decode = handed[0], handed[-1]
    assert not [n for n in prefill.graph.nodes if str(n.target) == TUNED]
    sites = [n for n in decode.graph.nodes if str(n.target) == TUNED]
    shapes = sorted(tuple(s.args[1].meta["val"].shape) for s in sites)
    assert shapes == sorted([(128, 64), (64, 64), (256, 64), (64, 128)] * 2 + [(100, 64)])  # q|k|v: 64 + 2 * 32
    assert all(s.args[0].meta["val"].shape[:-1].numel() == 2 for s in sites)
