"""A training step through torch.compile(backend="graphopt") against inductor (issue 15, item 4).

Per model, every variant trains copies of the same initial weights on the same batches:
forward + backward + AdamW step, mixed precision (autocast, bf16 by default; fp32 master
weights). Variants:

  eager              the model as it is
  inductor           torch.compile(model)
  graphopt           torch.compile(model, backend="graphopt")  (graphopt's rewrites, then inductor)

Reported per variant: the median step time (CUDA events, after --warmup steps), and the
losses of the first --check steps against eager's (max relative difference). Dropout is
set to 0 so that the losses are comparable.

Distributed (launched by torchrun, one process per GPU): `--wrap ddp` (DistributedDataParallel)
or `--wrap fsdp2` (torch.distributed.fsdp.fully_shard); each rank trains on its own batches,
rank 0 prints the table.

    python benchmarks/torch_train.py --models bert,vit,resnet50 --out $OUT/torch_train.json
    torchrun --nproc_per_node 2 benchmarks/torch_train.py --models bert --wrap ddp --out $OUT/torch_train-ddp.json
    python benchmarks/torch_train.py --tiny --device cpu --variants eager,graphopt --iters 2   # CPU dry run
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = ("eager", "inductor", "graphopt")
MODELS = ("bert", "vit", "resnet50")


def _no_dropout(model: Any) -> None:
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def _loss(output: Any) -> Any:
    """A scalar from any model output (last hidden state, or logits): mean of squares, in fp32.
    The pooler's output counts too: DDP refuses a step where some parameters had no gradient."""
    import torch

    tensor = output if isinstance(output, torch.Tensor) else (output[0] if isinstance(output, (tuple, list)) else output.last_hidden_state)
    loss = tensor.float().square().mean()
    pooled = getattr(output, "pooler_output", None)
    return loss + pooled.float().square().mean() if isinstance(pooled, torch.Tensor) else loss


def _batches(inputs: dict[str, Any], steps: int, seed: int, device: str) -> list[dict[str, Any]]:
    """`steps` batches shaped like `inputs` (token ids redrawn, images resampled)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        batch = {}
        for name, value in inputs.items():
            if value.dtype.is_floating_point:
                batch[name] = torch.randn(value.shape, generator=generator).to(device)
            elif name == "input_ids":
                batch[name] = torch.randint(0, 1000, value.shape, generator=generator).to(device)
            else:
                batch[name] = value.to(device)
        out.append(batch)
    return out


def _wrap(model: Any, wrap: str, device: str) -> Any:
    import torch

    if wrap == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if device == "cuda" else None)
    if wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model)
    return model


def _compile(model: Any, variant: str) -> Any:
    import torch

    if variant == "eager":
        return model
    if variant == "inductor":
        return torch.compile(model)
    if variant == "graphopt":
        from torch_compile import _ensure_backend_registered

        from graphopt.torch_backend import clear_reports

        _ensure_backend_registered()  # also where graphopt is on the path but not installed (its entry point unknown)
        clear_reports()  # this variant's rewrites only
        return torch.compile(model, backend="graphopt")
    raise ValueError(f"unknown variant {variant}")


def train(base: Any, variant: str, batches: list[dict[str, Any]], args: argparse.Namespace, dtype: Any) -> dict[str, Any]:
    import torch

    cuda = args.device == "cuda"
    model = _wrap(copy.deepcopy(base), args.wrap, args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = _compile(model, variant)

    def step(batch: dict[str, Any]) -> float:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=dtype, enabled=dtype != torch.float32):
            loss = _loss(run(*batch.values()))  # positional: the inputs are in forward's order
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    started = time.perf_counter()
    losses = [step(b) for b in batches[: args.check]]
    compile_s = time.perf_counter() - started
    for b in batches[args.check : args.check + args.warmup]:
        step(b)
    times = []
    timed = batches[args.check + args.warmup :]
    for b in timed:
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            step(b)
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            step(b)
            times.append((time.perf_counter() - t0) * 1e3)
    entry: dict[str, Any] = {"losses": losses, "compile_and_first_steps_s": round(compile_s, 2)}
    if times:
        entry["median_ms"] = statistics.median(times)
        entry["p10_ms"], entry["p90_ms"] = sorted(times)[len(times) // 10], sorted(times)[(9 * len(times)) // 10]
    if variant == "graphopt":
        from graphopt.torch_backend import torch_reports

        entry["rewrites"] = sorted({name for r in torch_reports() for name, s in r.rules.items() if s.applications})
    return entry


def run_model(name: str, args: argparse.Namespace, rank: int) -> dict[str, Any]:
    import torch
    from torch_compile import build_model

    model, inputs, description = build_model(name, args.tiny)
    model = model.train().to(args.device)
    _no_dropout(model)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    batches = _batches(inputs, args.check + args.warmup + args.iters, seed=1000 + rank, device=args.device)
    result: dict[str, Any] = {"model": name, "description": description, "variants": {}}
    for variant in args.variant_list:
        torch._dynamo.reset()
        try:
            result["variants"][variant] = train(model, variant, batches, args, dtype)
        except Exception as error:  # noqa: BLE001 - one variant failing must not stop the others
            result["variants"][variant] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}",
                                           "traceback": traceback.format_exc()[-2000:]}
    reference = result["variants"].get("eager", {}).get("losses")
    for entry in result["variants"].values():
        if reference and "losses" in entry:
            entry["max_rel_loss_diff"] = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(entry["losses"], reference))
    return result


def table(results: list[dict[str, Any]], variants: list[str]) -> str:
    lines = [f"{'model':<10}" + "".join(f"{v:>26}" for v in variants) + "   graphopt/inductor"]
    for r in results:
        cells = []
        for v in variants:
            e = r["variants"].get(v, {})
            cells.append("ERROR" if "error" in e else f"{e.get('median_ms', float('nan')):.2f} ms (Δloss {e.get('max_rel_loss_diff', 0):.1e})")
        g, i = r["variants"].get("graphopt", {}).get("median_ms"), r["variants"].get("inductor", {}).get("median_ms")
        ratio = f"{g / i:.3f}" if g and i else "-"
        lines.append(f"{r['model']:<10}" + "".join(f"{c:>26}" for c in cells) + f"   {ratio}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default=None, help="autocast type (default bf16 on CUDA, fp32 on CPU)")
    parser.add_argument("--wrap", choices=("none", "ddp", "fsdp2"), default="none")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--check", type=int, default=3, help="steps whose losses are compared with eager's")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    args.variant_list = [v for v in args.variants.split(",") if v]
    rank = 0
    if args.wrap != "none":
        import torch.distributed as dist

        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        rank = dist.get_rank()
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    results = [run_model(name, args, rank) for name in args.models.split(",") if name]
    if rank == 0:
        header = f"device: {gpu} x{int(os.environ.get('WORLD_SIZE', 1))} ({args.wrap}), torch {torch.__version__}, autocast {args.dtype}"
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({"environment": header, "results": results}, indent=1))
        for r in results:
            for v, e in r["variants"].items():
                if "error" in e:
                    print(f"{r['model']} {v}: {e['error']}")
            rewrites = r["variants"].get("graphopt", {}).get("rewrites")
            if rewrites is not None:
                print(f"{r['model']} graphopt rewrites: {', '.join(rewrites) or 'none'}")
        print(header)
        print(table(results, args.variant_list))
    if args.wrap != "none":
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
