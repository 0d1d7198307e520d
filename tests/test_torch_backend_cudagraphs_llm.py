"""A StaticCache LLaMA generation through graphopt's own CUDA graphs (inductor off,
mode="reduce-overhead"), captured and replayed on the CPU by tests/fake_cuda_graph.py: the
real rewritten prefill and decode graphs, warmed up, captured (nothing runs) and replayed.

The bug this guards (H100, benchmarks/llm_decode.py variant graphopt-cg): a StaticCache's
write index is arange(new tokens) + its step counter, an input the graph advances. The three
warm-ups ran on one copy of the counter, so the third wrote two calls ahead: past the end of
a cache sized prompt + new tokens, a device-side assert in index_copy_ that left the CUDA
context unusable (and the fallback with it). The fake raises where that assert would fire.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers
from fake_cuda_graph import FakeCuda
from test_torch_backend_llm import _cache_kwarg, _tiny_llama

from graphopt import torch_backend
from graphopt.torch_cudagraphs import CudaGraphReplay

pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py

PROMPT, NEW_TOKENS, BATCH = 8, 6, 1
CACHE_LEN = PROMPT + NEW_TOKENS  # as llm_decode.py sizes it: no room for a warm-up that runs ahead




def _static_cache(model: transformers.LlamaForCausalLM) -> Any:
    """Made and filled once eagerly, then reset (its tensors exist before compiling), as llm_decode.py does."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=CACHE_LEN)
    with torch.no_grad():
        model(input_ids=torch.zeros(BATCH, 1, dtype=torch.long), cache_position=torch.arange(1), use_cache=True, **{_cache_kwarg(): cache})
    cache.reset()
    return cache


def _generate(forward: Callable[..., Any], ids: torch.Tensor, cache: Any) -> torch.Tensor:
    """Prefill and greedy one-token steps until the cache is full; positions are slices of one arange."""
    positions = torch.arange(CACHE_LEN)
    key = _cache_kwarg()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        out = forward(input_ids=ids, cache_position=positions[:PROMPT], use_cache=True, **{key: cache})
        tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
        for step in range(NEW_TOKENS - 1):
            out = forward(input_ids=tokens[-1], cache_position=positions[PROMPT + step:PROMPT + step + 1], use_cache=True, **{key: cache})
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(tokens, 1)


def _cache_tensors(cache: Any) -> list[torch.Tensor]:
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def fake_cuda_graph_replays(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeCuda, list[CudaGraphReplay]]:
    """The backend replays CPU graphs as (fake) CUDA graphs; the replays made are listed."""
    cuda, made = FakeCuda(), []

    def replay(gm: Any, written: frozenset[int] = frozenset()) -> CudaGraphReplay:
        made.append(CudaGraphReplay(gm, cuda=cuda, written=written))
        return made[-1]

    monkeypatch.setattr(torch_backend, "cuda_graphs_refusal", lambda inputs, training: None)
    monkeypatch.setattr(torch_backend, "CudaGraphReplay", replay)
    return cuda, made


@pytest.fixture
def fake_cuda_graphs(monkeypatch: pytest.MonkeyPatch) -> tuple[FakeCuda, list[CudaGraphReplay]]:
    return fake_cuda_graph_replays(monkeypatch)


def test_static_cache_generation_replays_as_cuda_graphs(fake_cuda_graphs: tuple[FakeCuda, list[CudaGraphReplay]]) -> None:
    cuda, made = fake_cuda_graphs
    model = _tiny_llama()
    ids = torch.randint(0, 100, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))
    eager_cache = _static_cache(model)
    expected = _generate(model.forward, ids, eager_cache)

    compiled = torch.compile(model.forward, backend="graphopt", fullgraph=True, dynamic=False,
                             options={"inductor": False, "mode": "reduce-overhead"})
    cache = _static_cache(model)
    addresses = [t.data_ptr() for t in _cache_tensors(cache)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a failed capture warns: here it must not
        for generation in range(2):
            cache.reset()  # in place: the captured addresses stay
            got = _generate(compiled, ids, cache)
            assert torch.equal(got, expected), (generation, got, expected)

    assert len(made) == 2, "one graph for the prefill, one for every decode step"
    prefill, decode = made
    assert prefill.failed is None and decode.failed is None, (prefill.failed, decode.failed)
    assert prefill.written and decode.written, "the cache writes and the step counters are written inputs"
    assert prefill.graph.replays == 2 and decode.graph.replays == 2 * (NEW_TOKENS - 1)
    assert cuda.warmup_calls == 2, "each graph warms up once (three calls) before its capture"
    # The replays wrote the caller's own cache: full, equal to eager's, at the addresses it had.
    assert [t.data_ptr() for t in _cache_tensors(cache)] == addresses
    for ours, theirs in zip(_cache_tensors(cache), _cache_tensors(eager_cache)):
        torch.testing.assert_close(ours[:, :, :CACHE_LEN - 1], theirs[:, :, :CACHE_LEN - 1], atol=1e-5, rtol=1e-5)
    assert [int(layer.cumulative_length) for layer in cache.layers] == [CACHE_LEN - 1] * len(cache.layers)


def test_a_cache_made_by_the_prefill_itself_replays_too(fake_cuda_graphs: tuple[FakeCuda, list[CudaGraphReplay]]) -> None:
    """A StaticCache not filled before compiling: the prefill's graph makes the cache tensors
    (outputs, not written inputs) and only advances the step counters in place."""
    _, made = fake_cuda_graphs
    model = _tiny_llama()
    ids = torch.randint(0, 100, (BATCH, PROMPT), generator=torch.Generator().manual_seed(2))
    expected = _generate(model.forward, ids, transformers.StaticCache(config=model.config, max_cache_len=CACHE_LEN))
    compiled = torch.compile(model.forward, backend="graphopt", fullgraph=True, dynamic=False,
                             options={"inductor": False, "mode": "reduce-overhead"})
    cache = transformers.StaticCache(config=model.config, max_cache_len=CACHE_LEN)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = _generate(compiled, ids, cache)
    assert torch.equal(got, expected), (got, expected)
    assert [r.failed for r in made] == [None, None] and made[1].graph.replays == NEW_TOKENS - 1
    assert [int(layer.cumulative_length) for layer in cache.layers] == [CACHE_LEN - 1] * len(cache.layers)
