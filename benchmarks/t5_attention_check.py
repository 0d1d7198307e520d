"""T5's attention on the GPU: which attn_mask construction the fused SDPA kernels take, and which crash (issue 15).

graphopt's frozen T5 position bias has a strided last axis, which sends every CUDA attention to
SDPA's math form (T5-base default mode 1.13x slower than inductor on an H100); a dense copy of it
(commit c80cbcd, reverted) failed there with "CUDA error: misaligned address" for a cause not
found on a CPU. This script answers on the GPU, every case in a child process of its own (a CUDA
error poisons the process's context; the next case starts a fresh one), so one crash is one line:

1. probes (eager, no compile, T5-base's attention shapes fp16 b8 s128): SDPA on q/k/v packed in one
   GEMM's output (graphopt's layout) or separate, a dense [1, H, S, S] mask, with the efficient,
   cuDNN or default backend; which backend the default picks (torch._fused_sdp_choice); the
   efficient and cuDNN ops themselves on the mask expanded to [B, H, S, S], as inductor calls them;
2. compiles: T5-base with 2 layers, then all 12, fp16 b8 s128, through inductor and through
   graphopt's default mode with each `attention_mask` handling (graphopt/passes/fx_sdpa.py):
   keep, aligned, copy, decompose, and aligned without the packed q/k/v GEMM (2 layers only).
   Per case: error or time (median of CUDA-event timings, p10, p90), the ratio to inductor's (same
   model; another process on the same GPU), max |diff| against eager, the SDPA op inductor's
   code calls, the attention kernels the profiler saw, and the mask graphopt handed on.

A case that fails with a CUDA error is run again alone with CUDA_LAUNCH_BLOCKING=1 (the first
compile and the first probe that fail, while the budget lasts), so the error names the kernel.

    python benchmarks/t5_attention_check.py --out $OUT/t5_attention --budget-s 220
    python benchmarks/t5_attention_check.py --device cpu --tiny --out /tmp/t5a   # a CPU dry run

Output: a table per part, one line per case, and JSON (--out folder: t5_attention_check.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HANDLINGS = ("keep", "aligned", "copy", "decompose")
#: An error after which this process's CUDA context may be unusable: the next case gets a fresh process.
DEVICE_FAULT = re.compile(r"CUDA error|CUDNN_STATUS|cuDNN Frontend error|CUBLAS_STATUS|illegal memory|misaligned address", re.I)
ATTENTION_KERNEL = re.compile(r"fmha|flash|cudnn|efficient|attention|softmax|bmm|gemm|gemv|sm90_|cutlass", re.I)


# --------------------------------------------------------------------------- the cases


def plan(tiny: bool, only: str = "all") -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for qkv in ("packed", "separate"):
        for backend in ("default", "efficient", "cudnn"):
            cases.append({"kind": "probe", "name": f"probe {qkv} q/k/v, dense mask, {backend}", "qkv": qkv, "mask": "dense", "backend": backend})
    for op in ("efficient-op", "cudnn-op"):  # the backend op itself on the mask expanded to [B, H, S, S], as inductor's code calls it
        cases.append({"kind": "probe", "name": f"probe packed q/k/v, expanded mask, {op}", "qkv": "packed", "mask": "expanded", "backend": op})
    cases.append({"kind": "probe", "name": "probe packed q/k/v, strided mask, default", "qkv": "packed", "mask": "strided", "backend": "default"})
    # The baselines of both models first (inductor, graphopt's default), then each handling on both.
    compiles = [("t5-2", "inductor"), ("t5-2", "graphopt-keep"), ("t5-base", "inductor"), ("t5-base", "graphopt-keep")]
    compiles += [("t5-2", "graphopt-aligned"), ("t5-2", "graphopt-aligned-unpacked"), ("t5-2", "graphopt-copy"), ("t5-2", "graphopt-decompose"),
                 ("t5-base", "graphopt-aligned"), ("t5-base", "graphopt-copy"), ("t5-base", "graphopt-decompose")]
    for model, variant in compiles:
        layers = 2 if tiny or model == "t5-2" else 12
        cases.append({"kind": "compile", "name": f"{model} {variant}", "model": model, "layers": layers, "variant": variant})
    return [c for c in cases if only == "all" or c["kind"] + "s" == only]


def _dims(tiny: bool) -> tuple[int, int, int, int]:
    """batch, sequence, heads, head size (T5-base: 12 heads of 64)."""
    return (2, 16, 4, 16) if tiny else (8, 128, 12, 64)


def run_probe(case: dict[str, Any], device: str, tiny: bool) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    batch, seq, heads, dim = _dims(tiny)
    width = heads * dim
    dtype = torch.float16 if device == "cuda" else torch.float32
    if case["qkv"] == "packed":  # graphopt's: one GEMM's [B, S, 3 * H * D] output, split (views)
        qkv = torch.randn(batch, seq, 3 * width, device=device, dtype=dtype)
        parts = qkv.split(width, dim=-1)
    else:
        parts = tuple(torch.randn(batch, seq, width, device=device, dtype=dtype) for _ in range(3))
    q, k, v = (p.view(batch, seq, heads, dim).transpose(1, 2) for p in parts)
    bias = torch.randn(seq, seq, heads, device=device, dtype=dtype)  # T5's embedding [q, k, heads]
    mask = bias.permute(2, 0, 1).unsqueeze(0)
    if case["mask"] in ("dense", "expanded"):
        mask = mask.contiguous()
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float(), scale=1.0)
    if case["mask"] == "expanded":
        mask = mask.expand(batch, heads, seq, seq)
    found: dict[str, Any] = {"mask_stride": list(mask.stride()), "mask_ptr_mod16": mask.data_ptr() % 16, "q_stride": list(q.stride()),
                             "k_offset": k.storage_offset()}
    if device == "cuda":
        choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, False, scale=1.0)
        names = {int(value): name for name, value in SDPBackend.__members__.items()}
        found["default_backend"] = names.get(int(choice), str(choice))
        found["cudnn"] = torch.backends.cudnn.version()
    backends = {"efficient": [SDPBackend.EFFICIENT_ATTENTION], "cudnn": [SDPBackend.CUDNN_ATTENTION]}.get(case["backend"])
    if case["backend"] == "efficient-op":
        out = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, mask, False, scale=1.0)[0]
    elif case["backend"] == "cudnn-op":
        out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, mask, False, scale=1.0)[0]
    elif backends is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
    else:
        with sdpa_kernel(backends):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
    if device == "cuda":
        torch.cuda.synchronize()
    found["max_abs_diff"] = (out.float() - reference).abs().max().item()
    found["status"] = "ok"
    return found


def _model(layers: int, tiny: bool) -> Any:
    import torch
    import transformers

    torch.manual_seed(0)
    size = dict(d_model=64, num_heads=4, d_kv=16, d_ff=128, vocab_size=1000) if tiny else dict(d_model=768, num_heads=12, d_kv=64, d_ff=3072)
    return transformers.T5EncoderModel(transformers.T5Config(use_cache=False, num_layers=layers, **size)).eval()


def _mask_seen() -> list[dict[str, Any]]:
    """The attn_mask of each SDPA in the graph graphopt handed on: a constant's layout, or the op computing it."""
    from graphopt.passes.fx_passes import attr_tensor
    from graphopt.torch_backend import last_graph

    graph, seen = last_graph(), []
    for node in graph.graph.nodes if graph is not None else []:
        if node.op == "call_function" and "scaled_dot_product_attention" in str(node.target):
            mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
            if mask is None:
                seen.append({"mask": None})
            elif mask.op == "get_attr":
                t = attr_tensor(graph, str(mask.target))
                seen.append({"mask": "constant", "shape": list(t.shape), "stride": list(t.stride()), "dtype": str(t.dtype),
                             "offset": t.storage_offset(), "ptr_mod16": t.data_ptr() % 16})
            else:
                seen.append({"mask": str(mask.target)})
    unique = []
    for entry in seen:
        if entry not in unique:
            unique.append(entry)
    return unique


def run_compile(case: dict[str, Any], device: str, tiny: bool, warmup: int, iters: int) -> dict[str, Any]:
    import torch
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_profile import kernel_profile
    from torch_compile import _ensure_backend_registered

    cuda = device == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    batch, seq, _, _ = _dims(tiny)
    model = _model(case["layers"], tiny).to(device=device, dtype=dtype)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device=device)
    variant = case["variant"]
    torch._dynamo.reset()
    import graphopt.passes.fx_pack as fx_pack

    pack = fx_pack.pack_projections
    if variant == "inductor":
        compiled = torch.compile(model)
    else:
        _ensure_backend_registered()
        handling = variant.removeprefix("graphopt-").removesuffix("-unpacked")
        if variant.endswith("-unpacked"):  # q, k and v as three GEMMs, as dynamo's graph has them
            fx_pack.pack_projections = lambda gm, new_constant, fake_mode: 0
        compiled = torch.compile(model, backend="graphopt", options={"attention_mask": handling})
    found: dict[str, Any] = {}
    with torch.no_grad():
        reference = model(input_ids=ids).last_hidden_state.float()
        t0 = time.perf_counter()
        try:
            with inductor_config.patch(fx_graph_cache=False):  # generated here, so that its code is seen
                out, codes = run_and_get_code(lambda: compiled(input_ids=ids).last_hidden_state)
        finally:
            fx_pack.pack_projections = pack
        if cuda:
            torch.cuda.synchronize()
        found["compile_s"] = round(time.perf_counter() - t0, 2)
        code = "\n".join(codes)
        found["sdpa_ops"] = sorted(set(re.findall(r"aten\.(_scaled_dot_product_\w+|_efficient_attention_forward|_flash_attention_forward)", code)))
        found["bmm_calls"] = len(re.findall(r"extern_kernels\.bmm\(", code))
        found["max_abs_diff"] = (out.float() - reference).abs().max().item()
        found["max_rel_diff"] = found["max_abs_diff"] / (reference.abs().max().item() or 1.0)
        if variant != "inductor":
            found["masks"] = _mask_seen()

        def call() -> Any:
            return compiled(input_ids=ids)

        for _ in range(warmup):
            call()
        times = []
        for _ in range(iters):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                call()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                call()
                times.append((time.perf_counter() - t0) * 1e3)
        times.sort()
        found.update(median_ms=statistics.median(times), p10_ms=times[len(times) // 10], p90_ms=times[(9 * len(times)) // 10])
        if cuda:
            profile = kernel_profile(call, runs=5, top=40)
            found["kernels_per_run"] = profile["kernels_per_run"]
            found["attention_kernels"] = sorted({t["name"][:60] for t in profile["top"] if ATTENTION_KERNEL.search(t["name"])
                                                 and re.search(r"fmha|flash|cudnn|attention|softmax|bmm", t["name"], re.I)})
    found["status"] = "ok" if found["max_rel_diff"] < 2e-2 else "numerics differ"
    return found


# --------------------------------------------------------------------------- a child: cases one after another


def _injected_fault(name: str) -> None:
    """For the tests of this script (tests/test_t5_attention_check.py): T5_CHECK_FAULTS="case=raise;case=abort"
    makes a case raise a CUDA-style error, or kill its process as a device fault does."""
    for item in filter(None, os.environ.get("T5_CHECK_FAULTS", "").split(";")):
        case, _, how = item.rpartition("=")
        if case == name and how == "raise":
            blocking = " (launch blocking)" if os.environ.get("CUDA_LAUNCH_BLOCKING") == "1" else ""
            raise RuntimeError(f"CUDA error: misaligned address{blocking}")
        if case == name and how == "abort":
            print("CUDA error: an illegal memory access was encountered", file=sys.stderr, flush=True)
            os.abort()


def child(args: argparse.Namespace) -> int:
    cases = json.loads(Path(args.cases).read_text())
    deadline = time.monotonic() + args.budget_s
    with open(args.results, "a") as log:
        for case in cases:
            if time.monotonic() > deadline:
                break
            log.write(json.dumps({"name": case["name"], "event": "started"}) + "\n")
            log.flush()
            try:
                _injected_fault(case["name"])
                found = run_probe(case, args.device, args.tiny) if case["kind"] == "probe" else \
                    run_compile(case, args.device, args.tiny, args.warmup, args.iters)
            except Exception as error:  # a CUDA error poisons this process: report it and let the parent start another
                message = " ".join(str(error).split())[:300]
                frames = traceback.extract_tb(error.__traceback__)[-3:]  # under CUDA_LAUNCH_BLOCKING=1: the call that failed
                found = {"status": f"error: {type(error).__name__}: {message}",
                         "where": " <- ".join(f"{Path(f.filename).name}:{f.lineno} {(f.line or '').strip()[:200]}" for f in reversed(frames))}
                log.write(json.dumps({"name": case["name"], "event": "done", **found}) + "\n")
                log.flush()
                if DEVICE_FAULT.search(message):
                    return 3
                continue
            log.write(json.dumps({"name": case["name"], "event": "done", **found}) + "\n")
            log.flush()
    return 0


# --------------------------------------------------------------------------- the parent


def _spawn(cases: list[dict[str, Any]], args: argparse.Namespace, budget_s: float, blocking: bool) -> tuple[dict[str, dict[str, Any]], str]:
    """Run `cases` in one child; returns {name: result} of those it started, and its output's tail."""
    with tempfile.TemporaryDirectory() as tmp:
        cases_file, results_file = Path(tmp, "cases.json"), Path(tmp, "results.jsonl")
        cases_file.write_text(json.dumps(cases))
        results_file.touch()
        env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        if blocking:
            env["CUDA_LAUNCH_BLOCKING"] = "1"
        command = [sys.executable, __file__, "--child", "--cases", str(cases_file), "--results", str(results_file), "--device", args.device,
                   "--budget-s", str(max(budget_s - 20, 5)), "--warmup", str(args.warmup), "--iters", str(args.iters)] + (["--tiny"] if args.tiny else [])
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=max(budget_s, 10))
            tail, rc = (done.stdout + done.stderr)[-3000:], done.returncode
        except subprocess.TimeoutExpired as expired:  # its captured output may be bytes even with text=True
            text = "".join(o.decode(errors="replace") if isinstance(o, bytes) else (o or "") for o in (expired.stdout, expired.stderr))
            tail, rc = text[-3000:] + "\n(child timed out)", None
        results: dict[str, dict[str, Any]] = {}
        for line in results_file.read_text().splitlines():
            entry = json.loads(line)
            name = entry.pop("name")
            if entry.pop("event") == "started" and rc is None:
                results[name] = {"status": "skipped: the budget ran out during it"}
            elif "status" not in entry:  # started, never done: the process died in it
                errors = [ln.strip() for ln in tail.splitlines() if re.search(r"CUDA error|cuDNN|Error|error:", ln)]
                results[name] = {"status": f"crashed (child exit {rc}): {errors[-1][:300] if errors else 'no error line'}"}
            else:
                results[name] = entry
    return results, tail


def parent(args: argparse.Namespace) -> int:
    import torch

    started = time.monotonic()
    cases = plan(args.tiny, args.only)
    results: dict[str, dict[str, Any]] = {}
    pending = list(cases)
    reran: set[str] = set()
    while pending:
        left = args.budget_s - (time.monotonic() - started)
        if left < 15:
            for case in pending:
                results[case["name"]] = {"status": "skipped: budget"}
            break
        got, _ = _spawn(pending, args, left, blocking=False)
        results.update(got)
        pending = [c for c in pending if c["name"] not in got]
        for case in cases:  # the first crash of each kind again with CUDA_LAUNCH_BLOCKING=1: the failing kernel named
            name, entry = case["name"], results.get(case["name"], {})
            if case["kind"] in reran or not DEVICE_FAULT.search(entry.get("status", "")):
                continue
            reran.add(case["kind"])
            left = args.budget_s - (time.monotonic() - started)
            if left > 40:
                again, tail = _spawn([case], args, min(left, 90), blocking=True)
                entry["launch_blocking"] = again.get(name, {}).get("status", "not run")
                entry["launch_blocking_where"] = again.get(name, {}).get("where", "")
                entry["launch_blocking_tail"] = tail[-1500:]
        if not got:  # a child that started nothing: stop rather than loop
            for case in pending:
                results[case["name"]] = {"status": "not run (the child started no case)"}
            break
    report = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if args.device == "cuda" and torch.cuda.is_available() else args.device,
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "elapsed_s": round(time.monotonic() - started, 1),
              "cases": [{**c, **results.get(c["name"], {"status": "not run"})} for c in cases]}
    print(render(report))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "t5_attention_check.json").write_text(json.dumps(report, indent=1))
        print(f"wrote {out / 't5_attention_check.json'}")
    return 0


def render(report: dict[str, Any]) -> str:
    lines = [f"{report['device']}  torch {report['torch']}  {report['date']}  ({report['elapsed_s']} s)"]
    inductor = {c["model"]: c.get("median_ms") for c in report["cases"] if c.get("variant") == "inductor"}
    for case in report["cases"]:
        status = case.get("status", "")
        failed = not (status == "ok" or status.startswith("numerics"))
        if case["kind"] == "probe":
            extra = "" if failed else f"diff {case['max_abs_diff']:.1e}  default backend {case.get('default_backend', '-')}  cudnn {case.get('cudnn', '-')}"
            lines.append(f"{'FAILED ' if failed else ''}{case['name']:46s} {status if failed else 'ok'}  {extra}")
        elif failed:
            lines.append(f"FAILED {case['name']:34s} {status}")
        else:
            base = inductor.get(case["model"])
            ratio = f"{case['median_ms'] / base:.2f}x inductor" if base else "-"
            masks = "; ".join(m["mask"] if m.get("mask") != "constant" else f"constant {m['dtype'].removeprefix('torch.')} stride {m['stride']} ptr%16={m['ptr_mod16']}"
                              for m in case.get("masks", []))
            lines.append(f"{case['name']:41s} {case['median_ms']:7.3f} ms (p10 {case['p10_ms']:.3f}, p90 {case['p90_ms']:.3f})  {ratio:>16s}  "
                         f"diff {case['max_abs_diff']:.1e}  sdpa {','.join(case['sdpa_ops']) or '-'}  bmm {case['bmm_calls']}  "
                         f"kernels/run {case.get('kernels_per_run', '-')}  attention kernels: {', '.join(case.get('attention_kernels', [])) or '-'}"
                         + (f"  mask: {masks}" if masks else "") + ("" if status == "ok" else f"  {status}"))
        if case.get("launch_blocking"):
            lines.append(f"    with CUDA_LAUNCH_BLOCKING=1: {case['launch_blocking']}")
            if case.get("launch_blocking_where"):
                lines.append(f"    at {case['launch_blocking_where']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="small T5 and shapes (a dry run)")
    parser.add_argument("--budget-s", type=float, default=220.0, help="wall-clock budget for all cases")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--only", default="all", choices=("all", "probes", "compiles"), help="run only these cases")
    parser.add_argument("--out", help="folder for t5_attention_check.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cases", help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.budget_s <= 0 or args.warmup < 0 or args.iters <= 0:
        print("error: --budget-s and --iters must be positive, --warmup not negative", file=sys.stderr)
        return 2
    if args.device == "cuda" and not args.child:
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda but torch sees no CUDA device (use --device cpu --tiny for a dry run)", file=sys.stderr)
            return 2
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
