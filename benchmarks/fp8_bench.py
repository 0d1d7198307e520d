"""FP8 GEMMs on the torch path (issue 18 item 2): bf16 against precision="fp8", same GPU, same run.

Three parts, each variant behind its own torch._dynamo.reset() and try (one failing does not
stop the others):

  decode    TinyLlama-1.1B-shaped LLaMA (benchmarks/llm_decode.py's model and static-cache greedy
            loop), bf16, batch 1: ms per decode step and tokens/s for
              inductor-ro       torch.compile(mode="reduce-overhead"): inductor with CUDA graphs (bf16)
              graphopt-ro       backend="graphopt", mode="reduce-overhead" (bf16)
              graphopt-ro-fp8   the same with options={"precision": "fp8"}
            and the fp8 variant's greedy tokens against inductor-ro's (steps equal before the first
            difference, and the share of equal tokens).
  prefill   one forward over a --prefill-tokens prompt (default 2048), batch 1, the same variants
            in default mode (no CUDA graphs: one launch per kernel is nothing at this size).
  gemm      per shape of the model's GEMMs (packed q|k|v, o, packed gate|up, down, lm head) at
            M = 1, 16, 2048: bf16 x @ W^T (torch.mm), torch._scaled_mm on operands quantized
            beforehand, and the activation quantize + _scaled_mm compiled by inductor (what
            the fp8 graph runs per GEMM); each timed inside a CUDA graph of --graph-calls calls.

The issue's goals: FP8 >= 1.15x bf16 in decode, >= 1.4x in the 2048-token prefill.

    python benchmarks/fp8_bench.py                       # all three parts (CUDA, compute capability >= 8.9)
    python benchmarks/fp8_bench.py --parts gemm          # one part
    python benchmarks/fp8_bench.py --tiny --device cpu   # a smoke test of the code paths (fp8 refused on CPU)

Output: a short table with the GPU's name; JSON at --out (a file or a folder) or under $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
VARIANTS = ("inductor-ro", "graphopt-ro", "graphopt-ro-fp8")
PARTS = ("decode", "prefill", "gemm")
#: TinyLlama-1.1B's GEMMs as graphopt runs them, (name, K, N): q|k|v and gate|up packed.
GEMM_SHAPES = (("qkv", 2048, 2560), ("o", 2048, 2048), ("gate_up", 2048, 11264), ("down", 5632, 2048), ("lm_head", 2048, 32000))
GEMM_ROWS = (1, 16, 2048)


def _forward(model: Any, variant: str, cuda_graphs: bool) -> tuple[Callable[..., Any], bool]:
    """The compiled forward of a variant, and whether it runs under inductor's CUDA graphs."""
    import torch
    from torch_compile import _ensure_backend_registered

    _ensure_backend_registered()
    mode = "reduce-overhead" if cuda_graphs else None
    if variant == "inductor-ro":
        return torch.compile(model.forward, mode=mode, fullgraph=True, dynamic=False), cuda_graphs
    options: dict[str, Any] = {"precision": "fp8"} if variant.endswith("fp8") else {}
    if mode:
        options["mode"] = mode
    return torch.compile(model.forward, backend="graphopt", options=options, fullgraph=True, dynamic=False), cuda_graphs


def _fp8_summary() -> dict[str, Any]:
    """What the fp8 pass did, from graphopt's reports: GEMMs converted, kept (and why), refusals."""
    from graphopt.torch_backend import torch_reports

    reports = torch_reports()
    decisions = [d for r in reports for d in r.decisions if d.kind == "precision_fp8"]
    return {"fp8_gemms": sum(d.chosen == "fp8" for d in decisions),
            "kept": sorted({f"{d.site}: {d.reason}" for d in decisions if d.chosen != "fp8"}),
            "fp8_warnings": sorted({w for r in reports for w in r.warnings if w.startswith("fp8")})}


def run_decode(model: Any, variant: str, args: argparse.Namespace, reference: Any) -> dict[str, Any]:
    import torch
    from llm_decode import _static_cache, generate

    from graphopt.torch_backend import clear_reports

    torch._dynamo.reset()
    clear_reports()
    torch.manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (1, args.prompt), device=args.device)
    cache = _static_cache(model, 1, args.prompt + args.new_tokens, args.device)
    forward, mark_step = _forward(model, variant, cuda_graphs=args.device.startswith("cuda"))
    t0 = time.perf_counter()
    runs = []
    for i in range(args.warmup + args.runs):
        cache.reset()
        result = generate(forward, model, ids, args.new_tokens, cache, args.device, mark_step)
        if i == 0:
            first_s = time.perf_counter() - t0
        if i >= args.warmup:
            runs.append(result)
    steps = [t for r in runs for t in r["step_ms"]]
    entry: dict[str, Any] = {"part": "decode", "variant": variant, "decode_ms": statistics.median(steps),
                             "tokens_per_s": 1e3 / statistics.median(steps), "first_generation_s": first_s,
                             "tokens": runs[0]["tokens"].tolist(), **_fp8_summary()}
    if reference is not None:
        got, want = runs[0]["tokens"], torch.tensor(reference)
        differ = (got != want).any(0).nonzero()
        entry["equal_steps"] = int(differ[0]) if len(differ) else got.shape[1]
        entry["token_agreement"] = float((got == want).float().mean())
    return entry


def run_prefill(model: Any, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from llm_decode import Timer, _cache_kwarg, _static_cache, _sync

    from graphopt.torch_backend import clear_reports

    torch._dynamo.reset()
    clear_reports()
    torch.manual_seed(2)
    n = args.prefill_tokens
    ids = torch.randint(0, model.config.vocab_size, (1, n), device=args.device)
    cache = _static_cache(model, 1, n + 8, args.device)
    forward, _ = _forward(model, variant, cuda_graphs=False)
    positions = torch.arange(n, device=args.device)
    timer = Timer(args.device)
    t0 = time.perf_counter()
    with torch.no_grad():
        for i in range(args.warmup + args.runs * 3):
            cache.reset()
            if i < args.warmup:
                forward(input_ids=ids, cache_position=positions, use_cache=True, **{_cache_kwarg(model): cache})
                _sync(args.device)
                continue
            with timer:
                forward(input_ids=ids, cache_position=positions, use_cache=True, **{_cache_kwarg(model): cache})
    _sync(args.device)
    return {"part": "prefill", "variant": variant, "tokens": n, "prefill_ms": statistics.median(timer.times_ms()),
            "first_call_s": time.perf_counter() - t0, **_fp8_summary()}


def _graph_time_ms(fn: Callable[[], Any], calls: int, device: str) -> float:
    """ms per call: `calls` calls captured in one CUDA graph, replayed (median of 10); a plain loop on CPU."""
    import torch
    from llm_decode import Timer, _sync

    for _ in range(3):
        fn()
    _sync(device)
    timer = Timer(device)
    if device.startswith("cuda"):
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        for _ in range(10):
            with timer:
                graph.replay()
    else:
        for _ in range(3):
            with timer:
                for _ in range(calls):
                    fn()
    _sync(device)
    return statistics.median(timer.times_ms()) / calls


def run_gemm(name: str, m: int, k: int, n: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from graphopt.passes.fx_fp8 import FP8, FP8_MAX, quantize_rows

    device = args.device
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5
    w_fp8, w_scale = quantize_rows(w)
    w_col, w_scale_row = w_fp8.t(), w_scale.t().contiguous()  # column-major [K, N], scales (1, N)
    x_fp8, x_scale = quantize_rows(x)
    fast = device.startswith("cuda")

    def quantized_gemm(a: torch.Tensor) -> torch.Tensor:  # what the fp8 graph runs per GEMM (fx_fp8._rewrite)
        a32 = a.float()
        scale = a32.abs().amax(-1, keepdim=True).clamp_min(1e-12) / FP8_MAX
        a8 = (a32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        return torch._scaled_mm(a8, w_col, scale, w_scale_row, out_dtype=torch.bfloat16, use_fast_accum=fast)

    compiled = torch.compile(quantized_gemm, dynamic=False)
    entry: dict[str, Any] = {"part": "gemm", "gemm": name, "m": m, "k": k, "n": n}
    timings: dict[str, Callable[[], Any]] = {
        "bf16_ms": lambda: torch.mm(x, w.t()),
        "scaled_mm_ms": lambda: torch._scaled_mm(x_fp8, w_col, x_scale, w_scale_row, out_dtype=torch.bfloat16, use_fast_accum=fast),
        "quantize_scaled_mm_ms": lambda: compiled(x),
    }
    calls = max(2, args.graph_calls if m < 2048 else args.graph_calls // 10)
    for key, fn in timings.items():
        try:
            entry[key] = _graph_time_ms(fn, calls, device)
        except Exception as error:  # one form failing must not lose the others
            entry[key.replace("_ms", "_error")] = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"[:300]
    if "bf16_ms" in entry and "quantize_scaled_mm_ms" in entry:
        entry["speedup"] = entry["bf16_ms"] / entry["quantize_scaled_mm_ms"]
    return entry


def table(results: list[dict[str, Any]], gpu: str) -> str:
    lines = [f"GPU: {gpu}"]
    decode = [e for e in results if e.get("part") == "decode"]
    if decode:
        lines.append(f"{'decode (batch 1)':22s} {'ms/token':>9s} {'tok/s':>8s} {'fp8 GEMMs':>9s}  tokens vs inductor-ro")
        for e in decode:
            if "decode_ms" not in e:
                lines.append(f"  {e['variant']:20s} {e.get('status', '')}")
                continue
            agree = "reference" if "equal_steps" not in e else f"{e['equal_steps']} steps equal, {100 * e['token_agreement']:.0f}% of tokens"
            lines.append(f"  {e['variant']:20s} {e['decode_ms']:9.3f} {e['tokens_per_s']:8.1f} {e['fp8_gemms']:9d}  {agree}")
    prefill = [e for e in results if e.get("part") == "prefill"]
    if prefill:
        lines.append(f"{'prefill':22s} {'ms':>9s}")
        for e in prefill:
            lines.append(f"  {e['variant']:20s} " + (f"{e['prefill_ms']:9.2f} ({e['tokens']} tokens)" if "prefill_ms" in e else e.get("status", "")))
    gemms = [e for e in results if e.get("part") == "gemm"]
    if gemms:
        lines.append(f"{'gemm':10s} {'M':>5s} {'K':>5s} {'N':>6s} {'bf16 ms':>9s} {'scaled_mm':>10s} {'quant+smm':>10s} {'speedup':>8s}")
        for e in gemms:
            def cell(key: str, e: dict[str, Any] = e) -> str:
                return f"{e[key]:.4f}" if key in e else "error"

            speedup = f"{e['speedup']:.2f}x" if "speedup" in e else ""
            lines.append(f"{e['gemm']:10s} {e['m']:5d} {e['k']:5d} {e['n']:6d} {cell('bf16_ms'):>9s} {cell('scaled_mm_ms'):>10s} "
                         f"{cell('quantize_scaled_mm_ms'):>10s} {speedup:>8s}")
    for e in results:
        if e.get("kept"):
            lines.append(f"{e['part']} {e['variant']}: kept in bf16: {'; '.join(e['kept'])}")
        for warning in e.get("fp8_warnings", []):
            lines.append(f"{e['part']} {e['variant']}: {warning}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated: {', '.join(PARTS)}")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--prompt", type=int, default=128, help="decode: prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=128, help="decode: greedy tokens")
    parser.add_argument("--prefill-tokens", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--graph-calls", type=int, default=50, help="gemm: calls per CUDA graph (a tenth at M=2048)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--tiny", action="store_true", help="a tiny LlamaConfig and small GEMMs (a smoke test)")
    parser.add_argument("--budget-s", type=float, default=480.0, help="start no part or variant after this many seconds")
    parser.add_argument("--out", default=None, help="JSON file or folder (default: $OUT when set)")
    args = parser.parse_args(argv)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import torch
    from llm_decode import build_model, environment

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    parts = [p for p in args.parts.split(",") if p]
    variants = [v for v in args.variants.split(",") if v]
    if set(parts) - set(PARTS) or set(variants) - set(VARIANTS):
        parser.error(f"parts: {', '.join(PARTS)}; variants: {', '.join(VARIANTS)}")
    if args.tiny:
        args.prompt, args.new_tokens, args.prefill_tokens = min(args.prompt, 8), min(args.new_tokens, 8), min(args.prefill_tokens, 64)
    out = args.out or os.environ.get("OUT")
    env = environment(args.device)
    env["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability())) if args.device.startswith("cuda") else None
    print(f"GPU: {env['gpu']} (compute capability {env['compute_capability']})", flush=True)
    results: list[dict[str, Any]] = []
    data = {"benchmark": "fp8_bench", "environment": env, "settings": {k: v for k, v in vars(args).items() if k != "out"}, "results": results}
    started = time.perf_counter()

    def attempt(label: dict[str, Any], fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        if time.perf_counter() - started > args.budget_s:
            entry = {**label, "status": f"skipped: past the {args.budget_s:.0f} s budget"}
        else:
            try:
                entry = {**fn(), "status": "ok"}
            except Exception as error:  # one variant failing must not stop the others
                traceback.print_exc()
                entry = {**label, "status": f"error: {type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"[:300]}
        results.append(entry)
        print({k: v for k, v in entry.items() if k not in ("tokens", "kept")}, flush=True)
        if out:
            write_json(data, out)
        return entry

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    model = build_model(args.tiny, args.device, dtype) if {"decode", "prefill"} & set(parts) else None
    if "decode" in parts:
        reference = None
        for variant in variants:
            entry = attempt({"part": "decode", "variant": variant}, lambda v=variant, r=reference: run_decode(model, v, args, r))
            if variant == "inductor-ro" and "tokens" in entry:
                reference = entry["tokens"]
    if "prefill" in parts:
        for variant in variants:
            attempt({"part": "prefill", "variant": variant}, lambda v=variant: run_prefill(model, v, args))
    if "gemm" in parts:
        del model
        shapes = (("small", 64, 128),) if args.tiny else GEMM_SHAPES
        for name, k, n in shapes:
            for m in GEMM_ROWS if not args.tiny else (1, 16):
                attempt({"part": "gemm", "gemm": name, "m": m, "k": k, "n": n}, lambda a=(name, m, k, n): run_gemm(*a, args))
    data["total_s"] = time.perf_counter() - started
    if out:
        print(f"wrote {write_json(data, out)}")
    print()
    print(table(results, env["gpu"]))
    failed = [f"{e['part']}/{e.get('variant', e.get('gemm'))}" for e in results if str(e.get("status", "")).startswith("error")]
    if failed:
        print(f"not ok: {', '.join(failed)}")
    return 1 if failed else 0


def write_json(data: dict[str, Any], out: str) -> Path:
    folder = Path(out).is_dir() or out.endswith(("/", os.sep))
    path = Path(out) / "fp8_bench.json" if folder else Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.tmp")
    staged.write_text(json.dumps(data, indent=2, default=str))
    os.replace(staged, path)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
