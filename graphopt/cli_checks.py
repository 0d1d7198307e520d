"""The checks of `graphopt optimize`'s options that need no model (cli.py runs them before any work):
each bad value or combination is a GraphoptError, one `error:` line."""

from __future__ import annotations

from pathlib import Path

from graphopt.errors import GraphoptError


def parse_shapes(values: list[str]) -> dict[str, list[int]]:
    """--input-shape NAME=D1,D2,... values as {name: dims}."""
    if not values:
        return {}
    from graphopt.verify import parse_shape  # onnxruntime comes with it: only when asked

    shapes: dict[str, list[int]] = {}
    for text in values:
        name, dims = parse_shape(text)
        if name in shapes and shapes[name] != dims:
            raise GraphoptError(f"--input-shape {name} is given twice with different shapes")
        shapes[name] = dims
    return shapes


def check_precision_options(precision: str, target: str, keep_fp32: list[str] | None, precision_convs: str, precision_recurrent: str,
                            layout: str, kv_buffer: str, calibration_data: Path | None) -> str | None:
    """The checked precision (None: float32 as it is), or a GraphoptError for a bad option."""
    precision_name = None
    if precision.strip().lower() != "fp32":  # the precision modules are imported only when asked for
        from graphopt.passes.precision_plan import parse_precision
        from graphopt.quant.fp8_onnx import refuse_fp8

        refuse_fp8(precision, target)  # fp8: one line saying what the target lacks

        precision_name = parse_precision(precision)  # so is an unknown precision
    if keep_fp32 and precision_name is None:
        raise GraphoptError("--keep-fp32 only applies with --precision fp16 or bf16")
    for flag, forced in (("--precision-convs", precision_convs), ("--precision-recurrent", precision_recurrent)):
        if forced not in ("auto", "low", "fp32"):
            raise GraphoptError(f"unknown {flag} '{forced}' (known: auto, low, fp32)")
        if forced != "auto" and precision_name is None:
            raise GraphoptError(f"{flag} only applies with --precision fp16 or bf16")
    if layout not in ("auto", "nchw", "nhwc"):
        raise GraphoptError(f"unknown layout '{layout}' (known: auto, nchw, nhwc)")
    if layout != "auto" and target != "ort-cuda":
        raise GraphoptError("--layout only applies with --target ort-cuda")
    if kv_buffer not in ("growing", "shared"):
        raise GraphoptError(f"unknown --kv-buffer '{kv_buffer}' (known: growing, shared)")
    if calibration_data is not None and precision_name != "fp16":
        raise GraphoptError("--calibration-data only applies with --precision fp16")
    if calibration_data is not None and not calibration_data.is_file():
        raise GraphoptError(f"{calibration_data}: no such file")
    return precision_name


def output_path(argument: Path | None, option: Path | None) -> Path:
    """`optimize IN OUT` (onnxsim's form) or `optimize IN -o OUT`; not both, unless they agree."""
    if argument is None and option is None:
        raise GraphoptError("no output: give OUT.onnx after the model, or -o OUT.onnx")
    if argument is not None and option is not None and argument != option:
        raise GraphoptError(f"two outputs given: {argument} and -o {option}")
    return argument if argument is not None else option  # type: ignore[return-value]


def is_html(path: Path) -> bool:
    """Is this report path an HTML page (else JSON)?"""
    return path.suffix.lower() in (".html", ".htm")
