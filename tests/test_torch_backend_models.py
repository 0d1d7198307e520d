"""torch.compile(model, backend="graphopt") on the model families of tests/models.py, built
from tiny configs with random weights: outputs equal eager's, the expected fusions happen
(counted in the report and in the compiled graph), no more graph breaks than dynamo makes
for any other backend, and gradients equal eager's where they flow.

Inductor compiles C++ on this machine; these tests run the rewritten graph as it is
(options={"inductor": False}); tests/test_torch_backend.py runs inductor once.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
import transformers

import graphopt
from graphopt.ir.fx_view import FxView
from graphopt.ops.torch_lowering import ensure_kernels
from graphopt.torch_backend import last_graph, torch_reports

OPTIONS = {"inductor": False}


pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py


@pytest.fixture(autouse=True)
def _kernels_registered() -> None:
    assert ensure_kernels() is None, "graphopt.kernels registers torch.ops.graphopt.*"


def _graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def _compile_and_compare(model: torch.nn.Module, kwargs: dict[str, Any], atol: float = 1e-4) -> tuple[list[Any], Counter[str]]:
    """Compile with graphopt and with dynamo's eager backend; compare outputs and graph breaks.
    Returns graphopt's reports and the fused-kernel calls in its (first) graph."""
    with torch.no_grad():
        expected = model(**kwargs)[0]
        torch._dynamo.utils.counters.clear()
        got = torch.compile(model, backend="graphopt", options=OPTIONS)(**kwargs)[0]
        breaks = _graph_breaks()
        calls = _custom_calls()  # before the reset below lets the compiled graph go
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        torch.compile(model, backend="eager")(**kwargs)
        eager_breaks = _graph_breaks()
    torch.testing.assert_close(got, expected, atol=atol, rtol=1e-4)
    assert breaks <= eager_breaks, f"graphopt made {breaks} graph breaks, dynamo alone {eager_breaks}"
    reports = torch_reports()
    assert reports, "the backend left a report"
    return reports, calls


def _applied(report: Any) -> dict[str, int]:
    return {name: stats.applications for name, stats in report.rules.items() if stats.applications}


def _custom_calls() -> Counter[str]:
    graph = last_graph()
    assert graph is not None
    fused = ("graphopt.", "aten._addmm_activation")  # graphopt's kernels, and the ATen epilogue GEMM it emits
    return Counter(str(n.target) for n in graph.graph.nodes if n.op == "call_function" and str(n.target).startswith(fused))


def _tokens(batch: int = 2, seq: int = 16, vocab: int = 100, padded: bool = True) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    if padded:
        mask[1, seq - 5:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _bert(attn: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                  vocab_size=100, attn_implementation=attn)
    return transformers.BertModel(cfg).eval()


@pytest.mark.parametrize("attn, attention_rule", [("sdpa", "FuseScaledDotProductAttention"), ("eager", "FuseAttention")])
def test_bert(attn: str, attention_rule: str) -> None:
    reports, calls = _compile_and_compare(_bert(attn), _tokens())
    applied = _applied(reports[0])
    assert applied[attention_rule] == 2  # one per layer
    assert applied["FuseSkipLayerNorm"] == 4  # attention and MLP residuals of both layers
    assert calls["graphopt.attention.default"] == 2
    assert calls["graphopt.layer_norm.default"] == 4
    # The embedding LayerNorm adds position embeddings [1, seq, hidden] to [batch, seq, hidden]: no SkipLayerNorm.
    misses = {m.reason for m in reports[0].rules["FuseSkipLayerNorm"].near_misses}
    assert any("not known to be equal" in reason for reason in misses)
    assert reports[0].after.ops.get("LayerNormalization") == 1


def test_gpt2_written_out_gelu_and_pre_ln_residuals() -> None:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=64, use_cache=False,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2Model(cfg).eval()
    reports, calls = _compile_and_compare(model, {"input_ids": _tokens()["input_ids"]})
    applied = _applied(reports[0])
    assert applied["FuseScaledDotProductAttention"] == 2
    assert applied["FuseGeluTanh"] == 2  # NewGELU's tanh formula -> aten.gelu(approximate="tanh")
    assert applied.get("FuseSkipLayerNorm", 0) == 4
    assert reports[0].after.ops.get("Gelu") == 2 and "Tanh" not in reports[0].after.ops
    # On CUDA the MLP projection would take it as its epilogue (cuBLASLt's bias + tanh GELU).
    misses = {m.reason for m in reports[0].rules["FuseGemmActivation"].near_misses}
    assert "FuseGemmActivation" not in applied and any("CUDA tensors only" in r for r in misses)
    assert calls["graphopt.layer_norm.default"] == 4


def test_llama_gqa_rotary_rmsnorm_swiglu() -> None:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=100, max_position_embeddings=64, use_cache=False)
    model = transformers.LlamaModel(cfg).eval()
    reports, calls = _compile_and_compare(model, {"input_ids": _tokens()["input_ids"], "use_cache": False})
    applied = _applied(reports[0])
    assert applied["FuseScaledDotProductAttention"] == 2  # 4 query heads on 2 key/value heads
    assert applied["FuseRotaryEmbedding"] == 4  # q and k of both layers
    assert applied["FuseRMSNorm"] == 5  # 2 per layer and the final norm
    assert applied.get("FuseSkipRMSNorm", 0) == 4
    assert applied["FuseSwiGLU"] == 2
    assert calls["graphopt.rotary.default"] == 4
    assert calls["graphopt.swiglu.default"] == 2
    assert calls["graphopt.rms_norm.default"] == 5
    assert calls["graphopt.attention.default"] == 2


def test_vit() -> None:
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                 image_size=32, patch_size=8)
    model = transformers.ViTModel(cfg).eval()
    reports, calls = _compile_and_compare(model, {"pixel_values": torch.randn(2, 3, 32, 32)})
    applied = _applied(reports[0])
    assert applied["FuseScaledDotProductAttention"] == 2
    assert applied.get("FuseSkipLayerNorm", 0) == 4
    assert reports[0].after.ops.get("Conv") == 1  # the patch embedding stays
    assert calls["graphopt.attention.default"] == 2 and calls["graphopt.layer_norm.default"] == 4


def test_resnet_like_cnn_folds_batch_norm_and_runs_channels_last() -> None:
    from tests.models import _randomize_bn, _ResNet

    torch.manual_seed(0)
    model = _randomize_bn(_ResNet((1, 1), 8, 10)).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model, backend="graphopt", options={"inductor": False, "layout": "nhwc"})(x)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    report = graphopt.last_report()
    # every Conv had a BatchNorm; the ReLUs and residual adds join the convolutions as graphopt.FusedConv,
    # which on CPU tensors (no cuDNN fused kernel) lowers back to the convolution, add and ReLU
    assert _applied(report) == {"FoldConvBatchNorm": 9, "FuseConvActivation": 7, "FuseConvAdd": 2}
    assert "BatchNormalization" not in report.after.ops and report.after.ops["Conv"] + report.after.ops["graphopt.FusedConv"] == 9
    assert report.passes["layout"].changes == 9
    graph = last_graph()
    weights = [graph.get_buffer(str(n.args[1].target)) for n in graph.graph.nodes if n.target is torch.ops.aten.convolution.default]
    assert weights and all(w.is_contiguous(memory_format=torch.channels_last) for w in weights)


def test_training_gradients_equal_eager_and_fused_ops_stay_out() -> None:
    model = _bert("eager")  # eval(): no dropout, so eager and compiled runs see the same numbers
    inputs = _tokens()
    model(**inputs)[0].square().sum().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    compiled = torch.compile(model, backend="graphopt", options=OPTIONS)
    compiled(**inputs)[0].square().sum().backward()
    for name, grad in expected.items():
        param = dict(model.named_parameters())[name]
        assert param.grad is not None, name
        torch.testing.assert_close(param.grad, grad, atol=1e-5, rtol=1e-4, msg=name)
    report = graphopt.last_report()
    assert report.target == "torch-train"
    assert "FuseAttention" not in _applied(report)  # graphopt::attention has no gradient formula
    reasons = {m.reason for m in report.rules["FuseAttention"].near_misses}
    assert any("torch-train has no lowering for graphopt.MultiHeadAttention" in r for r in reasons)
    assert _applied(report)["CollapseReshapes"] > 0  # rewrites onto differentiable ATen ops still apply


def test_symbolic_shapes_keep_their_names() -> None:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=100, max_position_embeddings=64, use_cache=False)
    model = transformers.LlamaModel(cfg).eval()
    compiled = torch.compile(model, backend="graphopt", options=OPTIONS, dynamic=True)
    with torch.no_grad():
        for batch, seq in ((2, 16), (3, 9)):
            ids = torch.randint(0, 100, (batch, seq))
            torch.testing.assert_close(compiled(input_ids=ids, use_cache=False)[0], model(input_ids=ids, use_cache=False)[0],
                                       atol=1e-4, rtol=1e-4)
    report = torch_reports()[0]
    # Dims dynamo made symbolic reach the rules as names: attention still fuses on [s, 4, s', 16].
    assert _applied(report)["FuseScaledDotProductAttention"] == 1
    graph = last_graph()
    view = FxView(graph)
    shapes = [view.shape(n) for n in graph.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)]
    names = {d for shape in shapes if shape for d in shape if isinstance(d, str)}
    assert names and all(name.startswith("s") for name in names), shapes  # dynamo's symbols, by name
