"""torch.compile(backend="graphopt") under torch.distributed, on the CPU: two gloo processes
train tests/test_torch_handwritten_forms.py's model for three AdamW steps, wrapped in DDP or
sharded with FSDP2 (fully_shard), and every rank's losses equal those of the same training
without compiling (correctness only; step times are the GPU benchmarks' job)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = Path(__file__).resolve().parent
STEPS, WORLD = 3, 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train(rank: int, port: int, wrap: str, queue: Any) -> None:
    sys.path.insert(0, str(HERE))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        reference = _steps(rank, wrap, compiled=False)
        got = _steps(rank, wrap, compiled=True)
        queue.put((rank, reference, got))
    finally:
        dist.destroy_process_group()


def _steps(rank: int, wrap: str, compiled: bool) -> tuple[list[float], list[str]]:
    from test_torch_handwritten_forms import HandWritten

    from graphopt.torch_backend import torch_reports

    torch.manual_seed(0)
    model: torch.nn.Module = HandWritten()
    if wrap == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    run = torch.compile(model, backend="graphopt", options={"inductor": False}) if compiled else model
    losses = []
    for step in range(STEPS):
        torch.manual_seed(100 + step * WORLD + rank)
        x, y = torch.randn(16, 32), torch.randn(16, 8)
        loss = torch.nn.functional.mse_loss(run(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    applied = sorted({name for r in torch_reports() for name, s in r.rules.items() if s.applications}) if compiled else []
    return losses, applied


def _run(wrap: str) -> dict[int, tuple[Any, Any]]:
    """rank -> (uncompiled (losses, []), compiled (losses, rules applied)), both trained in the same processes."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_train, args=(rank, port, wrap, queue)) for rank in range(WORLD)]
    for p in procs:
        p.start()
    results = {}
    for _ in range(WORLD):
        rank, reference, got = queue.get(timeout=240)
        results[rank] = (reference, got)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0, f"rank process exited with {p.exitcode}"
    return results


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch built without gloo")
@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_losses_equal_uncompiled_training_on_two_gloo_ranks(wrap: str) -> None:
    results = _run(wrap)
    for rank, ((reference, _), (losses, applied)) in results.items():
        assert losses == pytest.approx(reference, rel=1e-5, abs=1e-6), (rank, losses, reference)
        # graphopt ran on every rank (the written-out LayerNorm keeps its gradient: it is fused in training too).
        assert "FuseLayerNorm" in applied, (wrap, rank, applied)
