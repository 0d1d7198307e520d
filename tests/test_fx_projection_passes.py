"""The FX passes after lowering that change what inductor gets (issue 15): repeat_kv removed in
front of attention (fx_gqa.unrepeat_kv) and projections of one input (bias-free, or each with
a constant bias: Qwen2's q/k/v) packed into one GEMM (fx_pack.pack_projections). Each with outputs equal to eager's, and look-alikes left
alone.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from graphopt.torch_backend import last_graph, last_report

pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py


def _compile(model: nn.Module, *inputs: torch.Tensor) -> Any:
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt", options={"inductor": False})(*inputs)
        torch.testing.assert_close(got, model(*inputs), atol=1e-5, rtol=1e-5)
    report = last_report()
    assert report is not None
    return report


def _calls(target: Any) -> int:
    graph = last_graph()
    assert graph is not None
    return sum(1 for n in graph.graph.nodes if n.target is target)


class Projections(nn.Module):
    """q, k, v of one input (bias-free, GQA widths), and a fourth of another input."""

    def __init__(self, other_input: bool = False, biased: bool = False, k_biased: bool | None = None) -> None:
        super().__init__()
        k_bias = biased if k_biased is None else k_biased
        self.q, self.k, self.v = (nn.Linear(16, n, bias=b) for n, b in ((16, biased), (8, k_bias), (8, biased)))
        self.other_input = other_input

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        k_in = y if self.other_input else x
        return torch.cat([self.q(x), self.k(k_in), self.v(x)], -1).relu()


def test_three_projections_of_one_input_are_one_gemm() -> None:
    torch.manual_seed(0)
    report = _compile(Projections().eval(), torch.randn(2, 5, 16), torch.randn(2, 5, 16))
    assert report.passes["pack_projections"].changes == 2
    assert _calls(torch.ops.aten.split_with_sizes.default) == 1


def test_biased_projections_of_one_input_are_one_addmm() -> None:
    """Qwen2's q/k/v: three addmm with constant biases -> one addmm of the packed weights and biases."""
    torch.manual_seed(0)
    report = _compile(Projections(biased=True).eval(), torch.randn(2, 5, 16), torch.randn(2, 5, 16))
    assert report.passes["pack_projections"].changes == 2
    assert _calls(torch.ops.aten.addmm.default) == 1 and _calls(torch.ops.aten.split_with_sizes.default) == 1


def test_projections_of_other_inputs_or_of_another_form_stay_apart() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    assert _compile(Projections(other_input=True).eval(), x, y).passes["pack_projections"].changes == 1  # q and v only
    assert _compile(Projections(other_input=True, biased=True).eval(), x, y).passes["pack_projections"].changes == 1
    # a bias-free k between biased q and v: q and v packed (one addmm), k its own GEMM
    assert _compile(Projections(biased=True, k_biased=False).eval(), x, y).passes["pack_projections"].changes == 1
    assert _calls(torch.ops.aten.addmm.default) == 1


class WeightsAsInputs(nn.Module):
    def forward(self, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        return (x @ w1) * (x @ w2)


def test_weights_that_are_inputs_are_not_packed() -> None:
    report = _compile(WeightsAsInputs(), torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 8))
    assert report.passes["pack_projections"].changes == 0


class GroupedAttention(nn.Module):
    """4 query heads on 2 key/value heads, k and v repeated as transformers' repeat_kv does
    (or, `interleaved`, with the repeat index before the kv head: another head order)."""

    def __init__(self, interleaved: bool = False) -> None:
        super().__init__()
        self.interleaved = interleaved

    def repeat(self, t: torch.Tensor) -> torch.Tensor:
        b, kv, s, d = t.shape
        if self.interleaved:
            return t[:, None].expand(b, 2, kv, s, d).reshape(b, kv * 2, s, d)
        return t[:, :, None].expand(b, kv, 2, s, d).reshape(b, kv * 2, s, d)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, self.repeat(k), self.repeat(v), is_causal=True)


def _qkv() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)


def test_repeat_kv_before_attention_goes() -> None:
    report = _compile(GroupedAttention(), *_qkv())
    # taken out once: by the rule FuseGroupedKV where it proves the repeat, else by the pass
    by_rule = report.rules["FuseGroupedKV"].applications if "FuseGroupedKV" in report.rules else 0
    assert by_rule + report.passes["unrepeat_kv"].changes == 1
    assert _calls(torch.ops.aten.expand.default) == 0


def test_another_head_order_is_not_taken_for_repeat_kv() -> None:
    report = _compile(GroupedAttention(interleaved=True), *_qkv())
    assert report.passes["unrepeat_kv"].changes == 0
    assert _calls(torch.ops.aten.expand.default) == 2
