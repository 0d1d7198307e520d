"""Training through the backend when graphopt's graph (not dynamo's) goes to inductor, with
buffers the forward updates (BatchNorm's running statistics)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx as fx

import graphopt.torch_backend  # noqa: F401  (registers the backend)
from graphopt.passes.fx_training import copy_mutated_inputs_for_autograd

nn = torch.nn


def _convnet() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 16, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4)).train()


def _train(model: nn.Module, run, steps: int = 2) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = run(torch.randn(2, 3, 12, 12, generator=generator)).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return losses


def test_batchnorm_training_through_graphopts_own_graph_matches_eager():
    # layout="nhwc" makes the graph graphopt's own (dynamo's graph would go to inductor untouched):
    # before the fix aot_autograd refused it ("modified by an inplace operation").
    eager, compiled = _convnet(), _convnet()
    compiled.load_state_dict(copy.deepcopy(eager.state_dict()))
    expected = _train(eager, eager)
    torch._dynamo.reset()
    got = _train(compiled, torch.compile(compiled, backend="graphopt", options={"layout": "nhwc"}))
    assert got == pytest.approx(expected, rel=1e-4)
    for (name, want), have in zip(eager.state_dict().items(), compiled.state_dict().values()):
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-5, msg=name)  # running stats updated as eager's


def _graph_with_buffer_update() -> fx.GraphModule:
    graph = fx.Graph()
    x, stat = graph.placeholder("x"), graph.placeholder("stat")
    y = graph.call_function(torch.ops.aten.mul.Tensor, (x, stat))
    new = graph.call_function(torch.ops.aten.add.Tensor, (stat, 1))
    graph.call_function(torch.ops.aten.copy_.default, (stat, new))
    graph.output((y,))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_readers_of_a_mutated_input_read_one_copy():
    gm = _graph_with_buffer_update()
    assert copy_mutated_inputs_for_autograd(gm) == 1
    clones = [n for n in gm.graph.nodes if n.target is torch.ops.aten.clone.default]
    assert len(clones) == 1
    copy_node = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.copy_.default)
    assert copy_node.args[0].op == "placeholder"  # the write still goes to the input itself
    stat = torch.tensor([2.0])
    (y,) = gm(torch.tensor([3.0]), stat)
    assert float(y) == 6.0 and float(stat) == 3.0


def test_inputs_nobody_writes_are_left_alone():
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output((graph.call_function(torch.ops.aten.relu.default, (x,)),))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    assert copy_mutated_inputs_for_autograd(gm) == 0
    assert not any(n.target is torch.ops.aten.clone.default for n in gm.graph.nodes)
