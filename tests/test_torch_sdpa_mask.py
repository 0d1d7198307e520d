"""The attn_mask graphopt hands SDPA (graphopt/passes/fx_sdpa.py; issue 15, T5 1.13x slower than
inductor on an H100).

T5's relative position bias is `.contiguous()` of a permuted embedding; drop_clones removes the
copy and constant folding freezes the view (last-axis stride = heads), which a fused CUDA
attention kernel refuses (SDPA's math form runs instead). On a CPU nothing shows it, so these
tests look at what inductor is handed: the mask's layout, dtype and alignment under each
`attention_mask` handling, and the outputs against eager.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
import torch.nn as nn
import transformers

from graphopt.errors import GraphoptError
from graphopt.passes.fx_passes import attr_tensor
from graphopt.passes.fx_sdpa import aligned_mask, fused_ready
from graphopt.torch_backend import last_graph, last_report
from graphopt.torch_options import TorchOptions

pytestmark = pytest.mark.usefixtures("graphopt_never_falls_back")  # tests/conftest.py

aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default
ATEN_ONLY = {"inductor": False, "kernels": "none"}  # the graph run as it is, ATen ops only


@pytest.fixture(autouse=True)
def _fresh() -> None:
    torch._dynamo.reset()


def _t5(layers: int = 2, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    cfg = transformers.T5Config(d_model=64, d_ff=128, num_layers=layers, num_heads=4, d_kv=16, vocab_size=100, use_cache=False)
    return transformers.T5EncoderModel(cfg).eval().to(dtype)


def _handed_to_inductor(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The graphs handed to inductor, run as they are (what is asserted is the graph)."""
    import torch._inductor.compile_fx as inductor_compile_fx

    seen: list[Any] = []

    def stub(gm: Any, inputs: Any, **kwargs: Any) -> Any:
        seen.append(gm)
        return gm

    monkeypatch.setattr(inductor_compile_fx, "compile_fx", stub)
    return seen


def _masks(gm: Any) -> list[tuple[Any, Any]]:
    """(mask node, the constant itself or None) of every SDPA, and each query's dtype alongside."""
    found = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is SDPA:
            mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
            found.append((mask, attr_tensor(gm, str(mask.target)) if mask.op == "get_attr" else None))
    return found


def _changes() -> int:
    report = last_report()
    assert report is not None
    return report.passes["attention_masks"].changes


def _run_t5(options: dict[str, Any], dtype: torch.dtype = torch.float32, seq: int = 16, layers: int = 2) -> None:
    model, ids = _t5(layers, dtype), torch.randint(0, 100, (2, seq))
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt", options=options)(input_ids=ids).last_hidden_state
        want = model(input_ids=ids).last_hidden_state
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, atol=tolerance, rtol=tolerance)


def test_by_default_the_folded_mask_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """"keep" (the default until the GPU check has run): the strided bias as folding left it."""
    seen = _handed_to_inductor(monkeypatch)
    _run_t5({})
    masks = _masks(seen[-1])
    assert len(masks) == 2 and all(t is not None and t.stride(-1) == 4 for _, t in masks)  # [1, heads, q, k] on [q, k, heads]
    assert not fused_ready(masks[0][1], torch.float32)
    assert _changes() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_aligned_gives_t5_a_fresh_aligned_constant_in_the_query_dtype(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    seen = _handed_to_inductor(monkeypatch)
    _run_t5({"attention_mask": "aligned"}, dtype)
    masks = _masks(seen[-1])
    assert len(masks) == 2 and masks[0][0] is masks[1][0]  # one constant for both layers
    tensor = masks[0][1]
    assert tensor is not None and tensor.dtype == dtype and tuple(tensor.shape) == (1, 4, 16, 16)
    assert tensor.stride() == (1024, 256, 16, 1) and tensor.is_contiguous()
    assert tensor.storage_offset() == 0 and tensor.data_ptr() % 16 == 0
    assert fused_ready(tensor, dtype) and fused_ready(masks[0][0].meta["val"], dtype)  # the fake value says the same
    assert _changes() == 1


def test_aligned_pads_an_odd_key_length() -> None:
    """13 keys: the rows padded to 16 elements (as aten's pad_bias does per call), a view of the first 13."""
    _run_t5({**ATEN_ONLY, "attention_mask": "aligned"}, seq=13)
    graph = last_graph()
    assert graph is not None
    (tensor,) = {id(t): t for _, t in _masks(graph)}.values()
    assert tuple(tensor.shape) == (1, 4, 13, 13) and tensor.stride() == (832, 208, 16, 1)
    assert tensor.storage_offset() == 0 and tensor.data_ptr() % 16 == 0 and tensor.untyped_storage().nbytes() == 832 * 4
    assert not tensor.is_contiguous() and fused_ready(tensor, torch.float32)


def test_aligned_leaves_inductor_reading_the_constant_itself() -> None:
    """Inductor's code (C++ here): each attention reads the frozen mask, a graph input, with no per-call copy."""
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    model, ids = _t5(), torch.randint(0, 100, (2, 16))
    with torch.no_grad(), inductor_config.patch(fx_graph_cache=False):
        _, codes = run_and_get_code(torch.compile(model, backend="graphopt", options={"attention_mask": "aligned"}), input_ids=ids)
    masks = re.findall(r"attn_mask=(\w+)", "\n".join(codes))
    assert len(masks) == 2 and len(set(masks)) == 1 and re.fullmatch(r"arg\d+_1", masks[0]), masks


def test_copy_copies_the_mask_in_the_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _handed_to_inductor(monkeypatch)
    _run_t5({"attention_mask": "copy"})
    masks = _masks(seen[-1])
    (mask,) = {m for m, _ in masks}  # one copy, read by both attentions
    assert mask.target is aten.clone.default and mask.kwargs == {"memory_format": torch.contiguous_format}
    (source,) = mask.all_input_nodes
    assert source.op == "get_attr" and attr_tensor(seen[-1], str(source.target)).stride(-1) == 4
    assert _changes() == 1


def test_decompose_writes_the_attention_out(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _handed_to_inductor(monkeypatch)
    _run_t5({"attention_mask": "decompose"}, torch.float16)
    nodes = list(seen[-1].graph.nodes)
    assert not [n for n in nodes if n.target is SDPA]
    assert len([n for n in nodes if n.target is aten._softmax.default]) == 2
    softmax = next(n for n in nodes if n.target is aten._softmax.default)
    assert softmax.meta["val"].dtype == torch.float32  # the scores and the softmax in float32, the GEMMs in fp16
    assert _changes() == 2


class PermutedMaskAttention(nn.Module):
    """A mask computed from an input and permuted: not a constant, so it is copied in the graph."""

    def forward(self, q: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        mask = bias.permute(0, 3, 1, 2) * 0.5  # [b, q, k, heads] -> [b, heads, q, k], last-axis stride = heads
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)


def test_a_computed_strided_mask_gets_a_contiguous_copy() -> None:
    q, bias = torch.randn(2, 4, 8, 16), torch.randn(2, 8, 8, 4)
    model = PermutedMaskAttention()
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt", options={**ATEN_ONLY, "attention_mask": "aligned"})(q, bias)
        torch.testing.assert_close(got, model(q, bias))
    graph = last_graph()
    assert graph is not None
    ((mask, _),) = _masks(graph)
    assert mask.target is aten.clone.default and mask.meta["val"].stride(-1) == 1
    assert _changes() == 1


class ConstantMaskAttention(nn.Module):
    """SDPA with a frozen mask: `layout` says how it is stored (what folding may leave)."""

    def __init__(self, layout: str, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        torch.manual_seed(0)
        bias = torch.randn(8, 8, 4, dtype=dtype)  # [q, k, heads]
        masks = {"permuted": bias.permute(2, 0, 1).unsqueeze(0), "dense": bias.permute(2, 0, 1).unsqueeze(0).contiguous(),
                 "bool": bias.permute(2, 0, 1).unsqueeze(0) > 0}
        self.register_buffer("mask", masks[layout])

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=self.mask)


def test_a_float32_mask_is_frozen_in_the_query_dtype() -> None:
    """A float32 mask with fp16 queries: the memory-efficient kernel refuses it, cuDNN misreads it; stored in fp16."""
    q = torch.randn(2, 4, 8, 16, dtype=torch.float16)
    model = ConstantMaskAttention("permuted")
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt", options={**ATEN_ONLY, "attention_mask": "aligned"})(q)
        torch.testing.assert_close(got, model(q), atol=2e-3, rtol=2e-3)
    graph = last_graph()
    assert graph is not None
    ((_, tensor),) = _masks(graph)
    assert tensor.dtype == torch.float16 and fused_ready(tensor, torch.float16) and _changes() == 1


@pytest.mark.parametrize("layout", ["dense", "bool"])
def test_masks_a_fused_kernel_reads_are_left_alone(layout: str) -> None:
    q = torch.randn(2, 4, 8, 16)
    model = ConstantMaskAttention(layout)
    with torch.no_grad():
        got = torch.compile(model, backend="graphopt", options={**ATEN_ONLY, "attention_mask": "aligned"})(q)
        torch.testing.assert_close(got, model(q))
    graph = last_graph()
    assert graph is not None
    ((mask, tensor),) = _masks(graph)
    assert mask.op == "get_attr" and not str(mask.target).endswith(tuple(f"_aligned_{i}" for i in range(100)))
    assert tensor.dtype == (torch.bool if layout == "bool" else torch.float32) and _changes() == 0


def test_fused_ready() -> None:
    half = torch.float16
    dense = torch.randn(1, 4, 16, 16, dtype=half)
    assert fused_ready(dense, half) and fused_ready(dense.expand(8, 4, 16, 16), half)  # a broadcast batch (stride 0) is fine
    assert not fused_ready(dense.transpose(-1, -2), half)  # strided last axis
    assert not fused_ready(torch.randn(1, 4, 13, 13, dtype=half), half)  # rows of 13 elements: not a multiple of 8
    assert not fused_ready(dense.float(), half)  # not the query's dtype
    assert not fused_ready(torch.randn(4 + 1 * 4 * 16 * 16, dtype=half)[4:].view(1, 4, 16, 16), half)  # 8 bytes off
    assert fused_ready(torch.randn(8 + 1 * 4 * 16 * 16, dtype=half)[8:].view(1, 4, 16, 16), half)  # 16 bytes off
    assert fused_ready(dense > 0, half) and fused_ready(None, half) and fused_ready(torch.tensor(1.0), half)
    odd = aligned_mask(torch.randn(13, 13, 4).permute(2, 0, 1).unsqueeze(0), half)
    assert odd.dtype == half and odd.stride() == (832, 208, 16, 1) and odd.data_ptr() % 16 == 0 and fused_ready(odd, half)


def test_the_option_takes_only_known_handlings() -> None:
    assert TorchOptions.parse({"attention_mask": "copy"}).attention_mask == "copy"
    assert TorchOptions.parse({}).attention_mask == "keep"
    with pytest.raises(GraphoptError, match="'attention_mask' takes one of keep, aligned, copy, decompose, not 'dense'"):
        TorchOptions.parse({"attention_mask": "dense"})
