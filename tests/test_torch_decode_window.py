"""The decode step's key range on the torch path (graphopt/ops/fx_key_range.py -> graphopt::decode_attention):
a static cache's boolean mask, proven from the FX graph to hide every row after the query (causal) and, with a
sliding window, every row at or before query - window, hands the kernel the rows' positions, the query's and the
window, so that it reads only those rows. A tiny Mistral (window 8) generating past its window, against eager:
with a cache of every position (the window a mask over 32 rows: the kernel reads 8) and with transformers' own
sliding layers (8 rows, rolled); LLaMA's full cache gets the causal bound alone. The kernel itself is tested under
TRITON_INTERPRET=1 in tests/kernels_interpreter_cases.py (test_decode_attention_reads_only_the_key_range)."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from llm_families import TINY_WINDOW, config
from torch.fx.experimental.proxy_tensor import make_fx

from graphopt import torch_backend
from graphopt.ops.fx_key_range import key_range
from graphopt.ops.torch_lowering import ensure_kernels

pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py

PROMPT, NEW_TOKENS, CACHE_LEN = 5, 14, 32  # 19 positions: past the window of 8


@pytest.fixture(autouse=True)
def _kernels_registered() -> None:
    assert ensure_kernels() is None


def _greedy(forward: Any, model: Any, cache_config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    cache = transformers.StaticCache(config=cache_config, max_cache_len=CACHE_LEN)
    ids = torch.randint(0, model.config.vocab_size, (2, PROMPT), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        out = forward(input_ids=ids, cache_position=torch.arange(PROMPT), use_cache=True, past_key_values=cache)
        tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
        for step in range(NEW_TOKENS - 1):
            out = forward(input_ids=tokens[-1], cache_position=torch.tensor([PROMPT + step]), use_cache=True, past_key_values=cache)
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(tokens, 1), out.logits


def _decode_attention_ranges(model: Any, cache_config: Any) -> list[tuple[Any, ...]]:
    """Generate eagerly and compiled (graphopt's kernels, the CUDA-graph mode's kernel choice: on the CPU it runs
    without the replay); tokens equal, logits close; the key-range arguments of the last graph's split-K calls."""
    expected, expected_logits = _greedy(model.forward, model, cache_config)
    torch_backend.clear_reports()
    compiled = torch.compile(model.forward, backend="graphopt", fullgraph=True, options={"inductor": False, "mode": "reduce-overhead"})
    got, logits = _greedy(compiled, model, cache_config)
    assert torch.equal(got, expected), (got, expected)
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=1e-4)
    decode = torch_backend.last_graph()
    assert decode is not None
    calls = [n for n in decode.graph.nodes if str(n.target) == "graphopt.decode_attention.default"]
    assert len(calls) == 2, "one split-K attention per layer"
    return [tuple(n.args[5:]) for n in calls]


def _mistral() -> Any:
    torch.manual_seed(0)
    return transformers.MistralForCausalLM(config("mistral")).eval()


def test_a_sliding_window_over_a_cache_of_every_position_reaches_the_kernel() -> None:
    """Every layer a row per position (32): the mask is causal And a window of 8 over all 32 rows; the kernel gets
    the rows' positions (the folded arange), the query's and 8."""
    model = _mistral()
    full = copy.deepcopy(model.config)
    full.layer_types = ["full_attention"] * full.num_hidden_layers
    for key_positions, query_position, window in _decode_attention_ranges(model, full):
        assert window == TINY_WINDOW
        assert tuple(key_positions.meta["val"].shape)[-1] == CACHE_LEN and query_position.meta["val"].numel() == 1


def test_transformers_sliding_layers_get_the_window_too() -> None:
    """transformers' StaticCache from the config: sliding layers of min(8, 32) rows, rolled once full, row 0 at
    max(position - 7, 0) (arange + a symbolic offset): the window reaches the kernel; it reads those 8 rows, as
    the cache holds no more."""
    model = _mistral()
    for key_positions, _, window in _decode_attention_ranges(model, model.config):
        assert window == TINY_WINDOW and tuple(key_positions.meta["val"].shape) == (TINY_WINDOW,)


def test_a_full_attention_cache_gets_the_causal_bound() -> None:
    """LLaMA: causal alone, window -1: the kernel reads the rows up to the query's position, not the whole cache."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config("llama")).eval()
    for key_positions, _, window in _decode_attention_ranges(model, model.config):
        assert window == -1 and key_positions.meta["val"].numel() == CACHE_LEN


# ----------------------------------------------------------------------------- the proof, on hand-made masks


class _Constants:
    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm

    def const_array(self, node: Any) -> np.ndarray | None:
        return getattr(self.gm, str(node.target)).numpy() if isinstance(node, torch.fx.Node) and node.op == "get_attr" else None


def _mask_graph(make_mask: Any, positions: torch.Tensor) -> tuple[Any, torch.fx.Node]:
    def f(query: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return make_mask(positions.view(1, 1, 1, -1), query.view(1, 1, 1, 1), pad).expand(2, 1, 1, positions.numel())

    gm = make_fx(f)(torch.tensor([9]), torch.ones(2, 1, 1, positions.numel(), dtype=torch.bool))
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return _Constants(gm), out


ROWS = torch.arange(16)


@pytest.mark.parametrize("name, make_mask, positions, window", [
    ("window_and_padding", lambda kv, q, pad: (kv <= q) & (kv > q - 4) & pad, ROWS, 4),
    ("causal_and_padding", lambda kv, q, pad: pad & (kv <= q), ROWS, -1),
    ("rows_from_an_offset", lambda kv, q, pad: (kv <= q) & (kv > q - 4), ROWS + 5, 4),
])
def test_key_range_proven(name: str, make_mask: Any, positions: torch.Tensor, window: int) -> None:
    constants, mask = _mask_graph(make_mask, positions)
    found, why = key_range(constants, mask, positions.numel())
    assert found is not None, why
    assert found.window == window


@pytest.mark.parametrize("name, make_mask, positions, reason", [
    ("window_without_causal", lambda kv, q, pad: (kv > q - 4) & pad, ROWS, "no kv_pos <= q_pos term"),
    ("rows_not_an_arange", lambda kv, q, pad: (kv <= q) & pad, ROWS * 2, "no kv_pos <= q_pos term"),
    ("or_not_and", lambda kv, q, pad: (kv <= q) | pad, ROWS, "no kv_pos <= q_pos term"),
    ("additive", lambda kv, q, pad: torch.where((kv <= q) & pad, 0.0, float("-inf")), ROWS, "not a boolean tensor"),
])
def test_negative_key_range_not_proven(name: str, make_mask: Any, positions: torch.Tensor, reason: str) -> None:
    """A window alone (the rows after the query may be visible), rows that are not consecutive positions, an Or,
    an additive mask: no range, the kernel reads every row."""
    constants, mask = _mask_graph(make_mask, positions)
    found, why = key_range(constants, mask, positions.numel())
    assert found is None and reason in why
