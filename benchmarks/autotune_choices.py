"""graphopt's GEMM kernel against inductor's choices, per call site, in inductor's max-autotune
(graphopt/inductor_choices.py, issue 15 item 1). A GPU check for the lead (under 4 minutes on an H100):

    python3 benchmarks/autotune_choices.py --out $OUT/autotune_choices.json   # or: bash benchmarks/gpu_session.sh autotune-choices
    python3 benchmarks/autotune_choices.py --weights int4 --tokens 16         # or: ... autotune-choices wq (graphopt::wq_linear)

Two MLP blocks (Linear + ReLU, Linear + tanh-GELU: the sites graphopt.GemmActivation covers) at a
decode-like and a prefill-like number of tokens, fp16, compiled with backend="graphopt" and
mode="max-autotune-no-cudagraphs". Prints per site which choice inductor's autotuner kept, graphopt's
time against inductor's best choice (from the report's "kernel" decisions), the outputs against eager,
and the whole block's time against inductor alone in the same mode. Writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_compile import _ensure_backend_registered  # noqa: E402

import graphopt
import graphopt.torch_backend

MODE = "max-autotune-no-cudagraphs"


class Block(nn.Module):
    """up + ReLU, then down + tanh-GELU: two GemmActivation sites of different shapes."""

    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(hidden, inner), nn.Linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.down(torch.relu(self.up(x))), approximate="tanh")


def _time_ms(fn: Any, x: torch.Tensor, runs: int = 50, warmup: int = 10) -> float:
    for _ in range(warmup):
        fn(x)
    if not x.is_cuda:  # --device cpu: a smoke run of this script
        t0 = time.perf_counter()
        for _ in range(runs):
            fn(x)
        return (time.perf_counter() - t0) * 1e3 / runs
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def run_case(tokens: int, hidden: int, inner: int, dtype: torch.dtype, device: str = "cuda", weights: str | None = None) -> dict[str, Any]:
    torch.manual_seed(0)
    torch._dynamo.reset()
    graphopt.torch_backend.clear_reports()
    model = Block(hidden, inner).to(device, dtype).eval()
    x = torch.randn(tokens, hidden, device=device, dtype=dtype)
    from torch._inductor.utils import fresh_cache

    started = time.perf_counter()
    # A fresh cache: an FX-graph cache hit skips inductor's lowering, and with it the per-site decisions.
    with fresh_cache(), torch.no_grad():
        options: dict[str, Any] = {"mode": MODE, "autotune_kernels": True}
        if weights is not None:
            options["weights"] = weights
        _ensure_backend_registered()  # a checkout on PYTHONPATH (the GPU machine) has no entry point
        ours = torch.compile(model, backend="graphopt", options=options)
        out = ours(x)
        compile_s = time.perf_counter() - started
        expected = model(x)
        error = float((out.float() - expected.float()).abs().max())
        report = graphopt.last_report()
        sites = [d for d in (report.decisions if report else []) if d.kind == "kernel"]
        theirs = torch.compile(model, backend="inductor", mode=MODE)
        theirs(x)
        ms_graphopt, ms_inductor = _time_ms(ours, x), _time_ms(theirs, x)
    rows = []
    for d in sites:
        times = {a.candidate: a.measured_ms for a in d.alternatives}
        g = times.pop("graphopt::linear_act", times.pop("graphopt::wq_linear", None))
        best = min(((k, v) for k, v in times.items() if v is not None), key=lambda kv: kv[1], default=(None, None))
        rows.append({"site": d.site, "chosen": d.chosen, "basis": d.basis, "graphopt_ms": g, "inductor_best": best[0],
                     "inductor_best_ms": best[1], "graphopt_speedup": (best[1] / g) if g and best[1] else None, "reason": d.reason})
    return {"tokens": tokens, "weights": weights, "hidden": hidden, "inner": inner, "dtype": str(dtype).removeprefix("torch."), "compile_s": round(compile_s, 1),
            "max_abs_error": error, "block_ms_graphopt": ms_graphopt, "block_ms_inductor": ms_inductor, "sites": rows,
            "warnings": list(report.warnings) if report else []}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="JSON results file")
    parser.add_argument("--tokens", default="16,2048", help="comma-separated numbers of tokens (rows of the GEMMs)")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--inner", type=int, default=4096)
    parser.add_argument("--weights", choices=("int8", "int4"), default=None,
                        help="weight-only quantization: the sites are graphopt::wq_linear's (where fx_weight_quant's timing kept it) "
                             "against inductor's dequantize + GEMM; the block's time is then against unquantized inductor")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a smoke run of the script (fp32, inductor's ATen GEMMs only); its times mean nothing")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: this check needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        tokens = [int(t) for t in args.tokens.split(",") if t]
    except ValueError:
        print(f"error: --tokens takes comma-separated integers, not {args.tokens!r}", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    print(f"{gpu}, torch {torch.__version__}, mode {MODE}")
    if args.device == "cuda":
        results = [run_case(t, args.hidden, args.inner, torch.float16, weights=args.weights) for t in tokens]
    else:
        from torch._inductor import config

        with config.patch(max_autotune_gemm_backends="ATEN"):
            results = [run_case(t, args.hidden, args.inner, torch.float32, "cpu", args.weights) for t in tokens]
    print(f"\n{'tokens':>6}  {'site':44s} {'kept':9s} {'graphopt ms':>11s} {'inductor best':>26s} {'graphopt x':>10s}")
    for r in results:
        for s in r["sites"]:
            best = f"{s['inductor_best'] or '-'}"[:16] + (f" {s['inductor_best_ms']:.4f}" if s["inductor_best_ms"] else "")
            ratio = f"{s['graphopt_speedup']:.2f}" if s["graphopt_speedup"] else "-"
            g = f"{s['graphopt_ms']:.4f}" if s["graphopt_ms"] else "-"
            print(f"{r['tokens']:>6}  {s['site'][:44]:44s} {s['chosen']:9s} {g:>11s} {best:>26s} {ratio:>10s}")
        print(f"{r['tokens']:>6}  block: graphopt {r['block_ms_graphopt']:.4f} ms, inductor {r['block_ms_inductor']:.4f} ms "
              f"({r['block_ms_inductor'] / r['block_ms_graphopt']:.2f}x), max |error| {r['max_abs_error']:.2e}, compile {r['compile_s']} s"
              + (f"; warnings: {r['warnings']}" if r["warnings"] else ""))
        if not r["sites"]:
            print(f"{r['tokens']:>6}  no site was autotuned: see the warnings")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "gpu": gpu,
                                        "torch": torch.__version__, "weights": args.weights, "python": platform.python_version(), "mode": MODE,
                                        "command": " ".join(sys.argv), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
