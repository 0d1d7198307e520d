"""Hand-written forms on the FX path: the same sub-expression written twice (a LayerNorm's
``h - mean``), and a tanh GELU with its cube written left to right (``0.044715 * h * h * h``).

The ONNX front door merges duplicates before every rule sweep (graphopt/passes/cse.py);
the torch backend does the same on aten graphs (fx_passes.eliminate_common_subexpressions),
so a rule written once sees one shared value on both graph kinds.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from graphopt.passes import fx_passes
from graphopt.torch_backend import torch_reports

OPTIONS = {"inductor": False}
pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py


class HandWritten(torch.nn.Module):
    """Linear -> LayerNorm written out (h - mean twice) -> Linear -> tanh GELU written out -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.w = torch.nn.Parameter(torch.rand(64) + 0.5)
        self.b = torch.nn.Parameter(torch.randn(64) * 0.1)
        self.fc2 = torch.nn.Linear(64, 64)
        self.fc3 = torch.nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        mu = h.mean(-1, keepdim=True)
        var = (h - mu).pow(2).mean(-1, keepdim=True)
        h = (h - mu) / torch.sqrt(var + 1e-5) * self.w + self.b
        h = self.fc2(h)
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h * h * h)))
        return self.fc3(h)


def _applied() -> dict[str, int]:
    report = torch_reports()[-1]
    return {name: s.applications for name, s in report.rules.items() if s.applications}


def test_cse_merges_duplicates_and_leaves_random_ops_alone() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        a = (x - x.mean(-1, keepdim=True)) * 2
        b = (x - x.mean(-1, keepdim=True)) * 3
        noise = torch.rand_like(x) + torch.rand_like(x)  # two draws, never one
        return a + b + noise

    gm = make_fx(f)(torch.randn(4, 8))
    ops = lambda g: [str(n.target) for n in g.graph.nodes if n.op == "call_function"]  # noqa: E731
    before = ops(gm)
    merged = fx_passes.eliminate_common_subexpressions(gm)
    after = ops(gm)
    assert merged == 2  # the second mean and the second subtraction
    assert after.count("aten.mean.dim") == 1 and after.count("aten.sub.Tensor") == 1
    assert after.count("aten.rand_like.default") == before.count("aten.rand_like.default") == 2
    gm.graph.lint()
    assert fx_passes.eliminate_common_subexpressions(gm) == 0


def test_cse_keeps_arguments_of_different_types_apart() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.aten.add.Tensor(x, 1), torch.ops.aten.add.Tensor(x, 1.0)

    gm = make_fx(f)(torch.randn(3))
    assert fx_passes.eliminate_common_subexpressions(gm) == 0
    assert isinstance(gm, fx.GraphModule)


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_hand_written_layer_norm_and_tanh_gelu_fuse_on_fx(grad: bool) -> None:
    torch.manual_seed(0)
    model = HandWritten()
    x = torch.randn(16, 32)
    torch._dynamo.reset()
    with torch.set_grad_enabled(grad):
        expected = model(x)
        got = torch.compile(model, backend="graphopt", options=OPTIONS)(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    applied = _applied()
    assert applied.get("FuseLayerNorm") == 1, applied
    assert applied.get("FuseGeluTanh") == 1, applied
    assert torch_reports()[-1].pass_stats("cse").changes >= 1
    if grad:
        expected.square().sum().backward()
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        got.square().sum().backward()
        for g, w in zip([p.grad for p in model.parameters()], want):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
