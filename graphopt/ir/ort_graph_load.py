"""One onnxruntime load of a model's graph: the session graphopt.ir.runtime_check makes,
and the helper process that makes it in the background (graphopt.ir.runtime_check_worker).

Standard library only: the helper process runs this file as a script, with the parent's
`sys.path`, so that it pays for onnxruntime's import and nothing of graphopt's. The same
function makes the session in either process, so the answer (the error text included)
is the same whichever process makes it.

The helper's protocol, one JSON line each way (binary pipes):
  helper -> parent, once: {"onnxruntime": <its __file__>} after importing it, or
                          {"onnxruntime": null} when the import failed;
  parent -> helper:       {"bytes": N} and N bytes of a serialized model, or {"path": "..."};
  helper -> parent:       {"error": <onnxruntime's words> or null}.
The helper ends when its input ends.
"""

from __future__ import annotations

import json
import sys
from typing import IO, Any

__all__ = ["load_error", "error_text", "serve"]


def error_text(error: BaseException) -> str:
    """An exception's words on one line, without onnxruntime's prefix."""
    return " ".join(str(error).split()).replace("[ONNXRuntimeError] : ", "")


def load_error(ort: Any, model: bytes | str) -> str | None:
    """Why onnxruntime (CPU, optimizations off) refuses the graph (serialized bytes or a path), or None.

    The one error tolerated is a missing kernel (NOT_IMPLEMENTED): it comes after graph
    resolution, and is expected for CUDA-only ops on a CPU-only build."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    # The session only resolves the graph, it never runs: no thread pools (their start
    # was most of the check's time on a small model, ~3 ms of ~4).
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    try:
        ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - onnxruntime's errors have no useful classes
        text = error_text(error)
        if "NOT_IMPLEMENTED" in text:  # graph resolution passed; a kernel is missing (CUDA-only ops)
            return None
        return text
    return None


def _read_exactly(stream: IO[bytes], size: int) -> bytes | None:
    chunks: list[bytes] = []
    while size > 0:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """The helper's loop: import onnxruntime, say which, then answer each request."""

    def reply(message: dict[str, Any]) -> None:
        replies.write(json.dumps(message).encode() + b"\n")
        replies.flush()

    try:
        import onnxruntime as ort
    except Exception:  # noqa: BLE001 - whatever it was, the parent checks in its own process
        reply({"onnxruntime": None})
        return
    reply({"onnxruntime": ort.__file__})
    while True:
        header = requests.readline()
        if not header:
            return
        request = json.loads(header)
        model: bytes | str | None = request["path"] if "path" in request else _read_exactly(requests, int(request["bytes"]))
        if model is None:  # the parent went away mid-request
            return
        reply({"error": load_error(ort, model)})


if __name__ == "__main__":  # the helper process: python -I -S ort_graph_load.py '<sys.path as JSON>'
    sys.path[:] = json.loads(sys.argv[1])
    serve(sys.stdin.buffer, sys.stdout.buffer)
