"""graphopt's GEMM kernels against inductor's own code, per call site, in inductor's max-autotune
(graphopt/inductor_sites.py, graphopt/inductor_choices.py; issue 15 item 1). A GPU check for the lead
(under 4 minutes on an H100):

    python3 benchmarks/autotune_choices.py --out $OUT/autotune_choices.json   # or: bash benchmarks/gpu_session.sh autotune-choices
    python3 benchmarks/autotune_choices.py --weights int4 --tokens 16         # or: ... autotune-choices wq (graphopt::wq_linear)

Two MLP blocks (Linear + ReLU, Linear + tanh-GELU: the sites graphopt.GemmActivation covers) at a
decode-like and a prefill-like number of tokens, fp16, compiled by inductor alone and by backend="graphopt"
with its sites (options autotune_kernels), mode="max-autotune-no-cudagraphs", each compile in a fresh cache
(no FX-graph cache: both compiles are real; their times are printed). Prints per site which side won and
both times (the report's "kernel" decisions), the whole block's time under each compiler, whether
graphopt's generated code is inductor's byte for byte (it must be where inductor won every site), and the
outputs against eager. Writes the rows as JSON.
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
import graphopt.inductor_sites
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


def _first_run_code(fn: Any, x: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The first call's output and the code inductor generated for the model (its last module: a site's own compile comes first)."""
    from torch._inductor.utils import run_and_get_code

    out, codes = run_and_get_code(fn, x)
    return out, codes[-1] if codes else ""


def _comparable(code: str) -> str:
    """Generated code less its AOT id line (a counter of the process's compiles, a site's own included)."""
    return "\n".join(line for line in code.splitlines() if not line.startswith("# AOT ID:"))


def _warm_up(device: str) -> None:
    """One small compile first, so that neither compiler's time counts the compile workers' start."""
    torch._dynamo.reset()
    torch.compile(lambda t: torch.relu(t) * 2)(torch.randn(64, device=device))


def _kernel_launches(code: str) -> int:
    """Kernel launches and extern calls in one generated module's call (a rough count, for the table)."""
    return sum(line.count(".run(") + line.count("extern_kernels.") + line.count("torch.ops.") for line in code.splitlines()
               if not line.lstrip().startswith(("#", "from ", "import ")))


def run_case(tokens: int, hidden: int, inner: int, dtype: torch.dtype, device: str = "cuda", weights: str | None = None) -> dict[str, Any]:
    from torch._inductor import config
    from torch._inductor.utils import fresh_cache

    torch.manual_seed(0)
    model = Block(hidden, inner).to(device, dtype).eval()
    x = torch.randn(tokens, hidden, device=device, dtype=dtype)
    _ensure_backend_registered()  # a checkout on PYTHONPATH (the GPU machine) has no entry point
    options: dict[str, Any] = {"mode": MODE, "autotune_kernels": True}
    if weights is not None:
        options["weights"] = weights
    # Each compile in a fresh cache and without the FX-graph cache: both autotune from scratch (their compile times
    # compare), and graphopt's per-site decisions are made in this run.
    compile_s: dict[str, float] = {}
    with torch.no_grad(), config.patch(fx_graph_cache=False):
        expected = model(x)
        with fresh_cache():
            torch._dynamo.reset()
            started = time.perf_counter()
            theirs = torch.compile(model, backend="inductor", mode=MODE)
            theirs(x)
            compile_s["inductor"] = time.perf_counter() - started
            ms_inductor = _time_ms(theirs, x)  # now: the dynamo.reset below ends this compiled function's cache
        with fresh_cache():
            torch._dynamo.reset()
            graphopt.torch_backend.clear_reports()
            graphopt.inductor_sites.clear_site_timings()
            started = time.perf_counter()
            ours = torch.compile(model, backend="graphopt", options=options)
            out, code_graphopt = _first_run_code(ours, x)
            compile_s["graphopt"] = time.perf_counter() - started
            ms_graphopt = _time_ms(ours, x)
            report = graphopt.last_report()
            # inductor alone again, on this cache's autotune results (graphopt's sites autotuned the same GEMMs): its code
            # is what graphopt's must equal where inductor won every site (autotune noise between caches is no difference)
            torch._dynamo.reset()
            _, code_inductor = _first_run_code(torch.compile(model, backend="inductor", mode=MODE), x)
        error = float((out.float() - expected.float()).abs().max())
        sites = [d for d in (report.decisions if report else []) if d.kind == "kernel"]
    rows = []
    for d in sites:
        times = {a.candidate: a.measured_ms for a in d.alternatives}
        g = times.pop("graphopt::linear_act", times.pop("graphopt::wq_linear", None))
        best = min(((k, v) for k, v in times.items() if v is not None), key=lambda kv: kv[1], default=(None, None))
        rows.append({"site": d.site, "chosen": d.chosen, "basis": d.basis, "graphopt_ms": g, "inductor_best": best[0],
                     "inductor_best_ms": best[1], "graphopt_speedup": (best[1] / g) if g and best[1] else None, "reason": d.reason})
    identical = _comparable(code_graphopt) == _comparable(code_inductor)
    return {"tokens": tokens, "weights": weights, "hidden": hidden, "inner": inner, "dtype": str(dtype).removeprefix("torch."),
            "compile_s": {k: round(v, 1) for k, v in compile_s.items()}, "max_abs_error": error,
            "block_ms_graphopt": ms_graphopt, "block_ms_inductor": ms_inductor, "sites": rows,
            "code_identical_to_inductor": identical if code_inductor and code_graphopt else None,
            "launches": {"inductor": _kernel_launches(code_inductor), "graphopt": _kernel_launches(code_graphopt)},
            "warnings": list(report.warnings) if report else []}


def _print_case(r: dict[str, Any]) -> None:
    for s in r["sites"]:
        best = f"{s['inductor_best'] or '-'}".removeprefix("inductor ")[:21] + (f" {s['inductor_best_ms']:.4f}" if s["inductor_best_ms"] else "")
        ratio = f"{s['graphopt_speedup']:.2f}" if s["graphopt_speedup"] else "-"
        g = f"{s['graphopt_ms']:.4f}" if s["graphopt_ms"] else "-"
        print(f"{r['tokens']:>6}  {s['site'][:44]:44s} {s['chosen']:9s} {g:>11s} {best:>30s} {ratio:>10s}")
    same = {True: "yes", False: "no", None: "not captured"}[r["code_identical_to_inductor"]]
    print(f"{r['tokens']:>6}  block: inductor alone {r['block_ms_inductor']:.4f} ms, graphopt with sites {r['block_ms_graphopt']:.4f} ms "
          f"(graphopt/inductor {r['block_ms_graphopt'] / r['block_ms_inductor']:.3f}); code identical to inductor's: {same}; "
          f"launches {r['launches']['inductor']} / {r['launches']['graphopt']}; compile s inductor {r['compile_s']['inductor']}, "
          f"graphopt {r['compile_s']['graphopt']}; max |error| {r['max_abs_error']:.2e}")
    notes = [w for w in r["warnings"] if "frozen into constants" not in w]
    if notes:  # on a line of its own (gpu_session.sh leaves out the log's lines about warnings)
        print(f"{r['tokens']:>6}  warnings: {notes}")
    if not r["sites"]:
        print(f"{r['tokens']:>6}  no site was decided: see the warnings")
    sys.stdout.flush()


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
    _warm_up(args.device)
    print(f"\n{'tokens':>6}  {'site':44s} {'kept':9s} {'graphopt ms':>11s} {'inductor (site compiled)':>30s} {'graphopt x':>10s}", flush=True)
    results: list[dict[str, Any]] = []
    for t in tokens:  # each case printed and saved as it ends (a run cut short by the step's timeout keeps what it did)
        if args.device == "cuda":
            results.append(run_case(t, args.hidden, args.inner, torch.float16, weights=args.weights))
        else:
            from torch._inductor import config

            with config.patch(max_autotune_gemm_backends="ATEN"):
                results.append(run_case(t, args.hidden, args.inner, torch.float32, "cpu", args.weights))
        _print_case(results[-1])
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "gpu": gpu,
                                            "torch": torch.__version__, "weights": args.weights, "python": platform.python_version(),
                                            "mode": MODE, "command": " ".join(sys.argv), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
