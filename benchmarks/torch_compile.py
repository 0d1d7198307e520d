"""torch.compile(backend="graphopt") against eager and inductor, side by side (issue 4).

For each model every *variant* below runs the same inputs in the same process, one after
another (each behind its own torch._dynamo.reset()), and is timed:

  eager                   the model as it is
  inductor                torch.compile(model)                         (backend="inductor")
  inductor-ro             torch.compile(model, mode="reduce-overhead")   (CUDA graphs)
  graphopt                backend="graphopt", options={"inductor": False}: the rewritten ATen
                          graph with torch.ops.graphopt kernels, run as it is
  graphopt-cg             the same, options={"inductor": False, "mode": "reduce-overhead"}:
                          replayed as CUDA graphs (CUDA only)
  graphopt+inductor       backend="graphopt" (default options): leftovers to inductor, custom
                          kernels only where measured faster than inductor (kernels="auto")
  graphopt+inductor-all   the same with every custom kernel (kernels="all")
  graphopt+inductor-ro    graphopt+inductor with mode="reduce-overhead" (CUDA graphs)
  graphopt+inductor-all-ro  graphopt+inductor-all with mode="reduce-overhead"
  inductor-ma             torch.compile(model, mode="max-autotune")   (autotuned GEMMs, CUDA graphs)
  graphopt+inductor-ma    graphopt+inductor with mode="max-autotune"

Models (random weights from configs, no hub): BERT-base b8 s128, GPT-2 (LM head) b1 s512,
ViT-base b8 224x224, ResNet-50 b32 224x224 (torchvision.models.resnet50 when importable, else
the ResNet-50-like CNN of tests/models.py). fp16 on CUDA by default.

    python benchmarks/torch_compile.py --out benchmarks/results/            # CUDA, fp16, all models
    python benchmarks/torch_compile.py --models bert,gpt2 --variants eager,inductor,graphopt+inductor
    python benchmarks/torch_compile.py --tiny --device cpu --out /tmp/tc    # CPU dry run (minutes)

Timing: --warmup calls, then --iters calls each timed with CUDA events (time.perf_counter on
CPU); median, p10 and p90 in ms. "compile s" is the first call's wall time (tracing, graphopt,
inductor and the first run). Numerics: each variant's first output against eager's on the same
inputs, max |diff| / max |ref| (flagged when above --tolerance). A variant that raises is
recorded with its error and the run goes on. graphopt variants also record their rewrites
(graphopt.torch_reports()).

Output: JSON (--out: a file, or a folder for torch_compile-<models>[-tiny].json) and a table
printed last.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_profile import kernel_profile  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("eager", "inductor", "inductor-ro", "graphopt", "graphopt-cg", "graphopt+inductor", "graphopt+inductor-tune", "graphopt+inductor-all",
            "graphopt+inductor-ro", "graphopt+inductor-all-ro", "inductor-ma", "graphopt+inductor-ma")
MODELS = ("bert", "gpt2", "vit", "resnet50", "llama", "t5", "convnext")
CUDA_ONLY = {"inductor-ro", "graphopt-cg", "graphopt+inductor-ro", "graphopt+inductor-all-ro", "inductor-ma", "graphopt+inductor-ma"}


# --------------------------------------------------------------------------- models


def build_model(name: str, tiny: bool) -> tuple[Any, dict[str, Any], str]:
    """(module in eval mode, keyword inputs on CPU in fp32/int64, description)."""
    import torch

    torch.manual_seed(0)
    if name in ("bert", "gpt2", "vit"):
        import transformers

        if name == "bert":
            size = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=1000) if tiny else {}
            model = transformers.BertModel(transformers.BertConfig(**size)).eval()
            batch, seq = (2, 16) if tiny else (8, 128)
            ids = torch.randint(0, model.config.vocab_size, (batch, seq))
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
            return model, inputs, f"BertModel layers={model.config.num_hidden_layers} hidden={model.config.hidden_size} b{batch} s{seq}"
        if name == "gpt2":
            size = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128) if tiny else {}
            config = transformers.GPT2Config(use_cache=False, bos_token_id=0, eos_token_id=0, **size)
            model = transformers.GPT2LMHeadModel(config).eval()
            batch, seq = (1, 32) if tiny else (1, 512)
            ids = torch.randint(0, config.vocab_size, (batch, seq))
            return model, {"input_ids": ids}, f"GPT2LMHeadModel layers={config.n_layer} hidden={config.n_embd} b{batch} s{seq}"
        size = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, image_size=32, patch_size=8) if tiny else {}
        config = transformers.ViTConfig(**size)
        model = transformers.ViTModel(config).eval()
        batch = 2 if tiny else 8
        pixels = torch.randn(batch, 3, config.image_size, config.image_size)
        return model, {"pixel_values": pixels}, f"ViTModel layers={config.num_hidden_layers} hidden={config.hidden_size} b{batch} {config.image_size}px"
    if name == "llama":  # issue 15's LLaMA-style decoder: 8 layers, GQA, prefill b1 s512
        import transformers

        size = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=1000) \
            if tiny else dict(num_hidden_layers=8, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8, intermediate_size=5632,
                              vocab_size=32000)
        model = transformers.LlamaModel(transformers.LlamaConfig(use_cache=False, **size)).eval()
        batch, seq = (1, 16) if tiny else (1, 512)
        ids = torch.randint(0, model.config.vocab_size, (batch, seq))
        return model, {"input_ids": ids}, f"LlamaModel layers={model.config.num_hidden_layers} hidden={model.config.hidden_size} GQA b{batch} s{seq}"
    if name == "t5":  # T5-base encoder b8 s128
        import transformers

        size = dict(num_layers=2, d_model=64, num_heads=4, d_kv=16, d_ff=128, vocab_size=1000) if tiny else \
            dict(num_layers=12, d_model=768, num_heads=12, d_kv=64, d_ff=3072)
        model = transformers.T5EncoderModel(transformers.T5Config(use_cache=False, **size)).eval()
        batch, seq = (2, 16) if tiny else (8, 128)
        ids = torch.randint(0, model.config.vocab_size, (batch, seq))
        return model, {"input_ids": ids}, f"T5EncoderModel layers={model.config.num_layers} d_model={model.config.d_model} b{batch} s{seq}"
    if name == "convnext":  # ConvNeXt-tiny b32 224px (transformers' ConvNextModel: depthwise 7x7, channels-last LayerNorm, MLP)
        import transformers

        size = dict(depths=[1, 1, 1, 1], hidden_sizes=[8, 16, 32, 64], image_size=32) if tiny else {}
        model = transformers.ConvNextModel(transformers.ConvNextConfig(**size)).eval()
        batch, image = (2, 32) if tiny else (32, 224)
        return model, {"pixel_values": torch.randn(batch, 3, image, image)}, f"ConvNextModel depths={model.config.depths} b{batch} {image}px"
    if name == "resnet50":
        batch, image = (2, 32) if tiny else (32, 224)
        try:
            if tiny:
                raise ImportError("tiny: the small local ResNet")
            import torchvision

            model, source = torchvision.models.resnet50(weights=None).eval(), "torchvision.models.resnet50"
        except ImportError:
            sys.path.insert(0, str(REPO))
            from tests.models import _randomize_bn, _ResNet

            blocks, width = ((1, 1), 8) if tiny else ((3, 4, 6, 3), 64)
            model, source = _randomize_bn(_ResNet(blocks, width, 1000)).eval(), f"tests/models.py ResNet blocks={list(blocks)} width={width}"
        return model, {"x": torch.randn(batch, 3, image, image)}, f"{source} b{batch} {image}px"
    raise SystemExit(f"unknown model {name!r} (known: {', '.join(MODELS)})")


def positional(model: Any, inputs: dict[str, Any]) -> Callable[[], Any]:
    """A call of the model on its inputs that returns its first output tensor."""

    def first(out: Any) -> Any:
        if hasattr(out, "to_tuple"):
            out = out.to_tuple()
        return out[0] if isinstance(out, (tuple, list)) else out

    if list(inputs) == ["x"]:
        return lambda: first(model(inputs["x"]))
    return lambda: first(model(**inputs))


# --------------------------------------------------------------------------- variants


def compile_variant(model: Any, variant: str) -> Any:
    import torch

    if variant == "eager":
        return model
    if variant == "inductor":
        return torch.compile(model)
    if variant == "inductor-ro":
        return torch.compile(model, mode="reduce-overhead")
    if variant == "inductor-ma":
        return torch.compile(model, mode="max-autotune")
    options: dict[str, Any] = {
        "graphopt": {"inductor": False},
        "graphopt-cg": {"inductor": False, "mode": "reduce-overhead"},
        "graphopt+inductor": {},
        "graphopt+inductor-tune": {"tune": True},
        "graphopt+inductor-all": {"kernels": "all"},
        "graphopt+inductor-ro": {"mode": "reduce-overhead"},
        "graphopt+inductor-ma": {"mode": "max-autotune"},
        "graphopt+inductor-all-ro": {"kernels": "all", "mode": "reduce-overhead"},
    }[variant]
    _ensure_backend_registered()
    return torch.compile(model, backend="graphopt", options=options)


def _ensure_backend_registered() -> None:
    """An installed graphopt is found through its entry point; a checkout on PYTHONPATH
    (as on the GPU machine) is registered here, once, under the same name."""
    import torch._dynamo

    if "graphopt" not in torch._dynamo.list_backends(exclude_tags=()):
        from graphopt.torch_backend import graphopt_backend

        torch._dynamo.register_backend(name="graphopt")(graphopt_backend)


def sample_calls(call: Callable[[], Any], iters: int, cuda: bool) -> list[float]:
    """`iters` calls of `call`, each timed (ms): CUDA events around it on CUDA, time.perf_counter on CPU."""
    import torch

    times: list[float] = []
    if cuda:
        torch.cuda.synchronize()
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def time_calls(call: Callable[[], Any], warmup: int, iters: int, cuda: bool) -> dict[str, float]:
    for _ in range(warmup):
        call()
    times = sorted(sample_calls(call, iters, cuda))
    return {"median_ms": statistics.median(times), "p10_ms": times[len(times) // 10], "p90_ms": times[(9 * len(times)) // 10],
            "iters": iters}


def graphopt_summary() -> dict[str, Any]:
    import graphopt

    reports = graphopt.torch_reports()
    rewrites: dict[str, int] = {}
    for report in reports:
        for name, stats in report.rules.items():
            if stats.applications:
                rewrites[name] = rewrites.get(name, 0) + stats.applications
    times = {key: round(sum(r.times_s.get(key, 0.0) for r in reports), 3) for key in ("trace", "rules", "optimize", "leftovers")}
    return {"graphs": len(reports), "rewrites": rewrites, "targets": sorted({r.target for r in reports}), "times_s": times,
            "warnings": sorted({w for r in reports for w in r.warnings})}


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from graphopt.torch_backend import clear_reports

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    model, inputs, description = build_model(name, args.tiny)
    model = model.to(device=device, dtype=dtype)
    inputs = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in inputs.items()}
    result: dict[str, Any] = {"model": name, "description": description, "dtype": args.dtype, "variants": {}}
    with torch.no_grad():
        reference = positional(model, inputs)().float().clone()
        for variant in args.variants:
            entry: dict[str, Any] = {}
            result["variants"][variant] = entry
            if variant in CUDA_ONLY and not cuda:
                entry["status"] = "skipped: CUDA only"
                continue
            torch._dynamo.reset()
            clear_reports()
            try:
                compiled = compile_variant(model, variant)
                call = positional(compiled, inputs)
                t0 = time.perf_counter()
                first = call()
                if cuda:
                    torch.cuda.synchronize()
                entry["compile_s"] = round(time.perf_counter() - t0, 3)
                out = first.float().clone()
                diff = (out - reference).abs().max().item()
                scale = reference.abs().max().item() or 1.0
                entry["max_abs_diff"] = diff
                entry["max_rel_diff"] = diff / scale
                entry["numerics_ok"] = bool(diff / scale <= args.tolerance)
                entry.update(time_calls(call, args.warmup, args.iters, cuda))
                if args.kernels and cuda:
                    try:
                        entry["kernels"] = kernel_profile(call)
                    except Exception as error:  # the profile is extra information, never fatal
                        entry["kernels"] = {"error": f"{type(error).__name__}: {error}"[:300]}
                if variant.startswith("graphopt"):
                    entry["graphopt"] = graphopt_summary()
                entry["status"] = "ok" if entry["numerics_ok"] else "numerics differ"
            except Exception as error:  # one variant failing must not stop the others
                entry["status"] = f"error: {type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"[:300]
                entry["traceback"] = traceback.format_exc()[-4000:]
            print(f"  {name:9s} {variant:22s} {_cell(entry)}", flush=True)
    return result


# --------------------------------------------------------------------------- output


def _cell(entry: dict[str, Any]) -> str:
    if "median_ms" not in entry:
        return entry.get("status", "")
    return f"{entry['median_ms']:9.3f} ms  compile {entry['compile_s']:7.1f} s  rel diff {entry['max_rel_diff']:.1e}  {entry['status']}"


def table(results: list[dict[str, Any]], variants: list[str]) -> str:
    lines = [f"{'model':10s} {'variant':22s} {'median ms':>10s} {'p10':>8s} {'p90':>8s} {'vs eager':>9s} {'vs inductor':>12s} "
             f"{'compile s':>10s} {'rel diff':>9s}  status"]
    for result in results:
        entries = result["variants"]
        eager = entries.get("eager", {}).get("median_ms")
        inductor = entries.get("inductor", {}).get("median_ms")
        for variant in variants:
            e = entries.get(variant, {})
            if "median_ms" not in e:
                lines.append(f"{result['model']:10s} {variant:22s} {'':>10s} {'':>8s} {'':>8s} {'':>9s} {'':>12s} {'':>10s} {'':>9s}  {e.get('status', '')}")
                continue
            vs_eager = f"{eager / e['median_ms']:.2f}x" if eager else ""
            vs_inductor = f"{inductor / e['median_ms']:.2f}x" if inductor else ""
            lines.append(f"{result['model']:10s} {variant:22s} {e['median_ms']:10.3f} {e['p10_ms']:8.3f} {e['p90_ms']:8.3f} {vs_eager:>9s} "
                         f"{vs_inductor:>12s} {e['compile_s']:10.1f} {e['max_rel_diff']:9.1e}  {e['status']}")
    lines.append("vs eager / vs inductor: speed-up (higher is faster); rel diff: max |out - eager| / max |eager|.")
    return "\n".join(lines)


def environment(device: str) -> dict[str, Any]:
    import torch
    import transformers

    env = {"date": _dt.datetime.now().isoformat(timespec="seconds"), "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "platform": platform.platform(), "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    return env


def write_json(data: dict[str, Any], out: str, models: list[str], tiny: bool) -> Path:
    """Atomically (temporary file, then rename); `out` is a file, or a folder (existing, or ending in /)."""
    folder = Path(out).is_dir() or out.endswith(("/", os.sep))
    path = Path(out) / f"torch_compile-{'-'.join(models)}{'-tiny' if tiny else ''}.json" if folder else Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staged = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2)
    os.replace(staged, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default=None, help="default fp16 on CUDA, fp32 on CPU")
    parser.add_argument("--tiny", action="store_true", help="tiny configs and inputs (a dry run)")
    parser.add_argument("--warmup", type=int, default=None, help="default 10 (3 with --tiny)")
    parser.add_argument("--iters", type=int, default=None, help="default 50 (10 with --tiny)")
    parser.add_argument("--tolerance", type=float, default=None, help="max rel diff to eager (default 2e-2 fp16/bf16, 1e-4 fp32)")
    parser.add_argument("--out", default=None, help="JSON file, or a folder (existing, or ending in /)")
    parser.add_argument("--kernels", action="store_true", help="also record each variant's GPU kernels (torch.profiler/CUPTI): "
                        "count, summed time and the top kernels per call, in the JSON")
    args = parser.parse_args(argv)

    if str(REPO) not in sys.path:  # run as a script: graphopt from this checkout
        sys.path.insert(0, str(REPO))
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.dtype = args.dtype or ("fp16" if args.device.startswith("cuda") else "fp32")
    args.warmup = args.warmup if args.warmup is not None else (3 if args.tiny else 10)
    args.iters = args.iters if args.iters is not None else (10 if args.tiny else 50)
    args.tolerance = args.tolerance if args.tolerance is not None else (1e-4 if args.dtype == "fp32" else 2e-2)
    models = [m for m in args.models.split(",") if m]
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variants if v not in VARIANTS] + [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model or variant: {', '.join(unknown)}")

    results = []
    for name in models:
        print(f"{name}:", flush=True)
        results.append(run_model(name, args))
    data = {"benchmark": "torch_compile", "environment": environment(args.device), "settings": {
        "device": args.device, "dtype": args.dtype, "tiny": args.tiny, "warmup": args.warmup, "iters": args.iters,
        "tolerance": args.tolerance, "variants": args.variants, "kernels": args.kernels}, "results": results}
    if args.out is not None:
        print(f"wrote {write_json(data, args.out, models, args.tiny)}")
    print()
    print(table(results, args.variants))
    failed = [f"{r['model']}/{v}" for r in results for v, e in r["variants"].items() if not str(e.get("status", "")).startswith(("ok", "skipped"))]
    if failed:
        print(f"not ok: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
