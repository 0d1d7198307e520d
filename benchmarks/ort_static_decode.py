"""Greedy decode in plain onnxruntime with every buffer bound once (static shapes), optionally replayed
as the CUDA provider's CUDA graph (issue 17, ORT path; llm_genai_compare.py's -static and -cg variants).

The contract, as onnxruntime-genai runs a GroupQueryAttention model under CUDA graphs
(src/models/position_inputs.cpp, kv_cache.cpp, model.cpp):
- past and present of each layer are one [batch, kv_heads, max_length, head] device buffer
  (GroupQueryAttention's past_present_share_buffer: it writes the new token in place);
- attention_mask is one [batch, max_length] device buffer, ones over the valid tokens, zeros after,
  updated in place each step: the model reads seqlens_k = its row sum - 1 on the device, and
  total_sequence_length (a CPU input of GroupQueryAttention) = its length = max_length, the same
  every step; with one new token GroupQueryAttention takes the past length from seqlens_k
  (contrib_ops/cuda/bert/group_query_attention.cc: "past_seq_lens = seqlens_k" on the decode path,
  total_sequence_length only sizes the present and the split heuristic), and a rotary cache of >=
  total_sequence_length rows is indexed by the absolute position;
- input_ids [batch, 1], the logits [batch, 1, vocab] and the greedy token [batch, 1] (an ArgMax
  added to the model: `with_next_token`) are fixed device buffers too, so no address changes
  between runs; the token is read back (8 bytes a row) and written into input_ids for the next step.
The prefill runs outside the graph (RunOptions gpu_graph_id -1, its own binding: a prompt-length
mask, so total = the prompt and GroupQueryAttention takes it as a first prompt); each decode step
runs with gpu_graph_id 1: the first run captures (onnxruntime runs the step again until captured:
the same inputs write the same KV rows, so the repeats change nothing), later runs replay.
The -static variants run the same bindings as ordinary runs (the comparison that isolates the graph).
Where onnxruntime refuses capture (a CPU-placed node feeding a CUDA one through a Memcpy), the -cg
variant's error row names the CPU-placed nodes and the copies from the provider's VERBOSE log.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

NEXT_TOKEN = "next_token"
DECODE_GRAPH_ID = "1"
NO_GRAPH_ID = "-1"  # onnxruntime's kCudaGraphAnnotationSkip: run without capture or replay
NUMPY_OF_ONNX = {"tensor(float16)": np.float16, "tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def with_next_token(path: Path) -> Path:
    """A copy of the model's graph with one more output, next_token [batch, 1] int64: the ArgMax of
    the last position's logits (greedy on the device). Written next to the model and sharing its
    external data file (the initializers are not loaded, their references stay)."""
    import onnx
    from onnx import TensorProto, helper

    target = path.with_name(f"{path.stem}-next-token.onnx")
    if target.exists() and target.stat().st_mtime >= path.stat().st_mtime:
        return target
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    if NEXT_TOKEN in {o.name for o in graph.output}:
        return path
    if "logits" not in {o.name for o in graph.output}:
        raise ValueError(f"{path} has no logits output")
    graph.initializer.extend([
        helper.make_tensor("next_token_start", TensorProto.INT64, [1], [-1]),
        helper.make_tensor("next_token_end", TensorProto.INT64, [1], [np.iinfo(np.int64).max]),
        helper.make_tensor("next_token_axis", TensorProto.INT64, [1], [1]),
    ])
    graph.node.extend([
        helper.make_node("Slice", ["logits", "next_token_start", "next_token_end", "next_token_axis"], ["next_token_last_logits"],
                         name="next_token_last"),
        helper.make_node("ArgMax", ["next_token_last_logits"], [NEXT_TOKEN], name="next_token_argmax", axis=-1, keepdims=0),
    ])
    graph.output.append(helper.make_tensor_value_info(NEXT_TOKEN, TensorProto.INT64, ["batch_size", 1]))
    onnx.save(model, str(target))
    return target


_PLACEMENT_LOG = """
import onnxruntime as ort, sys
ort.preload_dlls() if hasattr(ort, "preload_dlls") else None
ort.set_default_logger_severity(0)
options = ort.SessionOptions(); options.log_severity_level = 0; options.log_verbosity_level = 0
ort.InferenceSession(sys.argv[1], options, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
"""


def placement_summary(model: Path) -> str:
    """The CUDA provider's session log (VERBOSE) of the model without graphs, boiled down: the nodes
    it placed on the CPU provider, the copies it added between the two ("Add MemcpyFromHost after X":
    what refuses a CUDA graph) and the ops it has no CUDA kernel for."""
    try:
        run = subprocess.run([sys.executable, "-c", _PLACEMENT_LOG, str(model)], capture_output=True, text=True, timeout=90, check=False)
    except subprocess.TimeoutExpired:
        return "the placement log took over 90 s"
    return summarize_placement_log(run.stdout + run.stderr)


def summarize_placement_log(log: str) -> str:
    """placement_summary's reading of onnxruntime's session log."""
    cpu_nodes, copies, no_kernel, on_cpu = [], [], [], False
    for line in log.splitlines():
        text = re.sub(r"^.*?\] ", "", line).strip()
        if "Add Memcpy" in text or "Memcpy nodes are added" in text:
            copies.append(text[:160])
        elif "kernel not found in registries" in text:
            no_kernel.append(text[:160])
        header = re.search(r"(Node\(s\)|All nodes) placed on \[(\w+)\]", text)
        if header:
            on_cpu = header.group(2) == "CPUExecutionProvider" and header.group(1) != "All nodes"
        elif on_cpu and "VerifyEachNodeIsAssignedToAnEp" in line:
            cpu_nodes.append(text)
    return (f"CPU-placed nodes ({len(cpu_nodes)}): {', '.join(cpu_nodes[:20])}; copies: {' | '.join(copies[:8]) or 'none'}; "
            f"no CUDA kernel: {' | '.join(no_kernel[:4]) or 'none'}")


class StaticDecoder:
    """One session decoding greedily over fixed buffers (see the module's docstring); cuda_graph: the
    CUDA provider's enable_cuda_graph, decode steps captured once and replayed."""

    def __init__(self, path: Path, device: str, threads: int, max_length: int, kv_heads: int, head: int,
                 cuda_graph: bool = False) -> None:
        import onnxruntime as ort

        if cuda_graph and device != "cuda":
            raise ValueError("CUDA graphs need --device cuda")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        if device == "cuda":
            providers: list[Any] = [("CUDAExecutionProvider", {"enable_cuda_graph": "1" if cuda_graph else "0"}), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        model = with_next_token(path)
        try:
            self.session = ort.InferenceSession(str(model), options, providers=providers)
        except Exception as error:
            if not cuda_graph:
                raise
            # onnxruntime refuses graph capture where a CPU-placed node feeds a CUDA one (a Memcpy):
            # say which (this variant's error row)
            raise RuntimeError(f"{str(error).strip().splitlines()[0][:160]}; {placement_summary(model)}") from error
        self.ort, self.device, self.cuda_graph, self.max_length = ort, device, cuda_graph, max_length
        self.kv_heads, self.head = kv_heads, head
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.outputs = {o.name: o for o in self.session.get_outputs()}
        if "attention_mask" not in self.inputs:
            raise ValueError("static decoding reads the past length from an attention_mask input; the model has none")
        pasts = [n for n in self.inputs if n.startswith("past")]
        self.pairs = [(p, p.replace("past_key_values", "present").replace("past_", "present_")) for p in pasts]
        unknown = [n for n in self.inputs if n not in ("input_ids", "attention_mask", *pasts)]
        missing = [q for _, q in self.pairs if q not in self.outputs]
        if unknown or missing:
            raise ValueError(f"inputs this decoder does not feed: {unknown}; no present output for {missing}")
        self.float_type = NUMPY_OF_ONNX[self.inputs[pasts[0]].type]
        self.mask_type = NUMPY_OF_ONNX[self.inputs["attention_mask"].type]
        self.logits_type = NUMPY_OF_ONNX[self.outputs["logits"].type]
        self.batch = 0

    def _device_value(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, self.device, 0)

    def _allocate(self, batch: int) -> None:
        """The fixed buffers of one batch size and the decode step's binding, bound once."""
        self.batch = batch
        # zeros, not uninitialized memory: the CPU kernel's prompt run reads the whole buffer (a NaN there
        # spoils it); one array each (on the CPU an OrtValue wraps the array's memory)
        shape = (batch, self.kv_heads, self.max_length, self.head)
        self.cache = {p: self.ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, self.float_type), self.device, 0) for p, _ in self.pairs}
        self.ids = self._device_value((batch, 1), np.int64)
        self.mask = self._device_value((batch, self.max_length), self.mask_type)
        self.logits = self._device_value((batch, 1, int(self.outputs["logits"].shape[-1])), self.logits_type)
        self.token = self._device_value((batch, 1), np.int64)
        self.step_binding = self._bind(self.ids, self.mask, {NEXT_TOKEN: self.token, "logits": self.logits})
        self.step_options = self.ort.RunOptions()
        self.step_options.add_run_config_entry("gpu_graph_id", DECODE_GRAPH_ID)
        self.prefill_options = self.ort.RunOptions()
        self.prefill_options.add_run_config_entry("gpu_graph_id", NO_GRAPH_ID)

    def _bind(self, ids: Any, mask: Any, outputs: dict[str, Any]) -> Any:
        binding = self.session.io_binding()
        binding.bind_ortvalue_input("input_ids", ids)
        binding.bind_ortvalue_input("attention_mask", mask)
        for past, present in self.pairs:  # past and present: the same buffer (written in place)
            binding.bind_ortvalue_input(past, self.cache[past])
            outputs = {**outputs, present: self.cache[past]}
        for name in self.outputs:  # in the session's order
            if name in outputs:
                binding.bind_ortvalue_output(name, outputs[name])
            else:
                binding.bind_output(name, self.device)
        return binding

    def prefill(self, prompt: np.ndarray) -> np.ndarray:
        """The prompt through the model outside the graph (its own binding, shapes of the prompt);
        the KV buffers get its rows; returns the first greedy token [batch]."""
        batch, length = prompt.shape
        binding = self._bind(self.ort.OrtValue.ortvalue_from_numpy(prompt.astype(np.int64), self.device, 0),
                             self.ort.OrtValue.ortvalue_from_numpy(np.ones((batch, length), self.mask_type), self.device, 0),
                             {NEXT_TOKEN: self.token})
        self.session.run_with_iobinding(binding, self.prefill_options)
        return self.token.numpy()[:, 0].copy()  # on the CPU numpy() is a view of the buffer the next run overwrites

    def step(self, token: np.ndarray, total: int) -> np.ndarray:
        """One decode step: `token` [batch] at position total - 1 (total valid tokens after it);
        returns the next greedy token [batch]. Only buffer contents change, never addresses."""
        self.ids.update_inplace(token.astype(np.int64)[:, None])
        self.mask_host[:, total - 1] = 1
        self.mask.update_inplace(self.mask_host)
        self.session.run_with_iobinding(self.step_binding, self.step_options)
        return self.token.numpy()[:, 0].copy()  # on the CPU numpy() is a view of the buffer the next run overwrites

    def run(self, prompt: np.ndarray, steps: int, forced: np.ndarray | None = None) -> Iterator[float]:
        """Llm_genai_compare.Decoder.run's protocol: prefill, then `steps` greedy steps; yields each
        run's seconds (the prefill's first); the tokens [batch, steps] in self.tokens afterwards."""
        batch, length = prompt.shape
        if length + steps > self.max_length:
            raise ValueError(f"prompt {length} + {steps} steps exceed the buffers' {self.max_length} positions")
        if batch != self.batch:
            if self.cuda_graph and self.batch:  # the captured graph keeps the first buffers' addresses
                raise ValueError(f"one batch size a session under CUDA graphs: captured at {self.batch}, not {batch}")
            self._allocate(batch)
        self.mask_host = np.zeros((batch, self.max_length), self.mask_type)
        self.mask_host[:, :length] = 1
        start = time.perf_counter()
        token = self.prefill(prompt)
        yield time.perf_counter() - start
        tokens = [token]
        for step in range(1, steps + 1):  # Decoder.run's steps + 1 runs: the last one's token unused
            fed = tokens[-1] if forced is None else forced[:, step - 1]
            start = time.perf_counter()
            token = self.step(fed, length + step)
            yield time.perf_counter() - start
            if step < steps:
                tokens.append(token)
        self.tokens = np.stack(tokens, 1)
