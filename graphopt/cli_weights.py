"""The `--weights` options of `graphopt optimize`: their help, and their check into OptimizeOptions
fields (one `error:` line for a bad value). Light to import: the pass itself loads only when asked."""

from __future__ import annotations

from typing import Any

from graphopt.errors import GraphoptError

__all__ = ["WEIGHTS_HELP", "check_weight_options"]

WEIGHTS_HELP = {
    "weights": "Weight-only quantization of MatMul/Gemm layers with constant 2-D weights (com.microsoft.MatMulNBits on ort-cpu/"
    "ort-cuda, DequantizeLinear on onnx); the LM head and layers under their SNR budget stay as they are (docs/weights.md).",
    "block_size": "With --weights: consecutive K values sharing one scale (16, 32, 64, 128 or 256).",
    "keep": "With --weights: also keep this node, weight or output name, or op type (globs; repeatable); "
    "'none' clears the default block list (the LM head).",
    "min_snr": "With --weights: the least output SNR (dB) a layer keeps to be quantized (default int8 35, int4 20).",
    "symmetric": "With --weights: without zero points, or with (default: with for int4, without for int8).",
    "accuracy_level": "With --weights: MatMulNBits' accuracy_level, the lowest type its kernel may compute in (0 unset, 1 fp32, "
    "2 fp16, 3 bf16, 4 int8 activations); default 4 on ort-cpu, 0 on ort-cuda.",
}


def check_weight_options(weights: str | None, block_size: str, keep: list[str], min_snr: str | None, symmetric: bool | None,
                         accuracy_level: str | None = None) -> dict[str, Any]:
    """OptimizeOptions' weight fields from --weights and its companions; a GraphoptError for a bad value."""
    if weights is None:
        if keep or min_snr is not None or symmetric is not None or block_size != "32" or accuracy_level is not None:
            raise GraphoptError("--block-size, --weights-keep, --weights-min-snr, --weights-(a)symmetric and --weights-accuracy-level "
                                "only apply with --weights int4 or int8")
        return {}
    from graphopt.passes.weight_quant import WeightQuantPlan

    try:
        size = int(block_size)
    except ValueError:
        raise GraphoptError(f"--block-size {block_size}: expected an integer such as 32, 64 or 128") from None
    try:
        snr = float(min_snr) if min_snr is not None else None
    except ValueError:
        raise GraphoptError(f"--weights-min-snr {min_snr}: expected a number of dB such as 20") from None
    level = None
    if accuracy_level is not None:
        if not accuracy_level.isdigit():
            raise GraphoptError(f"--weights-accuracy-level {accuracy_level}: expected 0 to 4")
        level = int(accuracy_level)
    try:
        WeightQuantPlan.make(weights, size, keep, symmetric, snr, level)  # a bad value fails before any work
    except GraphoptError as error:
        raise GraphoptError(str(error).replace("weights accuracy_level", "--weights-accuracy-level")) from None
    return {"weights": weights.lower(), "block_size": size, "weights_keep": keep, "weights_min_snr": snr, "weights_symmetric": symmetric,
            "weights_accuracy_level": level}
