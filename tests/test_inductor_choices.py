"""graphopt's GEMM kernels against inductor's own code per call site (graphopt/inductor_sites.py for GEMM +
activation sites, decided before inductor lowers them; graphopt/inductor_choices.py for wq_linear, inside
inductor's autotuner; issue 15 item 1).

The times are fixed here (graphopt.inductor_sites.benchmark, or the autotuner's benchmarks patched) so that each
test decides which side wins; inductor's code for a site is still compiled. Where inductor wins, the generated
code must be inductor's own, byte for byte; where graphopt wins, it calls graphopt's kernel."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn as nn

import graphopt
from graphopt import inductor_choices, inductor_sites
from graphopt.torch_backend import last_graph

aten = torch.ops.aten
pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py


class LinearRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


@pytest.fixture
def fresh_inductor() -> Iterator[None]:
    """No FX-graph or autotune cache from another test; only ATen's GEMMs as inductor's choices
    (its C++ GEMM template would compile for a minute)."""
    from torch._inductor import config
    from torch._inductor.utils import fresh_cache

    with fresh_cache(), config.patch(max_autotune_gemm_backends="ATEN", max_autotune_report_choices_stats=False):
        yield


def _fixed_site_times(monkeypatch: pytest.MonkeyPatch, graphopt_ms: float, inductor_ms: float) -> list[str]:
    """A site's two sides take fixed times (graphopt.inductor_sites.benchmark); inductor's code for the site is still
    compiled. Returns the sides timed, in order."""
    seen: list[str] = []

    def benchmark(side: str, fn: Any, inputs: Any, replay: bool) -> float:
        seen.append(side)
        return graphopt_ms if side == "graphopt" else inductor_ms

    monkeypatch.setattr(inductor_sites, "benchmark", benchmark)
    return seen


@pytest.fixture(autouse=True)
def fresh_site_timings() -> Iterator[None]:
    inductor_sites.clear_site_timings()
    yield
    inductor_sites.clear_site_timings()


SITES = {"mode": "max-autotune-no-cudagraphs", "autotune_kernels": True}


def _compile_and_code(model: nn.Module, x: torch.Tensor, backend: str = "graphopt", **kwargs: Any) -> tuple[torch.Tensor, str]:
    """The model's output and the code inductor generated for it (the last module: a site's own compile comes before)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with torch.no_grad():
        out, codes = run_and_get_code(torch.compile(model, backend=backend, **kwargs), x)
    return out, codes[-1]


def _inductor_alone(model: nn.Module, x: torch.Tensor) -> str:
    return _compile_and_code(model, x, backend="inductor", mode="max-autotune-no-cudagraphs")[1]


def _kernel_decisions() -> list[Any]:
    report = graphopt.last_report()
    assert report is not None
    return [d for d in report.decisions if d.kind == "kernel"]


def _targets() -> list[Any]:
    gm = last_graph()
    assert gm is not None
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _times(decision: Any) -> dict[str, float | None]:
    return {a.candidate.split(" (")[0]: a.measured_ms for a in decision.alternatives}


@pytest.mark.parametrize("shape", [(8, 16), (2, 5, 16)])  # 3-D: x viewed as [10, 16] and back
def test_where_inductor_wins_the_code_is_inductors_alone(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None,
                                                         shape: tuple[int, ...]) -> None:
    """The site's rewrite is declined: the graph goes to inductor as dynamo captured it, and the generated code is
    byte for byte inductor's (its addmm, the ReLU in inductor's own kernel after it, the same kernels)."""
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(*shape)
    seen = _fixed_site_times(monkeypatch, graphopt_ms=3.0, inductor_ms=2.0)
    out, code = _compile_and_code(model, x, options=SITES)
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    assert seen == ["inductor", "graphopt"]  # both timed, once

    (decision,) = _kernel_decisions()
    assert decision.chosen == "inductor" and decision.basis == "measured" and decision.baseline == "inductor"
    assert _times(decision) == {"graphopt::linear_act": 3.0, "inductor addmm + relu": 2.0}
    assert "graphopt 0.67x" in decision.reason and "16 @ 16x32 + bias, relu]" in decision.site
    assert torch.ops.graphopt.tuned_linear_act.default not in _targets()
    assert "graphopt" not in code and "extern_kernels.addmm" in code and "cpp_fused_relu" in code
    assert code == _inductor_alone(model, x)


class ConvThenLinearRelu(nn.Module):
    """Conv + BatchNorm (graphopt folds them: the graph goes graphopt's way), then a GEMM + ReLU site."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.linear = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Linear(4 * 4 * 4, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(self.bn(self.conv(x)).flatten(1)))


def test_where_inductor_wins_beside_other_rewrites_the_site_is_untouched(monkeypatch: pytest.MonkeyPatch,
                                                                         fresh_inductor: None) -> None:
    """With another rewrite the graph is graphopt's; the declined site leaves it as without any site: the same graph
    handed to inductor, the same code."""
    torch.manual_seed(0)
    model = ConvThenLinearRelu().eval()
    x = torch.randn(2, 3, 6, 6)
    _fixed_site_times(monkeypatch, graphopt_ms=3.0, inductor_ms=2.0)
    out, code = _compile_and_code(model, x, options=SITES)
    torch.testing.assert_close(out, model(x), atol=1e-4, rtol=1e-4)
    report = graphopt.last_report()
    assert report is not None and report.rules["FoldConvBatchNorm"].applications == 1
    (decision,) = _kernel_decisions()
    assert decision.chosen == "inductor"
    with_sites = last_graph()
    assert with_sites is not None and aten.addmm.default in _targets() and aten.relu.default in _targets()

    _, code_without = _compile_and_code(model, x, options={"mode": "max-autotune-no-cudagraphs"})
    without = last_graph()
    assert without is not None and not _kernel_decisions()
    assert with_sites.code == without.code and code == code_without


@pytest.mark.parametrize("shape", [(8, 16), (2, 5, 16)])
def test_where_graphopt_wins_the_code_calls_its_kernel(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None,
                                                       shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(*shape)
    _fixed_site_times(monkeypatch, graphopt_ms=1.0, inductor_ms=2.0)
    out, code = _compile_and_code(model, x, options=SITES)
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    (decision,) = _kernel_decisions()
    assert decision.chosen == "graphopt" and decision.basis == "measured"
    assert _times(decision) == {"graphopt::linear_act": 1.0, "inductor addmm + relu": 2.0} and "graphopt 2.00x" in decision.reason
    assert _targets().count(torch.ops.graphopt.tuned_linear_act.default) == 1
    assert "torch.ops.graphopt.linear_act.default" in code and "extern_kernels.addmm" not in code and "cpp_fused_relu" not in code


def test_a_near_tie_keeps_inductor(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None) -> None:
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    _fixed_site_times(monkeypatch, graphopt_ms=1.96, inductor_ms=2.0)  # 2 % faster: under WIN_MARGIN
    _compile_and_code(model, x, options=SITES)
    (decision,) = _kernel_decisions()
    assert decision.chosen == "inductor" and "a tie" in decision.reason
    assert torch.ops.graphopt.tuned_linear_act.default not in _targets()


def test_a_win_from_one_slow_moment_is_not_kept(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None) -> None:
    """inductor's side slow in the first round only: the second round (each side's better time) keeps inductor."""
    times = {"inductor": [5.0, 1.5], "graphopt": [2.0, 2.0]}

    def benchmark(side: str, fn: Any, inputs: Any, replay: bool) -> float:
        return times[side].pop(0)

    monkeypatch.setattr(inductor_sites, "benchmark", benchmark)
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    _, code = _compile_and_code(model, x, options=SITES)
    (decision,) = _kernel_decisions()
    assert decision.chosen == "inductor" and _times(decision) == {"graphopt::linear_act": 2.0, "inductor addmm + relu": 1.5}
    assert times == {"inductor": [], "graphopt": []} and "graphopt" not in code


class TwoLinearRelus(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.second(torch.relu(self.first(x))))


def test_one_timing_per_shape_one_decision_per_site(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None) -> None:
    torch.manual_seed(0)
    model = TwoLinearRelus().eval()
    x = torch.randn(8, 16)
    seen = _fixed_site_times(monkeypatch, graphopt_ms=1.0, inductor_ms=2.0)
    out, code = _compile_and_code(model, x, options=SITES)
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    assert seen == ["inductor", "graphopt"] * 2  # graphopt's win confirmed by a second round; the second site has the first one's shapes
    decisions = _kernel_decisions()
    assert len(decisions) == 2 and len({d.site for d in decisions}) == 2 and all(d.chosen == "graphopt" for d in decisions)
    assert code.count("torch.ops.graphopt.linear_act.default(") == 2


class LinearGeluTanh(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.linear(x), approximate="tanh")


@pytest.mark.parametrize("graphopt_wins", [True, False])
def test_tanh_gelu_site(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None, graphopt_wins: bool) -> None:
    torch.manual_seed(0)
    model = LinearGeluTanh().eval()
    x = torch.randn(8, 16)
    _fixed_site_times(monkeypatch, graphopt_ms=1.0 if graphopt_wins else 3.0, inductor_ms=2.0)
    out, code = _compile_and_code(model, x, options=SITES)
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    (decision,) = _kernel_decisions()
    assert decision.chosen == ("graphopt" if graphopt_wins else "inductor") and decision.site.endswith("gelu_tanh]")
    assert ("torch.ops.graphopt.linear_act.default" in code) == graphopt_wins
    if not graphopt_wins:
        assert code == _inductor_alone(model, x)


def test_a_site_that_cannot_be_timed_keeps_inductor(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None) -> None:
    def broken(side: str, fn: Any, inputs: Any, replay: bool) -> float:
        raise RuntimeError("no timer here")

    monkeypatch.setattr(inductor_sites, "benchmark", broken)
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    out, code = _compile_and_code(model, x, options=SITES)
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    (decision,) = _kernel_decisions()
    assert decision.chosen == "inductor" and decision.basis == "forced" and "no timer here" in decision.reason
    assert code == _inductor_alone(model, x)


def test_symbolic_shapes_are_not_timed(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None) -> None:
    seen = _fixed_site_times(monkeypatch, graphopt_ms=1.0, inductor_ms=2.0)
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    torch._dynamo.mark_dynamic(x, 0)
    out, _ = _compile_and_code(model, x, options=SITES)
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    (decision,) = _kernel_decisions()
    assert decision.chosen == "inductor" and decision.basis == "forced" and "symbolic shapes" in decision.reason
    assert not seen and torch.ops.graphopt.tuned_linear_act.default not in _targets()


def test_real_timings_decide(fresh_inductor: None) -> None:
    """Not patched: both sides run and are timed on the CPU, and the decision follows the times."""
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    out, code = _compile_and_code(model, x, options=SITES)
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    (decision,) = _kernel_decisions()
    times = _times(decision)
    g, i = times["graphopt::linear_act"], times["inductor addmm + relu"]
    assert g is not None and i is not None and g > 0 and i > 0 and decision.basis == "measured"
    assert decision.chosen == ("graphopt" if g < inductor_sites.WIN_MARGIN * i else "inductor")
    assert ("torch.ops.graphopt.linear_act.default" in code) == (decision.chosen == "graphopt")


def test_default_mode_keeps_the_static_choice(fresh_inductor: None) -> None:
    """Not autotuning: no site, no kernel decision; on the CPU the GEMM + ReLU is left to inductor (aten._addmm_activation
    there is addmm then ReLU, which inductor fuses better itself: torch_fused.py)."""
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    out, code = _compile_and_code(model, x, options={"autotune_kernels": True})
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    assert aten._addmm_activation.default not in _targets() and torch.ops.graphopt.tuned_linear_act.default not in _targets()
    assert not _kernel_decisions() and "graphopt" not in code


def test_kernels_none_writes_no_site(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None) -> None:
    seen = _fixed_site_times(monkeypatch, graphopt_ms=1.0, inductor_ms=2.0)
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    out, _ = _compile_and_code(model, x, options={**SITES, "kernels": "none"})
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    assert torch.ops.graphopt.tuned_linear_act.default not in _targets() and not _kernel_decisions() and not seen


def test_an_inductor_without_the_apis_falls_back_with_a_warning(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None) -> None:
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    monkeypatch.setattr(inductor_choices, "install", lambda: "this inductor lacks torch._inductor.ir.FallbackKernel")
    out, _ = _compile_and_code(model, x, options=SITES)
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    # the static policy: on the CPU the GEMM + ReLU left to inductor
    assert aten._addmm_activation.default not in _targets() and torch.ops.graphopt.tuned_linear_act.default not in _targets()
    report = graphopt.last_report()
    assert report is not None and any("autotune choices" in w and "FallbackKernel" in w and "static policy" in w for w in report.warnings)


def test_problem_names_a_missing_api(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor import ir

    assert inductor_choices.problem() is None  # this torch has them all
    monkeypatch.delattr(ir, "FallbackKernel")
    assert "torch._inductor.ir.FallbackKernel" in (inductor_choices.problem() or "")


@pytest.mark.parametrize("activation, bias", [("none", True), ("silu", True), ("gelu", True), ("gelu_tanh", True),
                                              ("relu", False)])
@pytest.mark.parametrize("autotuning", [True, False])
def test_the_site_op_runs_graphopts_kernel(fresh_inductor: None, activation: str, bias: bool, autotuning: bool) -> None:
    """A site op is written only where graphopt's kernel won: inductor calls it, autotuning or not."""
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code

    from graphopt.kernels.matmul import apply_activation

    assert inductor_choices.install() is None
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 8), torch.randn(8, 6), (torch.randn(6) if bias else None)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.graphopt.tuned_linear_act(x, w, b, activation)

    with config.patch(max_autotune=autotuning):
        out, codes = run_and_get_code(torch.compile(f, backend="inductor"), x)
    torch.testing.assert_close(out, apply_activation(x @ w + (b if b is not None else 0), activation), atol=1e-5, rtol=1e-5)
    assert "torch.ops.graphopt.linear_act.default" in "\n".join(codes)


# --------------------------------------------------------------------------- weight-only int8: graphopt::wq_linear


class TwoLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(64, 32), nn.Linear(32, 8)  # the head stays unquantized (the default block list)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


@pytest.mark.parametrize("graphopt_wins", [True, False])
def test_wq_linear_against_inductors_dequantize_then_gemm(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None,
                                                          wq_linear_timed_fastest: None, graphopt_wins: bool) -> None:
    from torch._inductor.codegen.subgraph import SubgraphChoiceCaller
    from torch._inductor.select_algorithm import ExternKernelCaller

    seen: list[str] = []

    def timed(ms: float) -> Any:
        def benchmark(self: Any, *args: Any, out: Any) -> float:
            seen.append(self.name)
            return ms
        return benchmark

    monkeypatch.setattr(ExternKernelCaller, "benchmark", timed(1.0 if graphopt_wins else 3.0))  # the op itself: graphopt's kernel
    monkeypatch.setattr(SubgraphChoiceCaller, "benchmark", timed(2.0))  # inductor's compiled dequantize + GEMM
    torch.manual_seed(0)
    model = TwoLinears().eval()
    x = torch.randn(4, 64)
    out, code = _compile_and_code(model, x, options={"mode": "max-autotune-no-cudagraphs", "weights": "int8", "autotune_kernels": True})
    torch.testing.assert_close(out, model(x), atol=2e-2, rtol=2e-2)  # int8 weights

    targets = [n.target for n in last_graph().graph.nodes]  # type: ignore[union-attr]
    assert targets.count(torch.ops.graphopt.tuned_wq_linear.default) == 1
    assert any(name.endswith("_fallback") for name in seen) and any("dequant_then_linear" in name for name in seen)
    (decision,) = _kernel_decisions()
    assert decision.chosen == ("graphopt" if graphopt_wins else "inductor") and decision.basis == "measured"
    times = {a.candidate: a.measured_ms for a in decision.alternatives}
    assert times["graphopt::wq_linear"] == (1.0 if graphopt_wins else 3.0)
    assert f"graphopt {'2.00' if graphopt_wins else '0.67'}x" in decision.reason
    # graphopt's kernel is called only where it won; else inductor inlined its own dequantize + GEMM
    assert ("torch.ops.graphopt.tuned_wq_linear" in code) == graphopt_wins


def test_wq_linear_default_mode_keeps_the_kernel_as_it_was(fresh_inductor: None, wq_linear_timed_fastest: None) -> None:
    torch.manual_seed(0)
    model = TwoLinears().eval()
    x = torch.randn(4, 64)
    out, _ = _compile_and_code(model, x, options={"weights": "int8"})
    torch.testing.assert_close(out, model(x), atol=2e-2, rtol=2e-2)
    targets = [n.target for n in last_graph().graph.nodes]  # type: ignore[union-attr]
    assert torch.ops.graphopt.wq_linear.default in targets and torch.ops.graphopt.tuned_wq_linear.default not in targets
    assert not _kernel_decisions()


def test_max_autotune_times_graphopts_kernel_as_a_replay(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None) -> None:
    """mode="max-autotune" replays CUDA graphs: graphopt's side is timed as a replay too (inductor's always is);
    max-autotune-no-cudagraphs times graphopt's kernel as called."""
    replays: dict[str, list[bool]] = {"inductor": [], "graphopt": []}

    def benchmark(side: str, fn: Any, inputs: Any, replay: bool) -> float:
        replays[side].append(replay)
        return 1.0 if side == "graphopt" else 2.0

    monkeypatch.setattr(inductor_sites, "benchmark", benchmark)
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    for mode in ("max-autotune", "max-autotune-no-cudagraphs"):
        out, code = _compile_and_code(model, x, options={"mode": mode, "autotune_kernels": True})
        torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
        (decision,) = _kernel_decisions()
        assert decision.chosen == "graphopt" and "torch.ops.graphopt.linear_act.default" in code
    assert replays == {"inductor": [True] * 4, "graphopt": [True, True, False, False]}  # per mode, two rounds (graphopt wins)


def test_sites_are_opt_in(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None) -> None:
    """max-autotune without autotune_kernels: no site timed, the static policy."""
    seen = _fixed_site_times(monkeypatch, graphopt_ms=1.0, inductor_ms=2.0)
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    out, _ = _compile_and_code(model, x, mode="max-autotune-no-cudagraphs")
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    targets = [n.target for n in last_graph().graph.nodes]  # type: ignore[union-attr]
    assert torch.ops.graphopt.tuned_linear_act.default not in targets and not _kernel_decisions() and not seen


def test_inductors_gemm_pick_goes_into_the_decision(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None) -> None:
    """The site's compile reports its autotuner's times (select_algorithm's feedback hook): the fastest GEMM is named."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Choice:
        name: str
        description: str

    real_compile = inductor_sites._compile_site

    def compile_site(*args: Any) -> Any:
        fn, _ = real_compile(*args)  # on the CPU with ATen's GEMM alone, nothing is benchmarked: a pick stands in
        return fn, "triton_mm_7 (BLOCK_M=64, BLOCK_N=64)"

    def feedback_inside_compile() -> None:
        with inductor_choices.collecting_gemm_timings() as collected:
            inductor_choices._feedback({Choice("triton_mm_7", "BLOCK_M=64"): 0.5,
                                        Choice("addmm", ""): 0.9}, "addmm", [], [])
        assert collected == {"triton_mm_7 (BLOCK_M=64)": 0.5, "addmm": 0.9}

    feedback_inside_compile()
    monkeypatch.setattr(inductor_sites, "_compile_site", compile_site)
    _fixed_site_times(monkeypatch, graphopt_ms=3.0, inductor_ms=2.0)
    torch.manual_seed(0)
    model = LinearRelu().eval()
    _compile_and_code(model, torch.randn(8, 16), options=SITES)
    (decision,) = _kernel_decisions()
    inductor = next(a for a in decision.alternatives if a.candidate.startswith("inductor"))
    assert inductor.candidate == "inductor addmm + relu (GEMM: triton_mm_7)" and "BLOCK_M=64, BLOCK_N=64" in inductor.source
