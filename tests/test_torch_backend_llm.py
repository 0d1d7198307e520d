"""LLM generation on the torch path (issue 17): a transformers LLaMA decoder with grouped-query
attention and a static KV cache, its forward compiled with graphopt (fullgraph), prefill and
one-token decode steps: greedy tokens equal eager's, the cache writes stay writes into the
caller's cache (in place without inductor), and the rules find, on the decode step's graph,
RMSNorm with the residual add, rotary, SwiGLU and attention over the cache with the repeated
key/value heads (repeat_kv) taken out (FuseGroupedKV).

Inductor compiles C++ on this machine (a minute per graph): the default-mode test hands
inductor's place to a stand-in that runs the graph it is given, so it checks what graphopt
hands inductor. benchmarks/llm_decode.py runs the real thing on the GPU.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers
from torch.fx.experimental.proxy_tensor import make_fx

from graphopt import torch_backend
from graphopt.ops.torch_lowering import ensure_kernels
from graphopt.passes.fx_reinplace import reinplace_input_writes, written_inputs
from graphopt.torch_backend import torch_reports

pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py

PROMPT, NEW_TOKENS, CACHE_LEN, BATCH = 8, 6, 32, 2


@pytest.fixture(autouse=True)
def _kernels_registered() -> None:
    assert ensure_kernels() is None, "graphopt.kernels registers torch.ops.graphopt.*"


def _tiny_llama() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=100, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).eval()


def _cache_kwarg() -> str:
    # transformers 5.2x renamed past_key_values to cache (the old name warns until 5.40).
    return "cache" if "cache" in inspect.signature(transformers.LlamaForCausalLM.forward).parameters else "past_key_values"


def _greedy(forward: Callable[..., Any], model: transformers.LlamaForCausalLM, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill, then NEW_TOKENS - 1 one-token steps over a StaticCache; the tokens and the last logits."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=CACHE_LEN)
    key = _cache_kwarg()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        out = forward(input_ids=ids, cache_position=torch.arange(PROMPT), use_cache=True, **{key: cache})
        tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
        for step in range(NEW_TOKENS - 1):
            out = forward(input_ids=tokens[-1], cache_position=torch.tensor([PROMPT + step]), use_cache=True, **{key: cache})
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(tokens, 1), out.logits


def _applied(report: Any) -> dict[str, int]:
    return {name: s.applications for name, s in report.rules.items() if s.applications}


def _calls(gm: torch.fx.GraphModule) -> Counter[str]:
    return Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


#: What the rules do to the tiny LLaMA's two graphs (2 layers): per layer one attention, q and
#: k rotated, a SwiGLU MLP; 2 RMSNorms a layer and the final one, 4 of them after a residual add.
_KERNEL_RULES = {"FuseScaledDotProductAttention": 2, "FuseRotaryEmbedding": 4, "FuseRMSNorm": 5, "FuseSkipRMSNorm": 4, "FuseSwiGLU": 2}
EXPECTED = {
    # Prefill: SDPA with no mask (causal) and enable_gqa: no repeat_kv to take out.
    ("kernels", "prefill"): {**_KERNEL_RULES, "DropNoOpReshape": 2, "DropPassThrough": 1},
    # Decode: a bool mask from the cache position makes transformers repeat k and v (repeat_kv).
    ("kernels", "decode"): {**_KERNEL_RULES, "FuseGroupedKV": 2, "DropNoOpReshape": 2, "DropPassThrough": 1},
    # With inductor and no CUDA graphs graphopt's kernels stay out (TorchOptions.kernel_policy):
    # the norms, rotary and SwiGLU become their ATen-only forms (graphopt/ops/torch_aten_forms.py),
    # the attention stays SDPA (repeat_kv is taken out by a pass, not a rule).
    ("inductor", "prefill"): {"FuseRMSNorm": 5, "FuseSkipRMSNorm": 4, "FuseRotaryEmbedding": 4, "FuseSwiGLU": 2,
                              "DropNoOpReshape": 2, "DropPassThrough": 1},
    ("inductor", "decode"): {"FuseRMSNorm": 5, "FuseSkipRMSNorm": 4, "FuseRotaryEmbedding": 4, "FuseSwiGLU": 2,
                             "DropNoOpReshape": 2, "DropPassThrough": 1},
}


def test_static_cache_generation_without_inductor_equals_eager_and_fuses_the_decode_step() -> None:
    model = _tiny_llama()
    ids = torch.randint(0, 100, (BATCH, PROMPT))
    expected, expected_logits = _greedy(model.forward, model, ids)
    torch_backend.clear_reports()
    compiled = torch.compile(model.forward, backend="graphopt", fullgraph=True, options={"inductor": False})
    got, logits = _greedy(compiled, model, ids)
    assert torch.equal(got, expected), (got, expected)
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)

    reports = torch_reports()
    assert len(reports) == 2, "one graph for the prefill, one for every decode step"
    assert _applied(reports[0]) == EXPECTED[("kernels", "prefill")]
    assert _applied(reports[1]) == EXPECTED[("kernels", "decode")]

    decode = torch_backend.last_graph()
    assert decode is not None
    calls = _calls(decode)
    assert calls["graphopt.attention.default"] == 2 and calls["graphopt.rotary.default"] == 4
    assert calls["graphopt.decode_attention.default"] == 0, "the split-K kernel only where CUDA graphs replay"
    assert calls["graphopt.rms_norm.default"] == 5 and calls["graphopt.swiglu.default"] == 2
    assert calls["aten.expand.default"] <= 1, "k and v are no longer repeated (only the mask is expanded)"
    # The cache writes happen in place, where the model made them, and attention reads the cache itself.
    assert calls["aten.index_copy_.default"] == 4 and calls["aten.index_copy.default"] == 0
    placeholders = {n for n in decode.graph.nodes if n.op == "placeholder"}
    copies_into_caches = [n for n in decode.graph.nodes if n.target is torch.ops.aten.copy_.default and n.args[0] in placeholders
                          and n.args[0].meta["val"].dim() == 4]
    assert not copies_into_caches
    for attention in (n for n in decode.graph.nodes if str(n.target) == "graphopt.attention.default"):
        k, v = attention.args[1], attention.args[2]
        assert k.target is torch.ops.aten.index_copy_.default and v.target is torch.ops.aten.index_copy_.default
        assert k.args[0] in placeholders and v.args[0] in placeholders
        assert tuple(k.meta["val"].shape) == (BATCH, 2, CACHE_LEN, 16)  # the 2 key/value heads, not 4 copies


def test_cuda_graph_mode_picks_the_split_k_decode_kernel_for_one_query() -> None:
    """inductor=False with mode="reduce-overhead" (CudaGraphReplay; on CPU it runs without,
    as the report says): the decode step's attention is graphopt::decode_attention, the
    prefill's (8 queries) stays graphopt::attention; the tokens are eager's."""
    model = _tiny_llama()
    ids = torch.randint(0, 100, (BATCH, PROMPT))
    expected, _ = _greedy(model.forward, model, ids)
    torch_backend.clear_reports()
    options = {"inductor": False, "mode": "reduce-overhead"}
    got, _ = _greedy(torch.compile(model.forward, backend="graphopt", fullgraph=True, options=options), model, ids)
    assert torch.equal(got, expected), (got, expected)
    prefill, decode = (graph() for graph in torch_backend._GRAPHS[-2:])
    assert prefill is not None and decode is not None
    assert _calls(prefill)["graphopt.attention.default"] == 2 and _calls(prefill)["graphopt.decode_attention.default"] == 0
    assert _calls(decode)["graphopt.decode_attention.default"] == 2 and _calls(decode)["graphopt.attention.default"] == 0
    assert _applied(torch_reports()[-1]) == EXPECTED[("kernels", "decode")]


def test_static_cache_generation_default_mode_hands_inductor_the_mutations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Default mode: what graphopt hands inductor (a stand-in runs it as it is) gives eager's
    tokens; the cache writes stay functional with their copy_ back (inductor re-inplaces)."""
    handed: list[torch.fx.GraphModule] = []

    def run_as_given(gm: torch.fx.GraphModule, inputs: Any, opts: Any, dynamo_gm: Any) -> Callable[..., Any]:
        handed.append(gm)
        return gm

    monkeypatch.setattr(torch_backend, "_inductor", run_as_given)
    model = _tiny_llama()
    ids = torch.randint(0, 100, (BATCH, PROMPT))
    expected, _ = _greedy(model.forward, model, ids)
    torch_backend.clear_reports()
    got, _ = _greedy(torch.compile(model.forward, backend="graphopt", fullgraph=True), model, ids)
    assert torch.equal(got, expected), (got, expected)
    reports = torch_reports()
    assert [_applied(r) for r in reports] == [EXPECTED[("inductor", "prefill")], EXPECTED[("inductor", "decode")]]
    decode_calls = _calls(handed[-1])
    assert decode_calls["aten.index_copy.default"] == 4 and decode_calls["aten.index_copy_.default"] == 0
    assert decode_calls["aten.copy_.default"] >= 4  # the 4 caches (and the layers' position counters) written back


# --------------------------------------------------------------------------- DynamicCache: GroupQueryAttention


def test_a_dynamic_cache_decode_step_becomes_group_query_attention_with_rotary_inside() -> None:
    """Eager attention over a DynamicCache (torch.cat of the cache and the new k / v, repeat_kv, the
    scores written out; one new token, so transformers passes no mask): FuseAttention, then
    FuseGroupQueryAttention and FoldRotaryIntoGroupQueryAttention on both layers. graphopt.GroupQueryAttention
    lowers to ATen ops: the concatenations (the presents the cache keeps) and aten SDPA with enable_gqa
    over them, the rotary applied before; the logits and the updated cache are eager's."""
    model = _tiny_llama()
    model.config._attn_implementation = "eager"
    key = _cache_kwarg()
    ids = torch.randint(0, 100, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        cache = transformers.DynamicCache(config=model.config)
        token = model(input_ids=ids, use_cache=True, **{key: cache}).logits[:, -1].argmax(-1, keepdim=True)
        compiled_cache = copy.deepcopy(cache)
        expected = model(input_ids=token, use_cache=True, **{key: cache}).logits
        torch_backend.clear_reports()
        torch._dynamo.reset()
        forward = torch.compile(model.forward, backend="graphopt", fullgraph=True, dynamic=False, options={"inductor": False})
        got = forward(input_ids=token, use_cache=True, **{key: compiled_cache}).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for layer, compiled_layer in zip(cache.layers, compiled_cache.layers, strict=True):
        torch.testing.assert_close(compiled_layer.keys, layer.keys, atol=1e-5, rtol=1e-5)  # the rotated keys, appended
        torch.testing.assert_close(compiled_layer.values, layer.values, atol=1e-5, rtol=1e-5)
    applied = _applied(torch_reports()[-1])
    assert (applied.get("FuseGroupQueryAttention"), applied.get("FoldRotaryIntoGroupQueryAttention")) == (2, 2)
    graph = torch_backend.last_graph()
    assert graph is not None
    attention = [n for n in graph.graph.nodes if str(n.target) == "aten.scaled_dot_product_attention.default"]
    assert len(attention) == 2 and all(n.kwargs.get("enable_gqa") for n in attention)
    assert _calls(graph)["graphopt.attention.default"] == 0 and _calls(graph)["graphopt.rotary.default"] == 0
    # k and v reach SDPA with their 2 kv heads: the repeat_kv copies are gone
    assert all(n.args[1].meta["val"].shape[1] == 2 and n.args[2].meta["val"].shape[1] == 2 for n in attention)


# --------------------------------------------------------------------------- FuseGroupedKV alone


class GroupedAttention(torch.nn.Module):
    """SDPA over key/value heads repeated to the query heads, in the given order."""

    def __init__(self, kv_heads: int, k_group: int, v_group: int, order: str = "interleaved") -> None:
        super().__init__()
        self.kv_heads, self.k_group, self.v_group, self.order = kv_heads, k_group, v_group, order

    def _repeat(self, x: torch.Tensor, group: int) -> torch.Tensor:
        b, h, t, d = x.shape
        if self.order == "interleaved":  # transformers' repeat_kv: head i reads i // group
            return x[:, :, None, :, :].expand(b, h, group, t, d).reshape(b, h * group, t, d)
        if self.order == "repeat_interleave":
            return x.repeat_interleave(group, dim=1)
        return x[:, None].expand(b, group, h, t, d).reshape(b, group * h, t, d)  # tiled: head i reads i % h

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        k, v = self._repeat(k, self.k_group), self._repeat(v[:, : k.shape[1] * self.k_group // self.v_group], self.v_group)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("kv_heads, k_group, v_group, order, fused", [
    (2, 2, 2, "interleaved", True),  # GQA as repeat_kv writes it
    (1, 4, 4, "interleaved", True),  # MQA
    (2, 2, 2, "repeat_interleave", True),  # the same copies written another way
    (2, 2, 2, "tiled", False),  # head i reads i % 2: another attention, stays
    (2, 2, 4, "interleaved", False),  # k and v repeated by different groups (v has one head)
])
def test_fuse_grouped_kv(kv_heads: int, k_group: int, v_group: int, order: str, fused: bool) -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 4, 1, 16)
    k, v = torch.randn(2, kv_heads, 12, 16), torch.randn(2, kv_heads, 12, 16)
    mask = (torch.arange(12) <= 7).view(1, 1, 1, 12).expand(2, 1, 1, 12)  # a decode step's: positions up to the current one
    model = GroupedAttention(kv_heads, k_group, v_group, order)
    expected = model(q, k, v, mask)
    torch_backend.clear_reports()
    got = torch.compile(model, backend="graphopt", fullgraph=True, options={"inductor": False})(q, k, v, mask)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    report = torch_reports()[-1]
    assert _applied(report).get("FuseScaledDotProductAttention") == 1
    assert _applied(report).get("FuseGroupedKV", 0) == int(fused)
    graph = torch_backend.last_graph()
    assert graph is not None
    (attention,) = [n for n in graph.graph.nodes if str(n.target) == "graphopt.attention.default"]
    assert attention.args[1].meta["val"].shape[1] == (kv_heads if fused else 4)
    if not fused and order == "tiled":
        assert any("not 2" in m.reason for m in report.rules["FuseGroupedKV"].near_misses)
    if not fused and k_group != v_group:
        assert any("repeated 2 times, v 4 times" in m.reason for m in report.rules["FuseGroupedKV"].near_misses)


# --------------------------------------------------------------------------- reinplace_input_writes


def _cache_step(cache: torch.Tensor, pos: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    cache.index_copy_(1, pos, x)
    return cache.sum(1)


def _traced(fn: Callable[..., Any], *inputs: torch.Tensor) -> torch.fx.GraphModule:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from graphopt.torch_trace import trace_to_aten

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    return trace_to_aten(fn, [mode.from_tensor(t) for t in inputs], mode)


def test_reinplace_puts_a_cache_write_back_in_place() -> None:
    inputs = (torch.zeros(2, 5, 3), torch.tensor([1]), torch.ones(2, 1, 3))
    gm = _traced(_cache_step, *inputs)
    assert _calls(gm)["aten.index_copy.default"] == 1 and _calls(gm)["aten.copy_.default"] == 1
    assert written_inputs(gm) == {0}
    assert reinplace_input_writes(gm) == 1
    assert _calls(gm)["aten.index_copy_.default"] == 1 and _calls(gm)["aten.copy_.default"] == 0
    assert written_inputs(gm) == {0}  # still written, now by index_copy_ itself
    cache, expected_cache = torch.zeros(2, 5, 3), torch.zeros(2, 5, 3)
    torch.testing.assert_close(gm(cache, inputs[1], inputs[2]), _cache_step(expected_cache, inputs[1], inputs[2]))
    torch.testing.assert_close(cache, expected_cache)


def test_reinplace_leaves_a_write_whose_input_is_read_elsewhere() -> None:
    """The old cache is read too (its sum before the write): writing in place earlier would change that read."""

    def step(cache: torch.Tensor, pos: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        before = cache.sum()
        cache.index_copy_(1, pos, x)
        return before, cache.sum()

    inputs = (torch.zeros(2, 5, 3), torch.tensor([1]), torch.ones(2, 1, 3))
    gm = _traced(step, *inputs)
    assert reinplace_input_writes(gm) == 0
    cache = torch.zeros(2, 5, 3)
    before, after = gm(cache, inputs[1], inputs[2])
    assert before.item() == 0 and after.item() == 6 and cache.sum().item() == 6
    traced = make_fx(_cache_step)(*inputs)  # a graph with the write in place already: nothing to do
    assert reinplace_input_writes(traced) == 0


# --------------------------------------------------------------------------- inductor's CUDA graphs


class _CacheStep(torch.nn.Module):
    """A decode step's skeleton: write x into a static-address cache at pos, then a LayerNorm
    written out (graphopt fuses it, so graphopt's graph, not dynamo's, goes to inductor)."""

    def __init__(self) -> None:
        super().__init__()
        self.g = torch.nn.Parameter(torch.rand(8) + 0.5)
        self.b = torch.nn.Parameter(torch.randn(8))

    def forward(self, cache: torch.Tensor, pos: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(1, pos, x)
        h = cache.sum(1)
        d = h - h.mean(-1, keepdim=True)
        return d / torch.sqrt((d * d).mean(-1, keepdim=True) + 1e-5) * self.g + self.b


def test_inductor_sees_a_static_address_cache_as_a_static_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """mode="reduce-overhead": a KV cache marked with torch._dynamo.mark_static_address (as
    transformers' StaticCache marks its tensors) reaches inductor as a static input. Otherwise
    inductor's CUDA graphs skip a graph that writes into a non-static input (the whole decode step
    would run without CUDA graphs)."""
    import torch._inductor.compile_fx as inductor_compile_fx

    seen: list[tuple[int, list[int], bool]] = []
    real = inductor_compile_fx.compile_fx_inner

    def spy(gm: Any, inputs: Any, **kwargs: Any) -> Any:
        seen.append((len(inputs), list(kwargs.get("static_input_idxs", ())), bool(kwargs.get("cudagraphs"))))
        return real(gm, inputs, **kwargs)

    monkeypatch.setattr(inductor_compile_fx, "compile_fx_inner", spy)
    model = _CacheStep().eval()
    cache, expected_cache = torch.zeros(2, 5, 8), torch.zeros(2, 5, 8)
    torch._dynamo.mark_static_address(cache)
    pos, x = torch.tensor([3]), torch.randn(2, 1, 8)
    no_caches = (torch._functorch.config.patch(enable_autograd_cache=False), torch._inductor.config.patch(fx_graph_cache=False))
    with torch.no_grad(), no_caches[0], no_caches[1]:
        torch._dynamo.reset()
        got = torch.compile(model, backend="graphopt", mode="reduce-overhead", fullgraph=True)(cache, pos, x)
        torch.testing.assert_close(got, model(expected_cache, pos, x))
    torch.testing.assert_close(cache, expected_cache)
    assert torch_reports()[-1].total_rewrites > 0, "graphopt's graph (not dynamo's) went to inductor"
    inputs, static, cudagraphs = seen[-1]
    assert cudagraphs
    # aot_autograd's inputs: the 2 frozen parameters, then cache, pos, x: the cache is static, pos and x are not.
    assert inputs == 5 and static == [0, 1, 2], (inputs, static)
