"""Large models in bounded memory: optimize a synthetic decoder with GBs of external weights.

    python benchmarks/large_model.py                       # 2.8 GB of weights (hidden 2048, 14 layers), both targets
    python benchmarks/large_model.py --hidden 1024 --layers 6 --targets onnx   # the 300 MB CI size
    python benchmarks/large_model.py --keep DIR            # keep the model files in DIR (default: a temporary folder)

The model is built directly with onnx.helper: per layer, a written-out LayerNorm
(ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add), multi-head self-attention
(q/k/v MatMul+Add projections, Reshape/Transpose to heads, Softmax(q k^T * scale) v,
output projection) and an Erf-GELU MLP, with residual Adds. Every weight matrix lives
in one external data file, made fast: the file is preallocated (posix_fallocate, which
reads as zeros) and each tensor gets only a short random prefix (written with pwrite),
so no two tensors are equal (deduplication would otherwise merge them) without writing
gigabytes.

`graphopt optimize` runs in a child process. Its peak resident memory is the kernel's
own high-water mark (ru_maxrss, as `/usr/bin/time -v` prints it: "Maximum resident
set size"); /proc/PID/status is also sampled every 10 ms for the
anonymous part (RssAnon: memory the process allocated, e.g. copies of weights) and
the file-backed part (RssFile: pages of memory-mapped files, which the kernel can drop
at any time). Weights that are memory-mapped, not copied, show up as a small RssAnon.

Results are printed as JSON and, with --record, written to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["DecoderSpec", "RunMeasurement", "build_decoder", "measure_optimize", "weight_bytes"]

REPO = Path(__file__).resolve().parent.parent
F = TensorProto.FLOAT
#: Floats of random values at the start of each external tensor (the rest reads as zeros).
PREFIX_FLOATS = 4096
TIME = "/usr/bin/time"


@dataclass(frozen=True)
class DecoderSpec:
    hidden: int = 2048
    layers: int = 14
    heads: int = 16
    mlp_ratio: int = 4
    opset: int = 17
    seed: int = 0

    @property
    def matrix_bytes_per_layer(self) -> int:
        d = self.hidden
        return 4 * (4 * d * d + 2 * self.mlp_ratio * d * d)


def weight_bytes(spec: DecoderSpec) -> int:
    """Bytes of external weights `build_decoder` writes (the matrices; vectors stay inline)."""
    return spec.layers * spec.matrix_bytes_per_layer


class _ExternalWriter:
    """Lays tensors out in one preallocated data file; only a random prefix of each is written."""

    def __init__(self, path: Path, total: int, rng: np.random.Generator, full: bool) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.posix_fallocate(self.fd, 0, total)
        self.offset = 0
        self.rng = rng
        self.full = full

    def tensor(self, name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        count = math.prod(shape)
        written = 0
        while written < (count if self.full else min(count, PREFIX_FLOATS)):
            chunk = min(count - written, 1 << 23)  # 32 MB of float32 at a time
            values = (self.rng.random(chunk, dtype=np.float32) - 0.5) * 0.04
            os.pwrite(self.fd, values.astype("<f4").tobytes(), self.offset + written * 4)
            written += chunk
        tensor = onnx.TensorProto(name=name, data_type=F, dims=shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(self.offset)), ("length", str(count * 4))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.offset += count * 4
        return tensor

    def close(self) -> None:
        os.close(self.fd)


def build_decoder(folder: str | os.PathLike[str], spec: DecoderSpec = DecoderSpec(), *, full: bool = False) -> Path:
    """Write `model.onnx` and `model.onnx.data` into `folder`; returns the model path.

    `full`: write random values into every weight byte (slower, gigabytes of writes)
    instead of a random prefix per tensor."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    d, heads, ffn = spec.hidden, spec.heads, spec.hidden * spec.mlp_ratio
    head_size = d // heads
    writer = _ExternalWriter(folder / "model.onnx.data", weight_bytes(spec), rng, full)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
        numpy_helper.from_array(np.array(1 / math.sqrt(head_size), np.float32), "scale"),
        numpy_helper.from_array(np.array(math.sqrt(2.0), np.float32), "sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        numpy_helper.from_array(np.array([0, 0, heads, head_size], np.int64), "to_heads"),
        numpy_helper.from_array(np.array([0, 0, d], np.int64), "to_hidden"),
    ]

    def vector(name: str, size: int, base: float = 0.0) -> str:
        inits.append(numpy_helper.from_array((base + 0.02 * rng.standard_normal(size)).astype(np.float32), name))
        return name

    def node(op: str, inputs: list[str], output: str, **attrs: object) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=f"{output}_node", **attrs))
        return output

    def layer_norm(x: str, p: str) -> str:
        mean = node("ReduceMean", [x], f"{p}_mean", axes=[-1])
        diff = node("Sub", [x, mean], f"{p}_diff")
        var = node("ReduceMean", [node("Pow", [diff, "two"], f"{p}_sq")], f"{p}_var", axes=[-1])
        std = node("Sqrt", [node("Add", [var, "eps"], f"{p}_vare")], f"{p}_std")
        norm = node("Div", [diff, std], f"{p}_norm")
        scaled = node("Mul", [norm, vector(f"{p}_gamma", d, 1.0)], f"{p}_scaled")
        return node("Add", [scaled, vector(f"{p}_beta", d)], f"{p}_out")

    def linear(x: str, p: str, rows: int, cols: int) -> str:
        inits.append(writer.tensor(f"{p}_w", (rows, cols)))
        return node("Add", [node("MatMul", [x, f"{p}_w"], f"{p}_mm"), vector(f"{p}_b", cols)], f"{p}_out")

    x = "x"
    for i in range(spec.layers):
        p = f"l{i}"
        h = layer_norm(x, f"{p}_ln1")
        q = node("Transpose", [node("Reshape", [linear(h, f"{p}_q", d, d), "to_heads"], f"{p}_q4")], f"{p}_qh", perm=[0, 2, 1, 3])
        k = node("Transpose", [node("Reshape", [linear(h, f"{p}_k", d, d), "to_heads"], f"{p}_k4")], f"{p}_kt", perm=[0, 2, 3, 1])
        v = node("Transpose", [node("Reshape", [linear(h, f"{p}_v", d, d), "to_heads"], f"{p}_v4")], f"{p}_vh", perm=[0, 2, 1, 3])
        scores = node("Mul", [node("MatMul", [q, k], f"{p}_qk"), "scale"], f"{p}_scores")
        ctx = node("MatMul", [node("Softmax", [scores], f"{p}_probs", axis=-1), v], f"{p}_ctx")
        ctx = node("Reshape", [node("Transpose", [ctx], f"{p}_ctxt", perm=[0, 2, 1, 3]), "to_hidden"], f"{p}_ctx3")
        x = node("Add", [x, linear(ctx, f"{p}_o", d, d)], f"{p}_res1")
        h = layer_norm(x, f"{p}_ln2")
        up = linear(h, f"{p}_up", d, ffn)
        erf = node("Erf", [node("Div", [up, "sqrt2"], f"{p}_scaled_up")], f"{p}_erf")
        gelu = node("Mul", [node("Mul", [up, node("Add", [erf, "one"], f"{p}_erf1")], f"{p}_g1"), "half"], f"{p}_gelu")
        x = node("Add", [x, linear(gelu, f"{p}_down", ffn, d)], f"{p}_res2")
    nodes.append(helper.make_node("Identity", [layer_norm(x, "final_ln")], ["y"], name="y_node"))
    writer.close()
    graph = helper.make_graph(
        nodes,
        "decoder",
        [helper.make_tensor_value_info("x", F, ["batch", "seq", d])],
        [helper.make_tensor_value_info("y", F, ["batch", "seq", d])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", spec.opset)], ir_version=8, producer_name="graphopt-large-model")
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())  # small: the matrices are references into model.onnx.data
    return path


# --------------------------------------------------------------------------- measuring


@dataclass
class RunMeasurement:
    returncode: int
    wall_s: float
    max_rss_bytes: int  #: the kernel's high-water mark of the child (what /usr/bin/time -v reports)
    peak_rss_anon_bytes: int  #: sampled: memory the child allocated itself
    peak_rss_file_bytes: int  #: sampled: pages of files it had mapped (the weights, when mapped)
    samples: int
    stderr: str = ""
    command: list[str] = field(default_factory=list)


def _status_kib(pid: int) -> dict[str, int]:
    values = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    values[key] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return values


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as file:
            return [int(c) for c in file.read().split()]
    except (OSError, ValueError):
        return []


def measure_optimize(model: str | os.PathLike[str], output: str | os.PathLike[str], *extra: str, timeout: float = 1800) -> RunMeasurement:
    """Run `python -m graphopt optimize MODEL -o OUTPUT -q EXTRA...` under `/usr/bin/time -v`
    and measure its memory.

    Why /usr/bin/time rather than our own wait4: Linux folds the RSS high-water mark of
    the process that execs into the new program's ru_maxrss, so a child started straight
    from this (possibly large) process would report at least our own peak."""
    if not os.access(TIME, os.X_OK):
        raise FileNotFoundError(f"{TIME} is needed to measure peak memory (Debian: apt-get install time)")
    with tempfile.NamedTemporaryFile(prefix="graphopt-time-", suffix=".txt", delete=False) as report:
        report_path = Path(report.name)
    command = [sys.executable, "-m", "graphopt", "optimize", str(model), "-o", str(output), "-q", *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.perf_counter()
    timer = subprocess.Popen([TIME, "-v", "-o", str(report_path), *command], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peaks = {"RssAnon": 0, "RssFile": 0}
    counter = [0]
    done = threading.Event()

    def sample() -> None:  # the optimizer is /usr/bin/time's only child
        while not done.is_set():
            for pid in _children(timer.pid):
                values = _status_kib(pid)
                for key in peaks:
                    peaks[key] = max(peaks[key], values.get(key, 0))
            counter[0] += 1
            done.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        _, stderr = timer.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in _children(timer.pid):
            os.kill(pid, 9)
        _, stderr = timer.communicate()
    wall = time.perf_counter() - started
    done.set()
    sampler.join()
    usage = report_path.read_text()
    report_path.unlink()
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", usage)
    if match is None:
        raise RuntimeError(f"{TIME} printed no maximum resident set size:\n{usage}")
    return RunMeasurement(
        returncode=timer.returncode,
        wall_s=wall,
        max_rss_bytes=int(match.group(1)) * 1024,
        peak_rss_anon_bytes=peaks["RssAnon"] * 1024,
        peak_rss_file_bytes=peaks["RssFile"] * 1024,
        samples=counter[0],
        stderr=stderr.decode(errors="replace"),
        command=command,
    )


def _check_output(path: Path) -> dict[str, object]:
    """The output loads, keeps its weights external, and says which fused ops it has."""
    model = onnx.load(str(path), load_external_data=False)
    external = [t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    ops: dict[str, int] = {}
    for n in model.graph.node:
        key = f"{n.domain}.{n.op_type}" if n.domain else n.op_type
        ops[key] = ops.get(key, 0) + 1
    data = path.with_name(path.name + ".data")
    return {
        "model_bytes": path.stat().st_size,
        "data_bytes": data.stat().st_size if data.exists() else 0,
        "external_tensors": len(external),
        "ops": dict(sorted(ops.items())),
    }


def compare_outputs(original: Path, optimized: Path, hidden: int, seq: int = 4) -> float:
    """Run both models in onnxruntime (CPU, its own optimizations off) on one random
    input; the largest absolute difference of their outputs."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    x = np.random.default_rng(1).standard_normal((1, seq, hidden)).astype(np.float32)
    outputs = []
    for path in (original, optimized):
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        outputs.append(session.run(None, {"x": x})[0])
        del session
    return float(np.abs(outputs[0] - outputs[1]).max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=14)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--targets", default="onnx,ort-cpu", help="comma-separated graphopt targets")
    parser.add_argument("--fill", choices=["prefix", "full"], default="full", help="random values in every weight byte, or a prefix per tensor")
    parser.add_argument("--no-numerics", action="store_true", help="skip running both models in onnxruntime")
    parser.add_argument("--keep", type=Path, default=None, help="build (and keep) the model files here")
    parser.add_argument("--record", type=Path, default=None, help="write the results as JSON to this file")
    args = parser.parse_args(argv)
    spec = DecoderSpec(hidden=args.hidden, layers=args.layers, heads=args.heads)
    with tempfile.TemporaryDirectory(prefix="graphopt-large-", dir=args.keep.parent if args.keep else None) as scratch:
        folder = args.keep or Path(scratch) / "in"
        t0 = time.perf_counter()
        model = build_decoder(folder, spec, full=args.fill == "full")
        build_s = time.perf_counter() - t0
        weights = weight_bytes(spec)
        results: dict[str, object] = {
            "date": time.strftime("%Y-%m-%d"),
            "spec": asdict(spec),
            "weight_bytes": weights,
            "fill": args.fill,
            "build_s": round(build_s, 2),
            "machine": f"{os.cpu_count()} cores, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
            "runs": {},
        }
        print(f"built {model} ({weights / 2**30:.2f} GiB of weights) in {build_s:.1f}s", file=sys.stderr)
        for target in args.targets.split(","):
            out = Path(scratch) / f"out-{target}" / "model.opt.onnx"
            out.parent.mkdir(parents=True, exist_ok=True)
            run = measure_optimize(model, out, "--target", target)
            entry: dict[str, object] = {
                "returncode": run.returncode,
                "wall_s": round(run.wall_s, 2),
                "max_rss_bytes": run.max_rss_bytes,
                "peak_rss_anon_bytes": run.peak_rss_anon_bytes,
                "peak_rss_file_bytes": run.peak_rss_file_bytes,
                "peak_ratio": round(run.max_rss_bytes / weights, 3),
                "anon_ratio": round(run.peak_rss_anon_bytes / weights, 3),
                "command": " ".join(run.command[1:]),
            }
            if run.returncode == 0:
                entry["output"] = _check_output(out)
                if not args.no_numerics:
                    entry["max_abs_diff"] = compare_outputs(model, out, spec.hidden)
            else:
                entry["stderr"] = run.stderr[-2000:]
            results["runs"][target] = entry  # type: ignore[index]
            print(f"{target}: {json.dumps(entry)}", file=sys.stderr)
            shutil.rmtree(out.parent)  # free the disk before the next run
    text = json.dumps(results, indent=2)
    print(text)
    if args.record:
        args.record.write_text(text + "\n")
    return 0 if all(r["returncode"] == 0 for r in results["runs"].values()) else 1  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
