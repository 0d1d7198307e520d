"""torch.compile(backend="graphopt") under changing input shapes and on graphs it cannot
rewrite (issue 6): recompilations stay bounded, outputs stay equal to eager's, and a
graph graphopt does not understand still runs, with nothing rewritten and no error."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from graphopt.torch_backend import torch_reports

pytestmark = pytest.mark.usefixtures("fresh_torch_compile")  # tests/conftest.py


class Block(nn.Module):
    """Residual add + LayerNorm and self-attention through SDPA: rules fire on both."""

    def __init__(self, hidden: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, h)
        return self.norm(x + self.out(attn))


def _applied() -> int:
    return sum(stats.applications for report in torch_reports() for stats in report.rules.values())


def test_recompilations_stay_bounded_across_input_shapes() -> None:
    model = Block().eval()
    compiled = torch.compile(model, backend="graphopt", options={"inductor": False})
    shapes = [(b, s) for b in (1, 2, 3, 5) for s in (4, 7, 9, 16)]
    with torch.no_grad():
        for b, s in shapes:
            x = torch.randn(b, s, 16)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    # One graph for the first shape, then one with dynamic dims for every later shape
    # (dynamo's automatic dynamic shapes): not one per shape.
    assert len(torch_reports()) <= 3, [r.before.nodes if r.before else None for r in torch_reports()]
    assert _applied() > 0  # graphopt did rewrite the graphs it was given


class DataDependent(nn.Module):
    """A Python branch on a tensor's value (a graph break), an op graphopt has no name for
    (torch.cumsum), and a complex-number detour: nothing graphopt can fuse."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cumsum(x, dim=-1)
        if y.sum() > 0:  # data-dependent: dynamo breaks the graph here
            y = y * 2
        z = torch.view_as_real(torch.view_as_complex(y.reshape(*y.shape[:-1], -1, 2).contiguous()) * 1j)
        return z.reshape(y.shape)


def test_a_model_graphopt_cannot_rewrite_still_runs_equal_to_eager() -> None:
    model = DataDependent()
    compiled = torch.compile(model, backend="graphopt", options={"inductor": False})
    for seed in range(3):
        x = torch.randn(2, 8, generator=torch.Generator().manual_seed(seed)) - (seed == 1) * 3
        torch.testing.assert_close(compiled(x), model(x))
    assert torch_reports(), "graphopt was given the graphs"
    assert _applied() == 0
    assert not [w for r in torch_reports() for w in r.warnings if "graphopt failed" in w]


def test_each_compiled_graph_writes_the_html_report(tmp_path: Any) -> None:
    """options={"report": "r.html"}: the same self-contained page as `graphopt optimize --report
    r.html`, one per compiled graph, indexed."""
    model = Block().eval()
    with torch.no_grad():
        torch.compile(model, backend="graphopt", options={"inductor": False, "report": str(tmp_path / "r.html")})(torch.randn(2, 5, 16))
    [page] = sorted(tmp_path.glob("r*.html"))
    assert page.name == "r.0.html"
    text = page.read_text()
    assert text.lstrip().lower().startswith("<!doctype html")
    for rule, stats in torch_reports()[0].rules.items():
        if stats.applications:
            assert rule in text
    assert "FuseScaledDotProductAttention" in text and "http://" not in text and "https://" not in text
