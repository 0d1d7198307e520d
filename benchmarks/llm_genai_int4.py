"""graphopt's int4 (com.microsoft.MatMulNBits) against the onnxruntime-genai model builder's int4 model,
same LlamaConfig and weights, decoded greedily in plain onnxruntime with io-binding (issue 18's ORT anchor).

    python benchmarks/llm_genai_int4.py --out DIR --genai-python /work/venv-genai/bin/python --threads 1     # CPU
    python benchmarks/llm_genai_int4.py --out DIR --device cuda --shape tinyllama --genai-python python3     # CUDA

The folder (random weights), the torch.onnx export and the decode loop are llm_genai_compare.py's. Variants
(--variants, comma-separated; each name's dash-separated options after its kind):

* export: the torch.onnx export in --dtype (fp32 on CPU, fp16 on CUDA), growing cache: the accuracy reference.
* graphopt: `--target ort-cpu|ort-cuda --kv-buffer shared`, weights unquantized.
* builder-int4: `python -m onnxruntime_genai.models.builder -p int4 -e cpu|cuda` (its defaults: block 32,
  symmetric, accuracy_level 4 on the CPU and 0 elsewhere, every MatMul quantized, the LM head included).
* graphopt-int4: graphopt as above with `--weights int4` (its defaults: block 32, zero points, accuracy_level
  4 on ort-cpu and 0 on ort-cuda, the LM head kept in the float type by the default block list).

Options: bNN the block size (both kinds; default --block-size), accN accuracy_level (both), head the LM head
quantized too (graphopt: weights_keep=["none"]), sym / asym graphopt's zero points. E.g.
`graphopt-int4-head-sym` is graphopt's quantization of what the builder quantizes, as the builder does.

Each variant but the export binds one max-length KV buffer per past/present pair (past_present_share_buffer).
All variants run in lockstep (each one's step i in turn), --rounds times: prefill of --prompt random tokens
(median ms), then --steps greedy steps (median ms/step after --warmup). Accuracy against the export: the
greedy tokens equal to its own from the first (free-running), and, feeding every variant the export's tokens
(teacher forcing), the cosine of each step's logits with the export's (min, median over prompt + steps) and
the share of steps whose argmax equals the export's. Op counts and each model's MatMulNBits attributes
(count, block_size, accuracy_level, zero points, the LM head's form) are printed and kept.
With --threads > 1 on a machine with few cores, add --no-spinning: the sessions' idle pool threads otherwise spin
while the next variant runs (10-40x slower steps measured on 2 cores, RESULTS.md 2026-11-28).
Output: a table and DIR/llm_genai_int4-<shape>-<device>.json (device, versions, command).
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from llm_genai_compare import BUILDER_SHIM, SHAPES, Decoder, add_decode_options, agreement, export, lockstep, make_folder  # noqa: E402

KINDS = ("export", "graphopt", "builder-int4", "graphopt-int4")
DEFAULT_VARIANTS = "export,graphopt,builder-int4,graphopt-int4,graphopt-int4-head,graphopt-int4-head-sym"


def parse_variant(name: str, block_size: int) -> dict[str, Any]:
    """{'kind', 'block', 'level', 'head', 'symmetric'} from a variant name; ValueError for a bad one."""
    kind = next((k for k in sorted(KINDS, key=len, reverse=True) if name == k or name.startswith(k + "-")), None)
    if kind is None:
        raise ValueError(f"variant {name!r}: expected one of {', '.join(KINDS)} with options")
    spec: dict[str, Any] = {"kind": kind, "block": block_size, "level": None, "head": False, "symmetric": None}
    for option in filter(None, name[len(kind):].split("-")):
        if kind in ("export", "graphopt"):
            raise ValueError(f"variant {name!r}: {kind} takes no options")
        if option[0] == "b" and option[1:].isdigit():
            spec["block"] = int(option[1:])
        elif option.startswith("acc") and option[3:].isdigit():
            spec["level"] = int(option[3:])
        elif option in ("head", "sym", "asym") and kind == "graphopt-int4":
            spec["head"] = spec["head"] or option == "head"
            spec["symmetric"] = spec["symmetric"] if option == "head" else option == "sym"
        else:
            raise ValueError(f"variant {name!r}: unknown option {option!r} (bNN, accN; graphopt-int4 also head, sym, asym)")
    return spec


def build_builder_int4(folder: Path, out: Path, spec: dict[str, Any], args: argparse.Namespace) -> Path:
    model = out / "model.onnx"
    if model.exists():
        return model
    extra = [f"block_size={spec['block']}"] + ([f"accuracy_level={spec['level']}"] if spec["level"] is not None else [])
    command = [args.genai_python, "-c", BUILDER_SHIM, "-i", str(folder), "-o", str(out), "-p", "int4", "-e", args.device,
               "-c", str(out / "cache"), "--extra_options", *extra]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not model.exists():
        raise RuntimeError(f"the builder failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:] or done.stdout[-300:]}")
    print(f"builder: int4 {args.device} {' '.join(extra)} in {time.perf_counter() - started:.1f} s", flush=True)
    return model


def optimize(source: Path, path: Path, spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import graphopt

    target = "ort-cuda" if args.device == "cuda" else "ort-cpu"
    options: dict[str, Any] = {"target": target, "kv_buffer": "shared", "kv_max_length": None if args.per_step_tables else args.max_length}
    if spec["kind"] == "graphopt-int4":
        options |= {"weights": "int4", "block_size": spec["block"], "weights_keep": ["none"] if spec["head"] else [],
                    "weights_symmetric": spec["symmetric"], "weights_accuracy_level": spec["level"]}
    if args.reuse and path.exists() and path.stat().st_mtime > source.stat().st_mtime:
        return {"options": options, "reused": str(path)}
    started = time.perf_counter()
    report = graphopt.optimize_file(source, path, **options)
    summary = report.weight_quantization
    info: dict[str, Any] = {"options": options, "seconds": round(time.perf_counter() - started, 1)}
    if summary is not None:
        info["weights"] = {"quantized": summary.quantized, "kept": summary.kept, "accuracy_level": summary.accuracy_level,
                           "symmetric": summary.symmetric, "kept_layers": {layer.node: layer.reason for layer in summary.layers if not layer.quantized},
                           "snr_db_min": min((layer.snr_db for layer in summary.layers if layer.snr_db is not None), default=None)}
    print(f"graphopt {path.name}: {info}", flush=True)
    return info


def describe(path: Path) -> dict[str, Any]:
    """Op counts and the MatMulNBits nodes' attributes; the float MatMuls with a constant weight (shape)."""
    import onnx
    from onnx import helper

    graph = onnx.load(str(path), load_external_data=False).graph
    shapes = {i.name: tuple(i.dims) for i in graph.initializer}
    nbits: collections.Counter[str] = collections.Counter()
    float_weights = []
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            zero_points = len(node.input) > 3 and bool(node.input[3])
            nbits[f"bits {attrs['bits']} block {attrs['block_size']} acc {attrs.get('accuracy_level', 0)}"
                  f"{' zp' if zero_points else ''}{' N=' + str(attrs['N']) if attrs['N'] > 4 * attrs['K'] else ''}"] += 1
        elif node.op_type == "MatMul" and node.input[1] in shapes:
            float_weights.append(f"{node.name or node.output[0]} {shapes[node.input[1]]}")
    return {"ops": dict(collections.Counter(n.op_type for n in graph.node).most_common()),
            "matmulnbits": dict(nbits), "float_matmul_weights": float_weights,
            "bytes": sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))}


def cosines(logits: np.ndarray, reference: np.ndarray) -> np.ndarray:
    a, b = logits.reshape(-1, logits.shape[-1]).astype(np.float64), reference.reshape(-1, reference.shape[-1]).astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_decode_options(parser)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--no-spinning", action="store_true",
                        help="intra-op threads sleep when idle (session.intra_op.allow_spinning=0): with several threads on a few "
                        "cores, one session's spinning pool otherwise slows the next session's step in the lockstep")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--genai-python", default=sys.executable, help="a python that has onnxruntime_genai (its builder)")
    args = parser.parse_args(argv)
    args.dtype = "fp16" if args.device == "cuda" else "fp32"  # what export() reads
    try:
        variants = {name: parse_variant(name, args.block_size) for name in dict.fromkeys(v.strip() for v in args.variants.split(",") if v.strip())}
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if "export" not in variants or args.prompt + args.steps > args.max_length:
        print("error: the variants must include export (the accuracy reference); prompt + steps <= --max-length", file=sys.stderr)
        return 2
    work = args.work or args.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    import onnxruntime as ort

    layers = args.layers or SHAPES[args.shape]["num_hidden_layers"]
    tag = f"{args.shape}-l{layers}-{args.dtype}"
    folder = work / f"hf-{args.shape}-l{layers}"
    config = make_folder(folder, args)
    source = export(folder, work / f"export-{tag}.onnx", args)
    files: dict[str, Path] = {}
    built: dict[str, Any] = {}
    for name, spec in variants.items():
        if spec["kind"] == "export":
            files[name] = source
        elif spec["kind"] == "builder-int4":
            level = "" if spec["level"] is None else f"-acc{spec['level']}"
            files[name] = build_builder_int4(folder, work / f"builder-int4-b{spec['block']}{level}-{args.shape}-l{layers}-{args.device}", spec, args)
        else:
            files[name] = work / f"graphopt-{tag}-{args.device}-{name}.onnx"
            built[name] = optimize(source, files[name], spec, args)
    graphs = {name: describe(path) for name, path in files.items()}
    for name, graph in graphs.items():
        print(f"{name}: {graph['bytes'] / 1e6:.1f} MB, MatMulNBits {graph['matmulnbits']}, float MatMul weights "
              f"{graph['float_matmul_weights']}\n    ops {graph['ops']}", flush=True)
    if args.build_only:
        return 0

    rng = np.random.default_rng(0)
    prompt = rng.integers(3, config.vocab_size, (args.batch, args.prompt))
    head = config.hidden_size // config.num_attention_heads
    decoders = {name: Decoder(path, args.device, args.threads, variants[name]["kind"] != "export", args.max_length,
                              config.num_key_value_heads, head, spinning=not args.no_spinning) for name, path in files.items()}
    # accuracy first (untimed): the export's greedy run, then every variant fed its tokens
    reference = decoders["export"]
    for _ in reference.run(prompt, args.steps, keep_logits=True):
        pass
    ref_tokens, ref_logits = reference.tokens, reference.logits
    accuracy: dict[str, dict[str, Any]] = {}
    for name, decoder in decoders.items():
        for _ in decoder.run(prompt, args.steps, forced=ref_tokens, keep_logits=True):
            pass
        cos = cosines(decoder.logits, ref_logits)
        top1 = float((decoder.logits.argmax(-1) == ref_logits.argmax(-1)).mean())
        accuracy[name] = {"cos_min": float(cos.min()), "cos_median": float(np.median(cos)), "top1_forced": top1,
                          "max_abs_dlogit": float(np.abs(decoder.logits - ref_logits).max())}
    times = lockstep(decoders, prompt, args.steps, args.rounds)
    rows = []
    for name, decoder in decoders.items():
        steps = [t for r in range(args.rounds) for t in times[name]["steps"][r * args.steps + args.warmup:(r + 1) * args.steps]]
        rows.append({"variant": name, "prefill_ms": statistics.median(times[name]["prefill"]) * 1e3,
                     "decode_ms": statistics.median(steps) * 1e3, "agree": agreement(decoder.tokens, ref_tokens),
                     **accuracy[name], "tokens": decoder.tokens.tolist()})
    device = platform.processor() or platform.machine()
    if args.device == "cuda":
        device = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, check=False).stdout.strip()
    record = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": device, "onnxruntime": ort.__version__,
              "command": " ".join(["python", "benchmarks/llm_genai_int4.py", *(argv if argv is not None else sys.argv[1:])]),
              "args": {k: str(v) for k, v in vars(args).items()}, "config": config.to_dict(), "variants": variants,
              "graphopt": built, "graphs": graphs, "reference_tokens": ref_tokens.tolist(), "results": rows}
    (args.out / f"llm_genai_int4-{args.shape}-l{layers}-{args.device}.json").write_text(json.dumps(record, indent=1, default=str))
    print(f"\n{device}, onnxruntime {ort.__version__}, {tag}, threads {args.threads or 'default'}, batch {args.batch}, "
          f"prompt {args.prompt}, {args.steps} greedy steps, {args.rounds} rounds; accuracy against the export ({args.dtype})")
    print(f"{'variant':<26}{'MB':>7}{'prefill ms':>11}{'ms/step':>9}{'tok/s':>8}{'= export':>10}{'cos min':>9}{'cos med':>9}{'top1 forced':>12}")
    for r in rows:
        print(f"{r['variant']:<26}{graphs[r['variant']]['bytes'] / 1e6:>7.1f}{r['prefill_ms']:>11.2f}{r['decode_ms']:>9.3f}"
              f"{args.batch / r['decode_ms'] * 1e3:>8.1f}{r['agree']:>6}/{args.steps:<3}{r['cos_min']:>9.5f}{r['cos_median']:>9.5f}"
              f"{r['top1_forced'] * 100:>11.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
