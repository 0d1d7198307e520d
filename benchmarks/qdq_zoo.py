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


#: name -> (float model, how to quantize it)
QUANTIZED: dict[str, tuple[str, Callable[[Path, Path, dict[str, np.ndarray]], None]]] = {
    "resnet18-qdq-pc": ("resnet18", lambda s, d, f: quantize_static_qdq(s, d, f, per_channel=True, activation_int8=True)),
    "resnet18-qdq-pt": ("resnet18", lambda s, d, f: quantize_static_qdq(s, d, f, per_channel=False, activation_int8=False)),
    "resnet18-dyn": ("resnet18", lambda s, d, f: quantize_dynamic_int8(s, d)),
    "bert-qdq-pc": ("bert", lambda s, d, f: quantize_static_qdq(s, d, f, per_channel=True, activation_int8=True)),
    "bert-qdq-pt": ("bert", lambda s, d, f: quantize_static_qdq(s, d, f, per_channel=False, activation_int8=False)),
    "bert-dyn": ("bert", lambda s, d, f: quantize_dynamic_int8(s, d)),
    "bert-int4-qdq": ("bert", lambda s, d, f: quantize_int4_qdq(s, d)),
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
