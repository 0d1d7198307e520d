"""The LLaMA-style decoder gets its rewrites in every mode of torch.compile(backend="graphopt")
(issue 15), and a fusion inductor would do better itself never reaches inductor as a custom op.

* default (inductor, no CUDA graphs: kernels "none"): RMSNorm, rotary and SwiGLU fuse and
  lower to their ATen-only forms (graphopt.ops.torch_aten_forms), repeat_kv goes (SDPA
  enable_gqa), q/k/v and gate/up are one GEMM each (fx_pack); inductor is handed that
  graph with no torch.ops.graphopt call in it;
* reduce-overhead (inductor with CUDA graphs: kernels "inductor", only the custom ops
  measured faster than inductor's code, none of which is in a LLaMA block): the same;
* inductor=False: the same rules onto graphopt's custom kernels, attention included.

The rewrite counts are exact, per rule; outputs equal eager's. Inductor compiles C++ here:
the default mode runs it for real once; the other inductor modes hand their graph to a stub
(what is asserted is the graph inductor is given).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
import transformers

from graphopt.ops.torch_lowering import ensure_kernels
from graphopt.torch_backend import last_graph, last_report

pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py

#: One decoder layer (4 query heads on 2 key/value heads), the final norm; the rewrites per rule.
ATEN_FORMS = {"FuseRMSNorm": 3, "FuseSkipRMSNorm": 2, "FuseRotaryEmbedding": 2, "FuseSwiGLU": 1, "DropNoOpReshape": 1}
WITH_KERNELS = ATEN_FORMS | {"FuseScaledDotProductAttention": 1}
#: The passes inductor would not do itself, and their changes: repeat_kv before the one
#: attention; q, k, v packed (two GEMMs fewer) and gate, up (one fewer).
PASSES = {"unrepeat_kv": 1, "pack_projections": 3}


@pytest.fixture(autouse=True)
def _kernels_registered() -> None:
    assert ensure_kernels() is None, "graphopt.kernels registers torch.ops.graphopt.*"
    torch._dynamo.reset()


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=100, max_position_embeddings=64, use_cache=False)
    return transformers.LlamaModel(cfg).eval()


def _ids(batch: int = 2, seq: int = 16) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randint(0, 100, (batch, seq))


def _applied(report: Any) -> dict[str, int]:
    return {name: stats.applications for name, stats in report.rules.items() if stats.applications}


def _passes(report: Any) -> dict[str, int]:
    return {name: report.passes[name].changes for name in PASSES}


def _calls(gm: Any) -> Counter[str]:
    return Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


def _custom_calls(gm: Any) -> Counter[str]:
    return Counter({t: c for t, c in _calls(gm).items() if t.startswith("graphopt.")})


def _spy_inductor(monkeypatch: pytest.MonkeyPatch, stub: bool) -> list[Any]:
    """The graphs handed to inductor; with `stub`, run as they are instead of compiled."""
    import torch._inductor.compile_fx as inductor_compile_fx

    seen: list[Any] = []
    real = inductor_compile_fx.compile_fx

    def spy(gm: Any, inputs: Any, **kwargs: Any) -> Any:
        seen.append(gm)
        return gm if stub else real(gm, inputs, **kwargs)

    monkeypatch.setattr(inductor_compile_fx, "compile_fx", spy)
    return seen


def _run(model: torch.nn.Module, **compile_kw: Any) -> torch.Tensor:
    ids = _ids()
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt", **compile_kw)(input_ids=ids, use_cache=False)[0]
        torch.testing.assert_close(got, model(input_ids=ids, use_cache=False)[0], atol=1e-4, rtol=1e-4)
    return got


def _assert_aten_forms_only(gm: Any) -> None:
    calls = _calls(gm)
    assert not _custom_calls(gm), _custom_calls(gm)  # no custom op: nothing inductor cannot fuse through
    assert "aten.expand.default" not in calls  # repeat_kv's copies of k and v are gone ...
    (sdpa,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.scaled_dot_product_attention.default]
    assert sdpa.kwargs.get("enable_gqa") is True  # ... SDPA reads the 2 key/value heads in groups
    assert calls["aten.silu.default"] == 1 and calls["aten.rsqrt.default"] == 3  # SwiGLU, the 3 RMSNorms in fp32
    assert calls["aten.matmul.default"] == 4  # q|k|v, o, gate|up, down: packed projections


def test_default_mode_rewrites_to_aten_forms_and_hands_inductor_no_custom_op(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _spy_inductor(monkeypatch, stub=False)
    _run(_llama())
    report = last_report()
    assert report is not None and report.target == "torch-aten"
    assert _applied(report) == ATEN_FORMS
    assert _passes(report) == PASSES
    assert not [d for d in report.decisions if d.kind == "graph"]  # not handed over as dynamo captured it
    assert seen and seen[-1] is last_graph()  # inductor was given graphopt's graph ...
    _assert_aten_forms_only(seen[-1])  # ... with the ATen forms, no custom op


def test_reduce_overhead_mode_gets_the_same_rewrites(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _spy_inductor(monkeypatch, stub=True)
    _run(_llama(), mode="reduce-overhead")
    report = last_report()
    assert report is not None and report.target == "torch+inductor"
    assert _applied(report) == ATEN_FORMS
    assert _passes(report) == PASSES
    _assert_aten_forms_only(seen[-1])


def test_without_inductor_the_rules_run_on_graphopt_kernels() -> None:
    _run(_llama(), options={"inductor": False})
    report = last_report()
    assert report is not None and report.target == "torch"
    # without inductor the SDPA is graphopt's, and FuseGroupedKV takes repeat_kv out as a rule
    # before lowering, so the unrepeat_kv pass finds nothing left
    assert _applied(report) == WITH_KERNELS | {"FuseGroupedKV": 1}
    assert _passes(report) == PASSES | {"unrepeat_kv": 0}
    graph = last_graph()
    assert _custom_calls(graph) == Counter({"graphopt.rms_norm.default": 3, "graphopt.rotary.default": 2,
                                            "graphopt.swiglu.default": 1, "graphopt.attention.default": 1})
    assert "aten.expand.default" not in _calls(graph)  # graphopt::attention reads grouped heads itself
    assert _calls(graph)["aten.matmul.default"] == 4


def test_kernels_all_with_inductor_does_hand_it_custom_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative of the default mode: asking for every kernel puts custom ops in inductor's
    graph, so the default mode's "no custom op" above is the kernel policy's doing."""
    seen = _spy_inductor(monkeypatch, stub=True)
    _run(_llama(), options={"kernels": "all"})
    assert _custom_calls(seen[-1])["graphopt.rotary.default"] == 2
