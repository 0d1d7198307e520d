"""drop_clones keeps a clone to a memory format (graphopt/passes/fx_passes.py; issue 15).

A bilinear upsample of a channels-last tensor decomposes to gathers and a
`clone(memory_format=torch.channels_last)`; inductor lays out the upsample's buffer and the
buffers around it (SegFormer's decode head: four upsamples, a concat, a 1x1 conv) by that
clone. graphopt dropped it as a plain copy: the concat became NCHW, filled by gathers across
channels-last rows, and SegFormer ran 1.36x inductor's time on CPU (benchmarks/RESULTS.md,
2026-11-28). A plain `.contiguous()` clone is still dropped.
"""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from graphopt.passes.fx_passes import drop_clones
from graphopt.torch_backend import last_graph

aten = torch.ops.aten


def _clones(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is aten.clone.default]


def test_a_memory_format_clone_stays_a_plain_one_goes() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        laid_out = aten.clone.default(x * 2, memory_format=torch.channels_last)
        copied = aten.clone.default(x.transpose(2, 3))
        return laid_out + copied.transpose(2, 3)

    gm = fx.symbolic_trace(f)
    assert len(_clones(gm)) == 2
    assert drop_clones(gm) == 1
    [kept] = _clones(gm)
    assert kept.kwargs["memory_format"] == torch.channels_last
    gm.recompile()
    x = torch.randn(1, 3, 4, 5)
    torch.testing.assert_close(gm(x), f(x))


def test_contiguous_and_preserve_format_clones_are_plain_copies() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        kept_order = aten.clone.default(x + 1, memory_format=torch.preserve_format) * 3
        return kept_order + aten.clone.default(x.transpose(2, 3), memory_format=torch.contiguous_format).transpose(2, 3)

    gm = fx.symbolic_trace(f)
    assert drop_clones(gm) == 2 and not _clones(gm)


class _DecodeHead(nn.Module):
    """SegFormer's decode head in small: a per-pixel linear on a feature map read as rows
    (channels-last strides), upsampled bilinearly, concatenated with another, a 1x1 conv."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 8)
        self.fuse = nn.Conv2d(16, 8, 1)

    def forward(self, feature: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        b, c, h, w = feature.shape
        rows = self.proj(feature.flatten(2).transpose(1, 2))               # [b, h*w, 8]
        grid = rows.permute(0, 2, 1).reshape(b, -1, h, w)                    # channels-last strides
        up = F.interpolate(grid, size=skip.shape[2:], mode="bilinear", align_corners=False)
        return self.fuse(torch.cat([up, skip], dim=1))


def test_the_upsample_keeps_its_layout_clone_through_the_backend() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _DecodeHead().eval()
    feature, skip = torch.randn(1, 16, 4, 4), torch.randn(1, 8, 8, 8)
    with torch.no_grad():
        expected = model(feature, skip)
        got = torch.compile(model, backend="graphopt", options={"inductor": False})(feature, skip)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    graph = last_graph()
    assert graph is not None
    formats = [n.kwargs.get("memory_format") for n in _clones(graph)]
    assert torch.channels_last in formats
