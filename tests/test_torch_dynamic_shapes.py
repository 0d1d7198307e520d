"""Dynamic shapes through torch.compile(backend="graphopt") (issue 15): with dynamic=True, or
torch._dynamo.mark_dynamic on batch and sequence, a BERT-ish and a LLaMA-ish model compile
once and run three sizes: outputs equal eager's, the rewrites applied, no recompilation.

inductor=False keeps these fast (the rewritten graph runs as it is, custom kernels
included); one LLaMA case runs the default mode through inductor (its symbolic-shape
compile of graphopt's graph).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers

from graphopt.ops.torch_lowering import ensure_kernels
from graphopt.torch_backend import clear_reports, torch_reports

pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py

SIZES = ((2, 16), (3, 9), (5, 23))  # (batch, seq): the first compiles, the others must reuse it

#: The rewrites per rule, one layer each (LLaMA: 4 query heads on 2 key/value heads).
BERT_RULES = {"FuseSkipLayerNorm": 2, "FuseScaledDotProductAttention": 1, "DropNoOpReshape": 1, "CollapseShapeOps": 1}
LLAMA_ATEN_FORMS = {"FuseRMSNorm": 3, "FuseSkipRMSNorm": 2, "FuseRotaryEmbedding": 2, "FuseSwiGLU": 1, "DropNoOpReshape": 1}
LLAMA_KERNELS = LLAMA_ATEN_FORMS | {"FuseScaledDotProductAttention": 1}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    assert ensure_kernels() is None
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    clear_reports()


def _bert() -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    cfg = transformers.BertConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                  vocab_size=100, max_position_embeddings=64)
    return transformers.BertModel(cfg).eval(), lambda ids: {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _llama() -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=100, max_position_embeddings=64, use_cache=False)
    return transformers.LlamaModel(cfg).eval(), lambda ids: {"input_ids": ids, "use_cache": False}


def _run_sizes(model: torch.nn.Module, inputs: Any, how: str, options: dict[str, Any]) -> None:
    compiled = torch.compile(model, backend="graphopt", options=options, dynamic=True if how == "dynamic" else None)
    torch.manual_seed(1)
    with torch.no_grad():
        for batch, seq in SIZES:
            kwargs = inputs(torch.randint(0, 100, (batch, seq)))
            if how == "mark_dynamic":  # batch and sequence of every tensor input (the mask's too: they are one dim)
                for t in kwargs.values():
                    if isinstance(t, torch.Tensor):
                        torch._dynamo.mark_dynamic(t, 0)
                        torch._dynamo.mark_dynamic(t, 1, min=2, max=64)
            torch.testing.assert_close(compiled(**kwargs)[0], model(**kwargs)[0], atol=1e-4, rtol=1e-4)


def _compiled_once() -> Any:
    counters = torch._dynamo.utils.counters
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["recompiles"], dict(counters["recompiles"])
    (report,) = torch_reports()  # graphopt compiled one graph, once
    return report


def _applied(report: Any) -> dict[str, int]:
    return {name: stats.applications for name, stats in report.rules.items() if stats.applications}


@pytest.mark.parametrize("how", ["dynamic", "mark_dynamic"])
def test_bert_compiles_once_for_every_size(how: str) -> None:
    _run_sizes(*_bert(), how, {"inductor": False})
    assert _applied(_compiled_once()) == BERT_RULES


@pytest.mark.parametrize("how", ["dynamic", "mark_dynamic"])
def test_llama_compiles_once_for_every_size(how: str) -> None:
    _run_sizes(*_llama(), how, {"inductor": False})
    report = _compiled_once()
    # dynamic=True passes the norms' eps and the rotary scaling as 0-d tensors: frozen back
    # into numbers, the RMSNorm and rotary rules still see them.
    # repeat_kv goes once, by the rule FuseGroupedKV where the symbolic sizes let it prove the
    # copies are repeats (mark_dynamic), else by the unrepeat_kv pass after lowering (dynamic=True)
    by_rule = how == "mark_dynamic"
    assert _applied(report) == LLAMA_KERNELS | ({"FuseGroupedKV": 1} if by_rule else {})
    assert (report.passes["unrepeat_kv"].changes, report.passes["pack_projections"].changes) == (0 if by_rule else 1, 3)


def test_llama_default_mode_through_inductor_compiles_once() -> None:
    _run_sizes(*_llama(), "dynamic", {})
    report = _compiled_once()
    assert _applied(report) == LLAMA_ATEN_FORMS
    assert (report.passes["unrepeat_kv"].changes, report.passes["pack_projections"].changes) == (1, 3)
