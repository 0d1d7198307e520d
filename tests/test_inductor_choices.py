"""graphopt's GEMM kernel as an inductor autotune choice (graphopt/inductor_choices.py, issue 15 item 1).

On the CPU inductor's max-autotune benchmarks extern choices too; the times are fixed here (the
extern benchmark patched) so that each test decides which choice wins, and checks that the report
and the generated code agree with it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn as nn

import graphopt
from graphopt import inductor_choices
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


def _fixed_times(monkeypatch: pytest.MonkeyPatch, graphopt_ms: float, inductor_ms: float) -> list[str]:
    """Every extern choice's benchmark returns a fixed time: graphopt's kernel `graphopt_ms`, inductor's `inductor_ms`.
    Returns the names of the choices benchmarked."""
    from torch._inductor.select_algorithm import ExternKernelCaller

    seen: list[str] = []

    def benchmark(self: Any, *args: Any, out: Any) -> float:
        seen.append(self.name)
        return graphopt_ms if self.name.startswith("graphopt") else inductor_ms

    monkeypatch.setattr(ExternKernelCaller, "benchmark", benchmark)
    return seen


def _compile_and_code(model: nn.Module, x: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, str]:
    from torch._inductor.utils import run_and_get_code

    with torch.no_grad():
        out, codes = run_and_get_code(torch.compile(model, backend="graphopt", **kwargs), x)
    return out, "\n".join(codes)


def _kernel_decisions() -> list[Any]:
    report = graphopt.last_report()
    assert report is not None
    return [d for d in report.decisions if d.kind == "kernel"]


@pytest.mark.parametrize("graphopt_wins", [True, False])
@pytest.mark.parametrize("shape", [(8, 16), (2, 5, 16)])  # 3-D: x viewed as [10, 16] and back
def test_the_faster_choice_is_kept_and_reported(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None, graphopt_wins: bool,
                                                shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(*shape)
    seen = _fixed_times(monkeypatch, graphopt_ms=1.0 if graphopt_wins else 3.0, inductor_ms=2.0)
    out, code = _compile_and_code(model, x, options={"mode": "max-autotune-no-cudagraphs", "autotune_kernels": True})
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)

    gm = last_graph()
    assert gm is not None
    assert sum(n.target is torch.ops.graphopt.tuned_linear_act.default for n in gm.graph.nodes) == 1
    assert "graphopt_linear_act_relu" in seen and "addmm" in seen  # both were autotuned
    (decision,) = _kernel_decisions()
    assert decision.basis == "measured" and decision.baseline == "inductor"
    assert decision.chosen == ("graphopt" if graphopt_wins else "inductor")
    times = {a.candidate: a.measured_ms for a in decision.alternatives}
    assert times["graphopt::linear_act"] == (1.0 if graphopt_wins else 3.0) and times["inductor addmm"] == 2.0
    assert f"graphopt {'2.00' if graphopt_wins else '0.67'}x" in decision.reason
    # the generated code calls the winner, and only it
    assert ("extern_kernels.graphopt_linear_act_relu" in code) == graphopt_wins
    assert ("extern_kernels.addmm" in code) == (not graphopt_wins)


def test_ratio_in_the_reason(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None) -> None:
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    _fixed_times(monkeypatch, graphopt_ms=4.0, inductor_ms=2.0)
    _compile_and_code(model, x, options={"mode": "max-autotune-no-cudagraphs", "autotune_kernels": True})
    (decision,) = _kernel_decisions()
    assert decision.chosen == "inductor" and "graphopt 0.50x" in decision.reason and "addmm" in decision.reason


def test_default_mode_keeps_the_static_choice(fresh_inductor: None) -> None:
    """Not autotuning: no site, no kernel decision; on the CPU the GEMM + ReLU is left to inductor (aten._addmm_activation
    there is addmm then ReLU, which inductor fuses better itself: torch_fused.py)."""
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    out, code = _compile_and_code(model, x)
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    targets = [n.target for n in last_graph().graph.nodes]  # type: ignore[union-attr]
    assert aten._addmm_activation.default not in targets and torch.ops.graphopt.tuned_linear_act.default not in targets
    assert not _kernel_decisions() and "graphopt_linear_act" not in code


def test_kernels_none_writes_no_site(fresh_inductor: None) -> None:
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    out, _ = _compile_and_code(model, x, options={"mode": "max-autotune-no-cudagraphs", "kernels": "none", "autotune_kernels": True})
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    targets = [n.target for n in last_graph().graph.nodes]  # type: ignore[union-attr]
    assert torch.ops.graphopt.tuned_linear_act.default not in targets and not _kernel_decisions()


def test_an_inductor_without_the_apis_falls_back_with_a_warning(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None) -> None:
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    monkeypatch.setattr(inductor_choices, "install", lambda: "this inductor lacks torch._inductor.kernel.mm.tuned_addmm")
    out, _ = _compile_and_code(model, x, options={"mode": "max-autotune-no-cudagraphs", "autotune_kernels": True})
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    targets = [n.target for n in last_graph().graph.nodes]  # type: ignore[union-attr]
    # the static policy: on the CPU the GEMM + ReLU left to inductor
    assert aten._addmm_activation.default not in targets and torch.ops.graphopt.tuned_linear_act.default not in targets
    report = graphopt.last_report()
    assert report is not None and any("autotune choices" in w and "tuned_addmm" in w and "static policy" in w for w in report.warnings)


def test_problem_names_a_missing_api(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor.kernel import mm

    assert inductor_choices.problem() is None  # this torch has them all
    monkeypatch.delattr(mm, "tuned_addmm")
    assert "torch._inductor.kernel.mm.tuned_addmm" in (inductor_choices.problem() or "")


def test_the_site_op_outside_autotuning_runs_graphopts_kernel(fresh_inductor: None) -> None:
    """The lowering's safety net: inductor not autotuning calls graphopt::linear_act itself."""
    assert inductor_choices.install() is None
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    x, w, b = torch.randn(4, 8), torch.randn(8, 6), torch.randn(6)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.graphopt.tuned_linear_act(x, w, b, "silu")

    out, codes = run_and_get_code(torch.compile(f, backend="inductor"), x)
    torch.testing.assert_close(out, torch.nn.functional.silu(x @ w + b), atol=1e-5, rtol=1e-5)
    assert "graphopt.linear_act" in "\n".join(codes)


# --------------------------------------------------------------------------- weight-only int8: graphopt::wq_linear


class TwoLinears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(64, 32), nn.Linear(32, 8)  # the head stays unquantized (the default block list)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


@pytest.mark.parametrize("graphopt_wins", [True, False])
def test_wq_linear_against_inductors_dequantize_then_gemm(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None,
                                                          graphopt_wins: bool) -> None:
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


def test_wq_linear_default_mode_keeps_the_kernel_as_it_was(fresh_inductor: None) -> None:
    torch.manual_seed(0)
    model = TwoLinears().eval()
    x = torch.randn(4, 64)
    out, _ = _compile_and_code(model, x, options={"weights": "int8"})
    torch.testing.assert_close(out, model(x), atol=2e-2, rtol=2e-2)
    targets = [n.target for n in last_graph().graph.nodes]  # type: ignore[union-attr]
    assert torch.ops.graphopt.wq_linear.default in targets and torch.ops.graphopt.tuned_wq_linear.default not in targets
    assert not _kernel_decisions()


def test_max_autotune_with_cuda_graphs_on_cpu_tensors(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None) -> None:
    """mode="max-autotune" turns CUDA graphs on: CPU choices are still timed as called (no CUDA graph capture)."""
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    _fixed_times(monkeypatch, graphopt_ms=1.0, inductor_ms=2.0)
    out, code = _compile_and_code(model, x, options={"mode": "max-autotune", "autotune_kernels": True})
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    (decision,) = _kernel_decisions()
    assert decision.chosen == "graphopt" and "extern_kernels.graphopt_linear_act_relu" in code


@pytest.mark.parametrize("activation, bias", [("none", True), ("silu", True), ("gelu", True), ("gelu_tanh", True),
                                              ("relu", False)])  # no bias: inductor's tuned_mm choices
@pytest.mark.parametrize("graphopt_wins", [True, False])
def test_every_activation_after_either_winner(monkeypatch: pytest.MonkeyPatch, fresh_inductor: None, activation: str,
                                              bias: bool, graphopt_wins: bool) -> None:
    """The site op compiled straight by inductor in max-autotune: inductor's GEMM + its epilogue, or graphopt's kernel."""
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code

    from graphopt.kernels.matmul import apply_activation
    from graphopt.report.model import Report

    assert inductor_choices.install() is None
    _fixed_times(monkeypatch, graphopt_ms=1.0 if graphopt_wins else 3.0, inductor_ms=2.0)
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 8), torch.randn(8, 6), (torch.randn(6) if bias else None)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.graphopt.tuned_linear_act(x, w, b, activation)

    report = Report(target="torch")
    with config.patch(max_autotune=True), inductor_choices.recording(report):
        out, codes = run_and_get_code(torch.compile(f, backend="inductor"), x)
    torch.testing.assert_close(out, apply_activation(x @ w + (b if b is not None else 0), activation), atol=1e-5, rtol=1e-5)
    (decision,) = [d for d in report.decisions if d.kind == "kernel"]
    assert decision.chosen == ("graphopt" if graphopt_wins else "inductor") and activation in decision.site
    assert (f"extern_kernels.graphopt_linear_act_{activation}" in "\n".join(codes)) == graphopt_wins


def test_sites_are_opt_in(fresh_inductor: None) -> None:
    """max-autotune without autotune_kernels: no site, the static policy (measured: the sites lost on an H100)."""
    torch.manual_seed(0)
    model = LinearRelu().eval()
    x = torch.randn(8, 16)
    out, _ = _compile_and_code(model, x, mode="max-autotune-no-cudagraphs")
    torch.testing.assert_close(out, model(x), atol=1e-5, rtol=1e-5)
    targets = [n.target for n in last_graph().graph.nodes]  # type: ignore[union-attr]
    assert torch.ops.graphopt.tuned_linear_act.default not in targets and not _kernel_decisions()
