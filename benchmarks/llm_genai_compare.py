"""graphopt's optimized export against the onnxruntime-genai model builder's model, same config and
weights, decoded greedily in plain onnxruntime with io-binding (issue 17, ORT path).

    python benchmarks/llm_genai_compare.py --out DIR                                  # CPU fp32, small config
    python benchmarks/llm_genai_compare.py --out DIR --shape tinyllama                # the issue's 1.1B shape
    python benchmarks/llm_genai_compare.py --out DIR --device cuda --dtype fp16 --shape tinyllama
    python benchmarks/llm_genai_compare.py --out DIR --device cuda --dtype fp16 --shape tinyllama \
        --variants builder-static,builder-cg,graphopt-static,graphopt-cg                        # CUDA graphs

Steps: a LlamaForCausalLM from a LlamaConfig with random weights (--shape: small = hidden 512,
4 layers, 8 heads, 2 KV heads, intermediate 1408, vocab 32000; tinyllama = 2048, 22, 32, 4, 5632,
32000; --layers overrides) saved with save_pretrained next to a WordLevel tokenizer (the builder
wants one); the builder's model from that folder (`python -m onnxruntime_genai.models.builder -p
fp32 -e cpu`, or `-p fp16 -e cuda`; run with --genai-python, the package imported without its
native part: building needs only its Python code); the same weights exported by torch.onnx's
dynamo exporter with a DynamicCache (input_ids, past_k<i> / past_v<i> -> logits, present_k<i> /
present_v<i>; in --dtype) and optimized by graphopt for the target with --kv-buffer shared.

Variants (--variants): builder-shared and graphopt-shared bind one max-length KV buffer per
past/present pair (onnxruntime's past_present_share_buffer: GroupQueryAttention writes the new
tokens in place; --max-length), with an all-ones attention_mask of the valid length;
builder-growing, graphopt-growing and original (the export as it is) get the presents of a step
bound as the next step's past. builder-static and graphopt-static bind every input and output once
to fixed buffers (a [batch, max_length] attention_mask updated in place, the greedy token an ArgMax
output on the device; ort_static_decode.py), builder-cg and graphopt-cg replay those decode steps
as the CUDA provider's CUDA graph (enable_cuda_graph; their "= no graph" column: leading tokens
equal to the -static variant's of the same model). Each: prefill of --prompt random tokens (seeded), then greedy
decode for --steps tokens, --rounds times, all variants in lockstep (each one's step i in turn: load
from other work on the machine falls on all alike); prefill ms (median), decode ms/token (median
of the steps after --warmup), tok/s, and how
many greedy tokens equal torch eager fp32's (transformers, DynamicCache) from the first; op
counts of each model. Output: a table and DIR/llm_genai_compare.json (device, versions, command).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from ort_static_decode import StaticDecoder

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

SHAPES = {
    "small": {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
              "intermediate_size": 1408, "vocab_size": 32000},
    "tinyllama": {"hidden_size": 2048, "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
                  "intermediate_size": 5632, "vocab_size": 32000},
}
VARIANTS = ("builder-shared", "graphopt-shared", "original", "graphopt-growing", "builder-growing",
            "builder-static", "graphopt-static", "builder-cg", "graphopt-cg")
# The builder needs only its Python code: import the package without its native extension (the GPU
# machine's onnxruntime-gpu is not the one the wheel was built with; nothing here runs genai itself).
# Its builders import model classes of newer transformers than some machines have: a placeholder
# stands in for each missing one (a LLaMA build never touches them), named on stderr.
BUILDER_SHIM = (
    "import importlib.util, re, runpy, sys, types\n"
    "spec = importlib.util.find_spec('onnxruntime_genai')\n"
    "package = types.ModuleType('onnxruntime_genai'); package.__path__ = list(spec.submodule_search_locations)\n"
    "sys.modules['onnxruntime_genai'] = package\n"
    "sys.argv = ['builder'] + sys.argv[1:]\n"
    "import transformers\n"
    "for attempt in range(40):\n"
    "    try:\n"
    "        runpy.run_module('onnxruntime_genai.models.builder', run_name='__main__'); break\n"
    "    except ImportError as error:\n"
    "        missing = re.search(r\"cannot import name '(\\w+)' from 'transformers'\", str(error))\n"
    "        if not missing: raise\n"
    "        print(f'builder shim: transformers {transformers.__version__} has no {missing.group(1)}: a placeholder', file=sys.stderr)\n"
    "        setattr(transformers, missing.group(1), type(missing.group(1), (), {}))\n"
    "        for name in [m for m in sys.modules if m.startswith('onnxruntime_genai.')]: del sys.modules[name]\n"
)


def make_folder(folder: Path, args: argparse.Namespace) -> Any:
    """save_pretrained folder (random weights, seed 0) with a WordLevel tokenizer; returns the config."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    shape = dict(SHAPES[args.shape])
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    config = LlamaConfig(**shape, max_position_embeddings=args.max_length, tie_word_embeddings=False)
    if (folder / "config.json").exists() and (folder / "tokenizer.json").exists():
        return LlamaConfig.from_pretrained(folder)
    torch.manual_seed(0)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(config.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", bos_token="t1", eos_token="t2").save_pretrained(folder)
    return config


def build_with_builder(folder: Path, out: Path, args: argparse.Namespace) -> Path:
    model = out / "model.onnx"
    if model.exists():
        return model
    precision, ep = ("fp16", "cuda") if args.dtype == "fp16" else ("fp32", args.device)
    command = [args.genai_python, "-c", BUILDER_SHIM, "-i", str(folder), "-o", str(out), "-p", precision, "-e", ep,
               "-c", str(out / "cache")]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not model.exists():
        raise RuntimeError(f"the builder failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:] or done.stdout[-300:]}")
    print(f"builder: {precision} {ep} in {time.perf_counter() - started:.1f} s", flush=True)
    return model


def export(folder: Path, path: Path, args: argparse.Namespace) -> Path:
    """torch.onnx dynamo export of the causal LM with a DynamicCache, in --dtype (no attention_mask:
    transformers builds the causal mask from the cache position; graphopt's shared-buffer pass adds one)."""
    if path.exists():
        return path
    import torch
    from architectures import _cache_from, _cache_tensors, _module
    from transformers import LlamaForCausalLM

    dtype = torch.float16 if args.dtype == "fp16" else torch.float32
    model = LlamaForCausalLM.from_pretrained(folder, attn_implementation="sdpa", dtype=dtype).eval()
    config = model.config
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    head = config.hidden_size // config.num_attention_heads

    def forward(m: Any, input_ids: Any, *past: Any) -> Any:
        out = m(input_ids=input_ids, past_key_values=_cache_from(layers, list(past), config), use_cache=True, return_dict=True)
        return (out.logits, *_cache_tensors(out.past_key_values))

    names = ["input_ids"] + [f"past_{kv}{i}" for i in range(layers) for kv in "kv"]
    example = [torch.randint(0, 100, (2, 3))] + [torch.randn(2, kv_heads, 4, head, dtype=dtype) for _ in range(2 * layers)]
    dims = {d: torch.export.Dim(d) for d in ("batch", "seq", "past")}
    shapes: dict[str, Any] = {"input_ids": {0: dims["batch"], 1: dims["seq"]}}
    shapes |= {n: {0: dims["batch"], 2: dims["past"]} for n in names[1:]}
    outputs = ["logits"] + [f"present_{kv}{i}" for i in range(layers) for kv in "kv"]
    started = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(_module(forward, model, names), tuple(example), str(path), dynamo=True, input_names=names,
                          output_names=outputs, dynamic_shapes=shapes, optimize=True, external_data=True)
    print(f"export: {time.perf_counter() - started:.1f} s", flush=True)
    return path


def optimize(source: Path, path: Path, args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    import graphopt

    target = "ort-cuda" if args.device == "cuda" else "ort-cpu"
    if path.exists() and path.stat().st_mtime > source.stat().st_mtime and args.reuse:
        return path, {"target": target, "reused": str(path)}
    started = time.perf_counter()
    report = graphopt.optimize_file(source, path, target=target, kv_buffer="shared", disable=args.disable,
                                    kv_max_length=None if args.per_step_tables else args.max_length)
    applied = {name: rule.applications for name, rule in report.rules.items() if rule.applications}
    print(f"graphopt --target {target} --kv-buffer shared: {time.perf_counter() - started:.1f} s, {applied}; "
          f"warnings: {report.warnings}", flush=True)
    return path, {"target": target, "rules": applied, "warnings": list(report.warnings)}


def op_counts(path: Path) -> dict[str, int]:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return dict(collections.Counter(n.op_type for n in graph.node).most_common())


class Decoder:
    """One onnxruntime session decoding greedily with io-binding. shared: each past/present pair is
    one [batch, kv_heads, max_length, head] buffer bound as both (GroupQueryAttention writes in place);
    else the presents of a step are the next step's past."""

    def __init__(self, path: Path, device: str, threads: int, shared: bool, max_length: int, kv_heads: int, head: int,
                 spinning: bool = True) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        if not spinning:  # idle pool threads sleep at once instead of spinning (several sessions share the cores)
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
        self.session = ort.InferenceSession(str(path), options, providers=providers)
        self.ort, self.device, self.shared, self.max_length = ort, device, shared, max_length
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.outputs = [o.name for o in self.session.get_outputs()]
        pasts = [n for n in self.inputs if n.startswith("past")]
        # past_key_values.N.key -> present.N.key (the builder), past_kN -> present_kN (the export)
        self.pairs = [(p, p.replace("past_key_values", "present").replace("past_", "present_")) for p in pasts]
        missing = [q for _, q in self.pairs if q not in self.outputs]
        if missing:
            raise ValueError(f"no present output for {missing}")
        meta = self.inputs[pasts[0]]
        self.kv_heads, self.head = kv_heads, head  # the builder names the head axis
        self.float_type = np.float16 if "float16" in meta.type else np.float32

    def value(self, array: np.ndarray) -> Any:
        return self.ort.OrtValue.ortvalue_from_numpy(array, self.device, 0)

    def run(self, prompt: np.ndarray, steps: int, forced: np.ndarray | None = None, keep_logits: bool = False) -> Iterator[float]:
        """Prefill, then `steps` greedy steps: yields each session run's seconds (the prefill's first);
        the tokens [batch, steps] are in self.tokens afterwards (each step's argmax). forced [batch,
        steps]: the tokens fed instead of the argmax (teacher forcing, for comparing logits);
        keep_logits: each run's last-position logits in self.logits [batch, steps + 1, vocab]."""
        batch, length = prompt.shape
        rows = self.max_length if self.shared else 0
        cache = {p: self.value(np.zeros((batch, self.kv_heads, rows, self.head), self.float_type)) for p, _ in self.pairs}
        tokens, ids, total = [], prompt, length
        kept: list[np.ndarray] = []
        for step in range(steps + 1):
            binding = self.session.io_binding()
            binding.bind_ortvalue_input("input_ids", self.value(ids.astype(np.int64)))
            if "attention_mask" in self.inputs:
                binding.bind_ortvalue_input("attention_mask", self.value(np.ones((batch, total), np.int64)))
            for past, _ in self.pairs:
                binding.bind_ortvalue_input(past, cache[past])
            shared_output = {present: cache[past] for past, present in self.pairs} if self.shared else {}
            for name in self.outputs:  # in the session's order: get_outputs() returns them in binding order
                if name in shared_output:
                    binding.bind_ortvalue_output(name, shared_output[name])
                else:  # the logits go to the host (the next token is picked there)
                    binding.bind_output(name, "cpu" if name == "logits" else self.device)
            start = time.perf_counter()
            self.session.run_with_iobinding(binding)
            binding.synchronize_outputs()
            outputs = dict(zip(self.outputs, binding.get_outputs(), strict=True))
            logits = outputs["logits"].numpy()[:, -1, :].astype(np.float32)
            yield time.perf_counter() - start
            if keep_logits:
                kept.append(logits)
            if not self.shared:
                cache = {past: outputs[present] for past, present in self.pairs}
            if step < steps:
                tokens.append(logits.argmax(-1))
                ids = (tokens[-1] if forced is None else forced[:, step])[:, None]
                total += 1
        self.tokens = np.stack(tokens, 1)
        if keep_logits:
            self.logits = np.stack(kept, 1)


def lockstep(decoders: dict[str, Decoder | StaticDecoder], prompt: np.ndarray, steps: int, rounds: int) -> dict[str, dict[str, Any]]:
    """Every variant's prefill, then its step 1, ..., one after another in turn (a machine shared
    with other work slows them alike), `rounds` times: per variant its prefill and step seconds."""
    times: dict[str, dict[str, Any]] = {name: {"prefill": [], "steps": []} for name in decoders}
    for _ in range(rounds):
        runs = {name: decoder.run(prompt, steps) for name, decoder in decoders.items()}
        for step in range(steps + 1):
            for name, run in runs.items():
                times[name]["prefill" if step == 0 else "steps"].append(next(run))
        for run in runs.values():
            next(run, None)  # let each finish (its tokens)
    return times


def torch_reference(folder: Path, prompt: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy tokens of transformers' eager fp32 model with a DynamicCache, and each step's top-2 logit gap."""
    import torch
    from transformers import DynamicCache, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32).eval()
    cache, ids, tokens, gaps = DynamicCache(config=model.config), torch.from_numpy(prompt.astype(np.int64)), [], []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1, :]
            top = torch.topk(logits, 2).values
            gaps.append((top[:, 0] - top[:, 1]).numpy())
            ids = logits.argmax(-1, keepdim=True)
            tokens.append(ids[:, 0].numpy())
    return np.stack(tokens, 1), np.stack(gaps, 1)


def agreement(tokens: np.ndarray, reference: np.ndarray) -> int:
    """Leading greedy tokens equal to the reference's, the smallest over the batch rows."""
    counts = []
    for row, ref in zip(tokens, reference, strict=True):
        differ = np.nonzero(row[: len(ref)] != ref[: len(row)])[0]
        counts.append(int(differ[0]) if differ.size else min(len(row), len(ref)))
    return min(counts)


def add_decode_options(parser: argparse.ArgumentParser) -> None:
    """The options of a decode comparison on the folder and export made here (this script's and llm_genai_int4.py's)."""
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, help="where the folder and models are built (default: OUT/work; reused when present)")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="small")
    parser.add_argument("--layers", type=int, default=0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="generations per variant, all variants in lockstep")
    parser.add_argument("--max-length", type=int, default=512, help="the shared KV buffers' length (and the config's max positions)")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--reuse", action="store_true", help="keep graphopt's outputs from an earlier run in --work (default: optimize again)")
    parser.add_argument("--build-only", action="store_true", help="build the folder and the models (into --work) and stop")
    parser.add_argument("--per-step-tables", action="store_true",
                        help="graphopt computes its rotary tables every step (default: --kv-max-length = --max-length, constant "
                             "tables as the builder's cos/sin caches of the config's max positions)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_decode_options(parser)
    parser.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--disable", default="", help="graphopt rules to leave out, comma-separated")
    parser.add_argument("--genai-python", default=os.environ.get("GENAI_PYTHON", sys.executable),
                        help="a python that has onnxruntime_genai (default: $GENAI_PYTHON or this one)")
    args = parser.parse_args(argv)
    args.disable = [r for r in args.disable.split(",") if r]
    variants = list(dict.fromkeys(v.strip() for v in args.variants.split(",") if v.strip()))
    unknown = [v for v in variants if v not in VARIANTS]
    graphs_on_cpu = args.device != "cuda" and any(v.endswith("-cg") for v in variants)
    if unknown or graphs_on_cpu or args.prompt + args.steps > args.max_length or (args.dtype == "fp16") != (args.device == "cuda"):
        print(f"error: variants must be of {','.join(VARIANTS)} (got {unknown}); -cg variants need --device cuda; "
              "prompt + steps <= --max-length; fp16 goes with cuda, fp32 with cpu", file=sys.stderr)
        return 2
    work = args.work or args.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    import onnxruntime as ort

    tag = f"{args.shape}-l{args.layers or SHAPES[args.shape]['num_hidden_layers']}-{args.dtype}"
    folder = work / f"hf-{args.shape}-l{args.layers or SHAPES[args.shape]['num_hidden_layers']}"
    config = make_folder(folder, args)
    files: dict[str, Path] = {}
    info: dict[str, Any] = {}
    if any(v.startswith("builder") for v in variants):
        files["builder"] = build_with_builder(folder, work / f"builder-{tag}", args)
    if any(v.startswith(("original", "graphopt")) for v in variants):
        files["original"] = export(folder, work / f"export-{tag}.onnx", args)
    if any(v.startswith("graphopt") for v in variants):
        files["graphopt"], info["graphopt"] = optimize(files["original"], work / f"graphopt-{tag}.onnx", args)
    counts = {name: op_counts(path) for name, path in files.items()}
    for name, count in counts.items():
        print(f"{name} ops: {count}", flush=True)
    if args.build_only:
        return 0

    rng = np.random.default_rng(0)
    prompt = rng.integers(3, config.vocab_size, (args.batch, args.prompt))
    reference, gaps = torch_reference(folder, prompt, args.steps)
    device_name = platform.processor() or platform.machine()
    if args.device == "cuda":
        device_name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                                     check=False).stdout.strip()
    decoders: dict[str, Decoder | StaticDecoder] = {}
    rows = []
    kv_heads, head = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    for variant in variants:
        try:
            path = files[variant.split("-")[0]]
            if variant.endswith(("-static", "-cg")):
                decoders[variant] = StaticDecoder(path, args.device, args.threads, args.max_length, kv_heads, head,
                                                  cuda_graph=variant.endswith("-cg"))
            else:
                decoders[variant] = Decoder(path, args.device, args.threads, variant.endswith("-shared"), args.max_length, kv_heads, head)
            # a prefill and one step (a -cg variant's capture): a variant that fails is a row with its error
            probe = decoders[variant].run(prompt[:, :4], 1)
            next(probe), next(probe)
        except Exception as error:  # noqa: BLE001
            decoders.pop(variant, None)
            rows.append({"variant": variant, "error": str(error).splitlines()[0][:1500]})
            print(f"{variant}: {rows[-1]['error']}", flush=True)
    times = lockstep(decoders, prompt, args.steps, args.rounds)
    for variant, decoder in decoders.items():
        per_round = args.steps
        decode = statistics.median([t for r in range(args.rounds) for t in times[variant]["steps"][r * per_round + args.warmup:(r + 1) * per_round]])
        prefill = statistics.median(times[variant]["prefill"])
        agree = agreement(decoder.tokens, reference)
        rows.append({"variant": variant, "prefill_ms": prefill * 1e3, "decode_ms": decode * 1e3, "tok_s": args.batch / decode,
                     "agree": agree, "tokens": decoder.tokens.tolist()})
        if agree < args.steps:
            rows[-1]["reference_gap_at_divergence"] = float(gaps[:, agree].min())
        no_graph = decoders.get(variant.removesuffix("-cg") + "-static") if variant.endswith("-cg") else None
        if no_graph is not None:
            rows[-1]["agree_no_graph"] = agreement(decoder.tokens, no_graph.tokens)
        print(f"{variant}: prefill {prefill * 1e3:.2f} ms, decode {decode * 1e3:.3f} ms/token, {args.batch / decode:.1f} tok/s, "
              f"{agree}/{args.steps} tokens equal eager fp32's", flush=True)
    record = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": device_name, "onnxruntime": ort.__version__,
        "command": " ".join(["python", "benchmarks/llm_genai_compare.py", *(argv if argv is not None else sys.argv[1:])]),
        "args": {k: str(v) for k, v in vars(args).items()}, "config": config.to_dict(), "op_counts": counts, "graphopt": info.get("graphopt"),
        "reference_tokens": reference.tolist(), "results": rows,
    }
    (args.out / f"llm_genai_compare-{tag}.json").write_text(json.dumps(record, indent=1, default=str))
    print(f"\n{device_name}, onnxruntime {ort.__version__}, {tag}, batch {args.batch}, prompt {args.prompt}, {args.steps} greedy steps")
    print(f"{'variant':<20}{'prefill ms':>12}{'ms/token':>10}{'tok/s':>9}{'= eager':>9}{'= no graph':>12}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:<20}  error: {r['error'][:200]}")
        else:
            same = f"{r['agree_no_graph']:>8}/{args.steps}" if "agree_no_graph" in r else ""
            print(f"{r['variant']:<20}{r['prefill_ms']:>12.2f}{r['decode_ms']:>10.3f}{r['tok_s']:>9.1f}{r['agree']:>6}/{args.steps}{same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
