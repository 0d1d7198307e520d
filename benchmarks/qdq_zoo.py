"""Quantized ONNX models made by onnxruntime.quantization, the way users make them (issue 18 item 3).

    python benchmarks/qdq_zoo.py                 # build what is missing into benchmarks/.qdq_zoo/
    python benchmarks/qdq_zoo.py --force --list  # rebuild everything; print the models

From two float models exported here with torch.onnx.export (random weights, no hub):

* ``resnet18``  a ResNet-18 written out in torch (BasicBlocks, BN folded by the export), 1x3x160x160
* ``bert``      a BERT encoder from a small transformers BertConfig (4 layers, hidden 256), seq 128

the quantized variants onnxruntime.quantization makes:

* ``-qdq-pc``   quantize_static, QuantFormat.QDQ, per-channel weights, int8 activations and weights (S8S8)
* ``-qdq-pt``   quantize_static, QuantFormat.QDQ, per-tensor weights, uint8 activations, int8 weights (U8S8)
* ``-dyn``      quantize_dynamic (DynamicQuantizeLinear + MatMulInteger/ConvInteger, the QOperator form)
* ``bert-int4-qdq``  MatMulNBitsQuantizer in QDQ mode: weight-only int4, DequantizeLinear with block_size 32

and the forms NVIDIA ModelOpt's ONNX quantizers write (ModelOpt is not installed here: built the way
its sources do it, modelopt/onnx/quantization/{int8,fp8,int4,ort_utils}.py):

* ``-mo-int8``  quantize_static with ModelOpt's TensorRT-guided options: float weights followed by
  QuantizeLinear -> DequantizeLinear (AddQDQPairToWeight), symmetric int8 activations, no bias and
  no output quantization, per-channel Conv weights on axis 0
* ``-mo-fp8``   the same converted as ModelOpt's int8_to_fp8 does (scales x 448/127, float8e4m3fn zero
  points), opset 19
* ``bert-mo-int4``  INT4 RTN weight-only: each MatMul weight a blocked DequantizeLinear (opset 21, axis 0,
  block 128, int4, no zero point); ``-awq`` adds AWQ's pre-quant-scale Mul on each activation (seeded
  scales in [0.5, 2] instead of a calibration search, multiplied into the weight's rows before
  quantizing, so the float function is unchanged); ``-t`` a [N, K] weight blocked on axis 1 and a
  Transpose before the MatMul (another exporter's form)

Calibration reads random data (seeded). Each model directory holds ``model.onnx`` and
``inputs.npz`` (the feeds). The cache folder is ignored by git; tests build tiny versions
of the same forms on the fly (tests/qdq_models.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

CACHE_DIR = Path(os.environ.get("GRAPHOPT_QDQ_ZOO_DIR", Path(__file__).resolve().parent / ".qdq_zoo"))
SEED = 18
IMAGE = 160
SEQ = 128
VOCAB = 1024


# ----------------------------------------------------------------------------- float models

def _resnet18() -> tuple[Any, dict[str, np.ndarray]]:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                blocks += [Block(cin, cout, stride), Block(cout, cout, 1)]
                cin = cout
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(512, 1000)

        def forward(self, x: Any) -> Any:
            y = self.blocks(self.stem(x))
            return self.fc(torch.flatten(torch.mean(y, dim=(2, 3), keepdim=True), 1))

    torch.manual_seed(SEED)
    model = ResNet18().eval()
    for m in model.modules():          # running statistics that are not the identity, so folding matters
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    pixels = np.random.default_rng(SEED).standard_normal((1, 3, IMAGE, IMAGE)).astype(np.float32)
    return model, {"pixels": pixels}


def _bert() -> tuple[Any, dict[str, np.ndarray]]:
    import torch
    import transformers

    torch.manual_seed(SEED)
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                  intermediate_size=1024, max_position_embeddings=SEQ)
    inner = transformers.BertModel(cfg).eval()

    class Wrap(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]

    rng = np.random.default_rng(SEED)
    mask = np.ones((1, SEQ), np.int64)
    mask[:, SEQ - SEQ // 8:] = 0
    return Wrap().eval(), {"input_ids": rng.integers(3, VOCAB, (1, SEQ)).astype(np.int64), "attention_mask": mask}


FLOAT_MODELS: dict[str, Callable[[], tuple[Any, dict[str, np.ndarray]]]] = {"resnet18": _resnet18, "bert": _bert}


def export_float(name: str, out: Path) -> dict[str, np.ndarray]:
    """Export float model ``name`` to ``out`` (TorchScript exporter, opset 17); returns its feeds."""
    import torch

    module, feeds = FLOAT_MODELS[name]()
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    torch.onnx.export(module, args, str(out), dynamo=False, opset_version=17, input_names=list(feeds), output_names=["output"])
    return feeds


# ----------------------------------------------------------------------------- quantizers

class RandomReader:
    """A CalibrationDataReader of seeded random feeds shaped like ``feeds``."""

    def __init__(self, feeds: dict[str, np.ndarray], count: int = 8) -> None:
        rng = np.random.default_rng(SEED + 1)
        self._batches = iter([{k: _like(v, rng) for k, v in feeds.items()} for _ in range(count)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)


def _like(value: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if value.dtype.kind == "f":
        return rng.standard_normal(value.shape).astype(value.dtype)
    if value.max() <= 1:                           # a mask: keep it as it was
        return value.copy()
    return rng.integers(3, int(value.max()) + 1, value.shape).astype(value.dtype)


def quantize_static_qdq(src: Path, dst: Path, feeds: dict[str, np.ndarray], per_channel: bool, activation_int8: bool) -> None:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    quantize_static(str(src), str(dst), RandomReader(feeds), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                    activation_type=QuantType.QInt8 if activation_int8 else QuantType.QUInt8, weight_type=QuantType.QInt8)


def quantize_dynamic_int8(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)


def quantize_int4_qdq(src: Path, dst: Path, block_size: int = 32) -> None:
    """Weight-only int4 in QDQ form: DequantizeLinear(int4 weight, scales, block_size) -> MatMul, opset 21."""
    import onnx
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=True, quant_format=QuantFormat.QDQ,
                                          op_types_to_quantize=("MatMul",))
    quantizer = MatMulNBitsQuantizer(onnx.load(str(src)), algo_config=config)
    quantizer.process()
    quantizer.model.save_model_to_file(str(dst), use_external_data_format=False)


#: ModelOpt's extra options for quantize_static (modelopt/onnx/quantization/ort_utils.py configure_ort, int8.py)
MODELOPT_INT8_OPTIONS = {
    "QuantizeBias": False, "ActivationSymmetric": True, "AddQDQPairToWeight": True, "DedicatedQDQPair": False,
    "QDQOpTypePerChannelSupportToAxis": {"Conv": 0, "ConvTranspose": 1}, "ForceQuantizeNoInputCheck": True,
    "QDQDisableWeightAdjustForInt32Bias": True,
}
#: ModelOpt's int8 op types (its default list, less BatchNormalization/ConvTranspose/Clip the exports lack)
MODELOPT_INT8_OPS = ["Add", "AveragePool", "Conv", "Gemm", "GlobalAveragePool", "MatMul", "MaxPool", "Mul"]


def quantize_modelopt_int8(src: Path, dst: Path, feeds: dict[str, np.ndarray]) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    options = dict(MODELOPT_INT8_OPTIONS, OpTypesToExcludeOutputQuantization=list(MODELOPT_INT8_OPS))
    quantize_static(str(src), str(dst), RandomReader(feeds), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, op_types_to_quantize=MODELOPT_INT8_OPS,
                    calibrate_method=CalibrationMethod.MinMax, extra_options=options)


def quantize_modelopt_fp8(src: Path, dst: Path, feeds: dict[str, np.ndarray]) -> None:
    """ModelOpt's fp8 path: its int8 model, then int8_to_fp8 (scales x 448/127, float8e4m3fn zero points), opset 19."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper, version_converter

    quantize_modelopt_int8(src, dst, feeds)
    model = version_converter.convert_version(onnx.load(str(dst)), 19)
    inits = {i.name: i for i in model.graph.initializer}
    done: set[str] = set()
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 2:
            scale, zero = node.input[1], node.input[2]
            if scale not in done:
                array = numpy_helper.to_array(inits[scale])
                inits[scale].CopyFrom(numpy_helper.from_array((array * 448.0 / 127.0).astype(array.dtype), scale))
            if zero not in done:
                dims = list(inits[zero].dims)
                inits[zero].CopyFrom(helper.make_tensor(zero, TensorProto.FLOAT8E4M3FN, dims, bytes(int(np.prod(dims)) if dims else 1), raw=True))
            done |= {scale, zero}
    del model.graph.value_info[:]  # the int8 types the quantizer recorded
    onnx.save(model, str(dst))


def quantize_modelopt_int4(src: Path, dst: Path, variant: str = "plain", block_size: int = 128) -> None:
    """ModelOpt's INT4 RTN form on every MatMul with a constant 2-D weight [K, N] (K a multiple of the block)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper, version_converter

    from graphopt.quant.blockwise import quantize

    model = version_converter.convert_version(onnx.load(str(src)), 21)
    model.ir_version = 10
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    rng = np.random.default_rng(SEED)
    nodes = []
    for node in graph.node:
        w = numpy_helper.to_array(inits[node.input[1]]) if node.op_type == "MatMul" and node.input[1] in inits else None
        if w is None or w.ndim != 2 or w.dtype != np.float32 or w.shape[0] % block_size:
            nodes.append(node)
            continue
        name = node.input[1]
        if variant == "awq":  # x @ w == (x / s) @ (s[:, None] * w): the pre-quant scale, the weight scaled before quantizing
            s = rng.uniform(0.5, 2.0, w.shape[0]).astype(np.float32)
            w = w * s[:, None]
            graph.initializer.append(numpy_helper.from_array((1.0 / s).reshape(1, -1), f"{name}_pre_quant_scale"))
            nodes.append(helper.make_node("Mul", [node.input[0], f"{name}_pre_quant_scale"], [f"{name}_pqs_out"], name=f"{name}_pqs_mul"))
            node.input[0] = f"{name}_pqs_out"
        q = quantize(w, 4, block_size, symmetric=True)
        signed = (q.q.astype(np.int32) - 8).reshape(q.n, -1).T          # [K, N], int4 values
        scales = q.scales.T                                             # [K / block, N]
        transposed = variant == "t"
        if transposed:
            signed, scales = signed.T, scales.T
        graph.initializer.append(helper.make_tensor(f"{name}_int4", TensorProto.INT4, signed.shape, signed.flatten().tolist()))
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(scales), f"{name}_scale"))
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_int4", f"{name}_scale"], [f"{name}_dq"], axis=1 if transposed else 0,
                                      block_size=block_size, name=f"{name}_DequantizeLinear"))
        if transposed:
            nodes.append(helper.make_node("Transpose", [f"{name}_dq"], [f"{name}_dq_t"], perm=[1, 0], name=f"{name}_Transpose"))
        node.input[1] = f"{name}_dq_t" if transposed else f"{name}_dq"
        graph.initializer.remove(inits[name])
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, str(dst))


#: name -> (float model, how to quantize it)
QUANTIZED: dict[str, tuple[str, Callable[[Path, Path, dict[str, np.ndarray]], None]]] = {
    "resnet18-qdq-pc": ("resnet18", lambda s, d, f: quantize_static_qdq(s, d, f, per_channel=True, activation_int8=True)),
    "resnet18-qdq-pt": ("resnet18", lambda s, d, f: quantize_static_qdq(s, d, f, per_channel=False, activation_int8=False)),
    "resnet18-dyn": ("resnet18", lambda s, d, f: quantize_dynamic_int8(s, d)),
    "bert-qdq-pc": ("bert", lambda s, d, f: quantize_static_qdq(s, d, f, per_channel=True, activation_int8=True)),
    "bert-qdq-pt": ("bert", lambda s, d, f: quantize_static_qdq(s, d, f, per_channel=False, activation_int8=False)),
    "bert-dyn": ("bert", lambda s, d, f: quantize_dynamic_int8(s, d)),
    "bert-int4-qdq": ("bert", lambda s, d, f: quantize_int4_qdq(s, d)),
    "resnet18-mo-int8": ("resnet18", quantize_modelopt_int8),
    "resnet18-mo-fp8": ("resnet18", quantize_modelopt_fp8),
    "bert-mo-int8": ("bert", quantize_modelopt_int8),
    "bert-mo-fp8": ("bert", quantize_modelopt_fp8),
    "bert-mo-int4": ("bert", lambda s, d, f: quantize_modelopt_int4(s, d)),
    "bert-mo-int4-awq": ("bert", lambda s, d, f: quantize_modelopt_int4(s, d, "awq")),
    "bert-mo-int4-t": ("bert", lambda s, d, f: quantize_modelopt_int4(s, d, "t")),
}


def build(names: list[str] | None = None, force: bool = False, cache: Path = CACHE_DIR) -> list[Path]:
    """Build the quantized models ``names`` (all by default) into ``cache``; returns their directories."""
    built = []
    exported: set[str] = set()
    for name in names or list(QUANTIZED):
        if name not in QUANTIZED:
            print(f"error: no QDQ zoo model {name!r} (known: {', '.join(QUANTIZED)})", file=sys.stderr)
            raise SystemExit(2)
        base, quantize = QUANTIZED[name]
        float_dir = cache / base
        out_dir = cache / name
        if force or not (out_dir / "model.onnx").exists():
            # the float model only where a quantized one is made (a carried cache may hold only those)
            if base not in exported and (force or not (float_dir / "model.onnx").exists()):
                float_dir.mkdir(parents=True, exist_ok=True)
                np.savez(float_dir / "inputs.npz", **export_float(base, float_dir / "model.onnx"))
                exported.add(base)
            out_dir.mkdir(parents=True, exist_ok=True)
            with np.load(float_dir / "inputs.npz") as data:
                feeds = {k: data[k] for k in data.files}
            quantize(float_dir / "model.onnx", out_dir / "model.onnx", feeds)
            np.savez(out_dir / "inputs.npz", **feeds)
            (out_dir / "meta.json").write_text(json.dumps({"name": name, "float_model": base}) + "\n")
        built.append(out_dir)
    return built


def load_feeds(model_dir: Path) -> dict[str, np.ndarray]:
    with np.load(model_dir / "inputs.npz") as data:
        return {k: data[k] for k in data.files}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--force", action="store_true", help="rebuild even what is cached")
    parser.add_argument("--list", action="store_true", help="print each model's op counts")
    args = parser.parse_args(argv)
    dirs = build(args.models.split(",") if args.models else None, force=args.force)
    if args.list:
        import collections

        import onnx

        for d in dirs:
            ops = collections.Counter(n.op_type for n in onnx.load(str(d / "model.onnx")).graph.node)
            print(d.name, dict(ops.most_common(8)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
