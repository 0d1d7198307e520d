"""graphopt hands SDPA inputs a fused GPU kernel can read: stride 1 on the last axis of query,
key, value and attn_mask (issue 15, T5 1.13x slower than inductor on an H100).

On CUDA a strided last axis on any of them, the mask included, sends SDPA to its math form
(float32 upcast, two bmm, a softmax: several kernels per attention); on a CPU it makes no
difference, so these tests look at the graph: what inductor is handed. T5's relative position
bias is the case: `.contiguous()` of a permuted embedding, which drop_clones removed and
constant folding froze with the view's strides (last-axis stride = heads) until the
dense_attention_inputs pass (graphopt.passes.fx_sdpa).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn
import transformers

from graphopt.passes.fx_passes import attr_tensor
from graphopt.passes.fx_sdpa import last_axis_dense
from graphopt.torch_backend import last_graph, last_report

pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py

SDPA = torch.ops.aten.scaled_dot_product_attention.default
#: The graph run as it is, on ATen ops only (with its kernels graphopt's own attention op would take SDPA's place).
ATEN_ONLY = {"inductor": False, "kernels": "none"}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch._dynamo.reset()


def _t5(layers: int = 2) -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.T5Config(d_model=64, d_ff=128, num_layers=layers, num_heads=4, d_kv=16, vocab_size=100, use_cache=False)
    return transformers.T5EncoderModel(cfg).eval()


def _stub_inductor(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The graphs handed to inductor, run as they are (the graph is what is asserted)."""
    import torch._inductor.compile_fx as inductor_compile_fx

    seen: list[Any] = []

    def stub(gm: Any, inputs: Any, **kwargs: Any) -> Any:
        seen.append(gm)
        return gm

    monkeypatch.setattr(inductor_compile_fx, "compile_fx", stub)
    return seen


def _sdpa_inputs(gm: Any) -> list[tuple[str, Any, Any]]:
    """(name, meta value, the tensor itself where it is a constant) of every SDPA input."""
    found = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is SDPA:
            for value in node.all_input_nodes:
                tensor = attr_tensor(gm, str(value.target)) if value.op == "get_attr" else None
                found.append((value.name, value.meta.get("val"), tensor))
    return found


def _strided(gm: Any) -> list[str]:
    """SDPA inputs a CUDA fused kernel would refuse (torch's check_last_dim_stride_equals_1_dense)."""
    return [name for name, val, tensor in _sdpa_inputs(gm)
            if not last_axis_dense(val) or (tensor is not None and tensor.stride(-1) != 1)]


def _changes(name: str) -> int:
    report = last_report()
    assert report is not None
    return report.passes[name].changes if name in report.passes else 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_t5_position_bias_reaches_sdpa_dense(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    seen = _stub_inductor(monkeypatch)
    model, ids = _t5().to(dtype), torch.randint(0, 100, (2, 16))
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt")(input_ids=ids).last_hidden_state
        want = model(input_ids=ids).last_hidden_state
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)
    assert seen and seen[-1] is last_graph()  # graphopt's graph went to inductor (packed projections) ...
    inputs = _sdpa_inputs(seen[-1])
    assert len(inputs) == 2 * 4  # two attentions, query, key, value, mask each
    masks = [tensor for _, _, tensor in inputs if tensor is not None]
    assert len(masks) == 2 and masks[0] is masks[1]  # ... the folded bias, one constant for both layers ...
    assert _strided(seen[-1]) == []  # ... with every input dense on its last axis
    assert _changes("dense_attention_inputs") == 1  # one copy, made at compile time


def test_t5_with_a_padding_mask_gets_the_sum_dense(monkeypatch: pytest.MonkeyPatch) -> None:
    """bias + padding mask is computed per call (the sum of the strided constant and the mask
    kept its strides): one copy, in the layout inductor writes the sum in anyway."""
    seen = _stub_inductor(monkeypatch)
    model, ids = _t5(), torch.randint(0, 100, (2, 16))
    padding = torch.ones_like(ids)
    padding[1, 10:] = 0
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt")(input_ids=ids, attention_mask=padding).last_hidden_state
        torch.testing.assert_close(got, model(input_ids=ids, attention_mask=padding).last_hidden_state, atol=1e-4, rtol=1e-4)
    assert _strided(seen[-1]) == []
    sdpas = [n for n in seen[-1].graph.nodes if n.target is SDPA]
    masks = {n.kwargs.get("attn_mask", n.args[3] if len(n.args) > 3 else None) for n in sdpas}
    assert len(sdpas) == 2 and len(masks) == 1  # one sum, read by both attentions
    (mask,) = masks
    assert mask.target is torch.ops.aten.clone.default and _changes("dense_attention_inputs") == 1


def test_without_the_pass_the_bias_would_be_strided(monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure the pass repairs: the same graph, the pass made a no-op."""
    import graphopt.passes.fx_sdpa as fx_sdpa

    monkeypatch.setattr(fx_sdpa, "dense_attention_inputs", lambda gm, new_constant, fake_mode: 0)
    seen = _stub_inductor(monkeypatch)
    with torch.no_grad():
        torch.compile(_t5(1), backend="graphopt")(input_ids=torch.randint(0, 100, (2, 16)))
    (strided,) = _strided(seen[-1])
    (mask,) = [tensor for name, _, tensor in _sdpa_inputs(seen[-1]) if name == strided]
    assert mask.stride(-1) == 4  # [1, heads, q, k] viewed on the embedding's [q, k, heads]


def test_without_inductor_the_graph_run_as_it_is_gets_the_dense_bias_too() -> None:
    model, ids = _t5(1), torch.randint(0, 100, (2, 16))
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt", options=ATEN_ONLY)(input_ids=ids).last_hidden_state
        torch.testing.assert_close(got, model(input_ids=ids).last_hidden_state, atol=1e-4, rtol=1e-4)
    graph = last_graph()
    assert graph is not None and _sdpa_inputs(graph) and _strided(graph) == []


class PermutedMaskAttention(nn.Module):
    """SDPA with a mask computed from an input and permuted: not a constant, so it is copied
    in the graph (what `.contiguous()` would have done)."""

    def forward(self, q: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        mask = bias.permute(0, 3, 1, 2) * 0.5  # [b, q, k, heads] -> [b, heads, q, k], last-axis stride = heads
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)


class DenseMaskAttention(nn.Module):
    def forward(self, q: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=bias * 0.5)


def test_a_computed_strided_mask_gets_a_contiguous_copy() -> None:
    q, bias = torch.randn(2, 4, 8, 16), torch.randn(2, 8, 8, 4)
    model = PermutedMaskAttention()
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt", options=ATEN_ONLY)(q, bias)
        torch.testing.assert_close(got, model(q, bias))
    graph = last_graph()
    assert graph is not None and _strided(graph) == []
    assert _changes("dense_attention_inputs") == 1
    clones = [n for n in graph.graph.nodes if n.target is torch.ops.aten.clone.default]
    assert [c.kwargs.get("memory_format") for c in clones] == [torch.contiguous_format]


def test_dense_inputs_are_left_alone() -> None:
    q, bias = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 8)
    model = DenseMaskAttention()
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt", options=ATEN_ONLY)(q, bias)
        torch.testing.assert_close(got, model(q, bias))
    graph = last_graph()
    assert graph is not None and _sdpa_inputs(graph)
    assert _changes("dense_attention_inputs") == 0
    assert not [n for n in graph.graph.nodes if n.target is torch.ops.aten.clone.default]


def test_last_axis_dense() -> None:
    x = torch.randn(2, 3, 4)
    assert last_axis_dense(x) and last_axis_dense(x.transpose(0, 1))  # a middle transpose keeps the last axis dense
    assert not last_axis_dense(x.transpose(1, 2)) and not last_axis_dense(x[..., ::2])
    assert last_axis_dense(torch.tensor(1.0)) and last_axis_dense(None)


def _inductor_code(model: nn.Module, ids: torch.Tensor, backend: str) -> str:
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    with torch.no_grad(), inductor_config.patch(fx_graph_cache=False):  # generated here, not read from a cache
        _, codes = run_and_get_code(torch.compile(model, backend=backend), input_ids=ids)
    return "\n".join(codes)


def test_t5_inductor_code_is_no_larger_than_inductors_own_and_reads_the_bias_as_it_is() -> None:
    """What inductor generates (C++ here) from graphopt's T5 graph against dynamo's: no more
    kernels and GEMMs (q, k, v are one), and each attention reads the frozen bias itself,
    with no copy per call (before the pass: a kernel copying the strided constant)."""
    import re

    model, ids = _t5(2), torch.randint(0, 100, (2, 16))
    plain, ours = _inductor_code(model, ids, "inductor"), _inductor_code(model, ids, "graphopt")

    def kernels(code: str) -> int:
        return len(re.findall(r"^\s+cpp_fused_\w+\(", code, re.M))  # launches in call()

    def gemms(code: str) -> int:
        return len(re.findall(r"extern_kernels\.(?:mm|addmm|bmm)\(", code))

    assert gemms(plain) == 12 and gemms(ours) == 8  # per layer q, k, v, o, wi, wo; q|k|v packed
    assert kernels(ours) <= kernels(plain), (kernels(ours), kernels(plain))
    masks = re.findall(r"attn_mask=(\w+)", ours)
    assert len(masks) == 2 and all(re.fullmatch(r"arg\d+_1", m) for m in masks), masks  # a graph input: the constant
