"""torch.compile(backend="graphopt") is inductor plus more, never inductor minus something (issue 15).

* A graph graphopt changes in no way inductor lacks goes to inductor exactly as dynamo
  captured it (the path of backend="inductor"), and the report says so.
* A graph graphopt rewrites goes to inductor rewritten.
* With `tune`, both compiled forms are timed on the example inputs and the faster is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn

import graphopt.torch_backend as backend
from graphopt.torch_backend import last_report

pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")


class NothingToAdd(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2 + 1


class HandWrittenLayerNorm(nn.Module):
    """LayerNorm written out: graphopt fuses it (FuseLayerNorm), which inductor does not."""

    def __init__(self) -> None:
        super().__init__()
        self.g = nn.Parameter(torch.randn(16))
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        d = x - mean
        var = (d * d).mean(-1, keepdim=True)
        return d / torch.sqrt(var + 1e-5) * self.g + self.b


def _spy_inductor(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    import torch._inductor.compile_fx as inductor_compile_fx

    seen: list[Any] = []
    real = inductor_compile_fx.compile_fx

    def spy(gm: Any, inputs: Any, **kwargs: Any) -> Any:
        seen.append(gm)
        return real(gm, inputs, **kwargs)

    monkeypatch.setattr(inductor_compile_fx, "compile_fx", spy)
    return seen


def _capturing_backend() -> tuple[list[Any], Callable[..., Any]]:
    """graphopt's backend, keeping each graph dynamo hands it."""
    captured: list[Any] = []
    real_backend = backend.graphopt_backend

    def capture(gm: Any, inputs: Any, **kwargs: Any) -> Any:
        captured.append(gm)
        return real_backend(gm, inputs, **kwargs)

    return captured, capture

def test_a_graph_graphopt_leaves_alone_goes_to_inductor_as_dynamo_captured_it(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _spy_inductor(monkeypatch)
    captured, capture = _capturing_backend()

    x = torch.randn(4, 8)
    with torch.no_grad():
        got = torch.compile(NothingToAdd(), backend=capture)(x)
    torch.testing.assert_close(got, NothingToAdd()(x))
    report = last_report()
    assert report is not None and report.total_rewrites == 0
    (decision,) = [d for d in report.decisions if d.kind == "graph"]
    assert decision.chosen == "inductor" and "as dynamo captured it" in decision.reason
    assert seen and seen[-1] is captured[-1]  # dynamo's own graph, not graphopt's traced copy


def test_a_graph_graphopt_rewrites_goes_to_inductor_rewritten(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _spy_inductor(monkeypatch)
    torch.manual_seed(0)
    model = HandWrittenLayerNorm().eval()
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt")(x)
        expected = model(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    report = last_report()
    assert report is not None and report.rules["FuseLayerNorm"].applications == 1
    assert not [d for d in report.decisions if d.kind == "graph"]
    targets = {str(n.target) for n in seen[-1].graph.nodes if n.op == "call_function"}
    assert any("layer_norm" in t for t in targets), targets  # inductor was handed the fused graph


@pytest.mark.parametrize(("graphopt_ms", "inductor_ms", "chosen"), [(1.0, 2.0, "graphopt"), (2.0, 1.0, "inductor")])
def test_tune_keeps_the_faster_of_the_two(monkeypatch: pytest.MonkeyPatch, graphopt_ms: float, inductor_ms: float, chosen: str) -> None:
    timings = iter([graphopt_ms, inductor_ms])  # graphopt's form is timed first
    monkeypatch.setattr(backend, "TIMER", lambda fn, inputs: next(timings))
    torch.manual_seed(0)
    model = HandWrittenLayerNorm().eval()
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt", options={"tune": True})(x)
        torch.testing.assert_close(got, model(x), atol=1e-5, rtol=1e-5)
    report = last_report()
    assert report is not None
    (decision,) = [d for d in report.decisions if d.kind == "graph"]
    assert decision.basis == "measured" and decision.chosen == chosen
    assert {a.candidate: a.measured_ms for a in decision.alternatives} == {"graphopt": graphopt_ms, "inductor": inductor_ms}


def test_tune_is_an_option_that_takes_a_bool() -> None:
    from graphopt.errors import GraphoptError

    with pytest.raises(GraphoptError, match="'tune' takes True or False"):
        backend.TorchOptions.parse({"tune": "yes"})


class ReshapeTwice(nn.Module):
    """Only reshape clean-ups for graphopt (CollapseReshapes): views inductor handles itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x.reshape(2, 12).reshape(4, 6)) * 2


def test_a_graph_with_only_rewrites_inductor_makes_itself_goes_as_dynamo_captured_it(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _spy_inductor(monkeypatch)
    captured, capture = _capturing_backend()

    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(ReshapeTwice(), backend=capture)(x), ReshapeTwice()(x))
    report = last_report()
    assert report is not None and report.rules["CollapseReshapes"].applications == 1  # graphopt did rewrite ...
    assert set(n for n, s in report.rules.items() if s.applications) <= backend.RULES_INDUCTOR_DOES
    (decision,) = [d for d in report.decisions if d.kind == "graph"]  # ... yet inductor gets dynamo's graph
    assert decision.chosen == "inductor" and seen[-1] is captured[-1]


def test_rules_inductor_makes_itself_are_rules_of_the_library() -> None:
    from graphopt.api import builtin_rules

    assert backend.RULES_INDUCTOR_DOES <= {r.name for r in builtin_rules()}
