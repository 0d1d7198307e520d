"""Weight-only int8/int4 quantization of the matmuls whose weight is a frozen constant
(`torch.compile(..., options={"weights": "int4"})`, issue 18).

After lowering and projection packing, each ``aten.mm`` / ``matmul`` / ``addmm`` / ``linear``
whose right operand is a constant 2-D float tensor (a frozen parameter, or its folded
transpose, or q/k/v packed side by side) is quantized round-to-nearest per block of
`block_size` input rows with graphopt.quant.blockwise (the numpy module the ONNX path uses,
MatMulNBits' layout) and replaced by the form measured fastest (fx_weight_quant_forms).

Left in full precision, each named in the report with its reason:
* the block list, `weights_keep` globs matched against the weight's module names
  ("model.layers.0.mlp.down_proj") and the node's name; by default ``*lm_head*`` and
  ``*embed*`` plus the head found by structure: a matmul whose product reaches a graph
  output through views and casts only (the logits: the LM head decides every token, and its
  N, the vocabulary, makes its quantization error the most visible);
* layers under the accuracy budget: SNR (dB) of x @ W against x @ dequant(W), x random
  (fx_weight_quant_forms.quantize_weight), below `weights_min_snr` (35 dB int8, 20 dB int4);
* layers where the unquantized matmul was measured faster than every quantized form (on CUDA
  and on the CPU, each with its own forms: fx_weight_quant_forms), by less than MARGIN.

Embeddings are gathers, not matmuls: this pass never touches them (a tied LM head shares the
embedding's name and is kept by the default list).
"""

from __future__ import annotations

import fnmatch
import operator
from typing import Any

import torch
import torch.fx as fx

from graphopt.passes.fx_pack import _right_matrix
from graphopt.passes.fx_passes import NewConstant, _fake_call, attr_tensor
from graphopt.passes.fx_weight_quant_forms import (
    Candidate,
    dequant_linear,
    fastest,
    form_snr_db,
    int4pack_linear,
    int4pack_weight,
    int8pack_linear,
    int8pack_weight,
    quantize_weight,
    release_timing_buffers,
    unquantized_linear,
)
from graphopt.report.model import Report
from graphopt.report.sections import Alternative, DecisionRecord, WeightLayer, WeightQuantSummary

__all__ = ["quantize_weights", "DEFAULT_KEEP", "DEFAULT_MIN_SNR", "STATE_NAMES", "PARTS"]

aten = torch.ops.aten
prims = torch.ops.prims

DEFAULT_KEEP = ("*lm_head*", "*embed*")
DEFAULT_MIN_SNR = {8: 35.0, 4: 20.0}
#: gm.meta key: {storage address: "module.path.weight"} of the frozen parameters (torch_trace).
STATE_NAMES = "graphopt_state_names"
#: node.meta key on a packed constant: the weights packed into it (fx_pack).
PARTS = "graphopt_parts"
#: Time CUDA's candidates off CUDA (tests, with fx_weight_quant_forms.TIMER replaced); without it the
#: CPU times its own candidates (the packed CPU kernels against the unquantized matmul) and any other
#: device takes the default form untimed.
MEASURE_OFF_CUDA = False
#: A quantized form replaces the unquantized matmul only when timed faster by more than this share
#: (the decisions' noise margin: a tie keeps the model as it came).
MARGIN = 0.03

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
#: Ops a product may pass on its way to an output and still be "the output" (the LM head's logits).
_PASS_THROUGH = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.slice.Tensor, aten.select.int,
                 aten.squeeze.dim, aten.unsqueeze.default, aten.clone.default, aten.alias.default, aten._to_copy.default,
                 prims.convert_element_type.default, aten.split_with_sizes.default, operator.getitem}


def _activation(node: fx.Node) -> str | None:
    """The epilogue of aten._addmm_activation (GemmActivation's lowering): "relu" or "gelu_tanh"
    (its tanh GELU; the rule uses it for GELU on CUDA only)."""
    use_gelu = node.kwargs.get("use_gelu", node.args[5] if len(node.args) > 5 else False)
    return "gelu_tanh" if use_gelu else "relu"


def _site(gm: fx.GraphModule, node: fx.Node) -> tuple[Any, Any, Any, torch.Tensor] | None:
    """(x, the weight's node, bias or None, W as [K, N]) for a matmul with a constant weight."""
    target, args = node.target, node.args
    if node.op != "call_function":
        return None
    if target is aten._addmm_activation.default:
        if len(args) != 3 or set(node.kwargs) - {"use_gelu"}:  # beta and alpha 1
            return None
        target = aten.addmm.default
    elif node.kwargs:
        return None
    if target in (aten.mm.default, aten.matmul.default) and len(args) == 2:
        x, w_node, bias = args[0], args[1], None
        weight = _right_matrix(gm, w_node)
    elif target is aten.addmm.default and len(args) == 3:
        bias, x, w_node = args
        weight = _right_matrix(gm, w_node)
        bias_val = bias.meta.get("val") if isinstance(bias, fx.Node) else None
        if bias_val is None or bias_val.dim() != 1:
            return None
    elif target is aten.linear.default and len(args) in (2, 3):
        x, w_node, bias = args[0], args[1], (args[2] if len(args) == 3 else None)
        w = attr_tensor(gm, str(w_node.target)) if isinstance(w_node, fx.Node) and w_node.op == "get_attr" else None
        weight = w.t() if isinstance(w, torch.Tensor) and w.dim() == 2 else None
    else:
        return None
    x_val = x.meta.get("val") if isinstance(x, fx.Node) else None
    if weight is None or x_val is None or weight.dtype not in _FLOATS or x_val.dtype != weight.dtype or x_val.shape[-1] != weight.shape[0]:
        return None
    return x, w_node, bias, weight


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _module_names(gm: fx.GraphModule, w_node: Any, weight: torch.Tensor) -> list[str]:
    """The module paths the weight came from ("model.layers.0.self_attn.q_proj"), several when packed."""
    names = gm.meta.get(STATE_NAMES, {})
    source = w_node
    if isinstance(source, fx.Node) and source.op == "call_function" and source.args:  # t(W)
        source = source.args[0]
    parts = source.meta.get(PARTS) if isinstance(source, fx.Node) else None
    found = [names.get(_storage(t)) for t in (parts or [weight])]
    return [name.removesuffix(".weight") for name in found if name]


def _feeds_output(node: fx.Node) -> bool:
    """Whether the product reaches a graph output through views and casts only."""
    seen, todo = set(), [node]
    while todo:
        current = todo.pop()
        for user in current.users:
            if user.op == "output":
                return True
            if user not in seen and user.op == "call_function" and user.target in _PASS_THROUGH:
                seen.add(user)
                todo.append(user)
    return False


def _rows(x_val: Any) -> int:
    """The number of rows of x (its size hint where symbolic)."""
    rows = 1
    for d in x_val.shape[:-1]:
        rows *= d if isinstance(d, int) else int(d.node.hint or 1)
    return rows


def _keep_reason(node: fx.Node, names: list[str], keep: list[str] | None) -> tuple[str, str] | None:
    """(the report's reason code, the words) when the block list keeps the matmul: "keep_list" for
    the user's `weights_keep`, "lm_head" for the default list (as on the ONNX path)."""
    code = "lm_head" if keep is None else "keep_list"
    globs = list(DEFAULT_KEEP) if keep is None else keep
    for glob in globs:
        hits = [n for n in [*names, node.name] if fnmatch.fnmatchcase(n, glob)]
        if hits:
            return code, f"in the block list ({hits[0]} matches {glob!r})"
    if keep is None and _feeds_output(node):
        return code, "the model's head (its product is a graph output): in the default block list"
    return None


def _op_name(node: fx.Node) -> str:
    """"mm", "addmm", "linear", ... (the aten op's short name)."""
    return str(getattr(node.target, "__name__", node.target)).split(".")[0]


class _Rewriter:
    def __init__(self, gm: fx.GraphModule, new_constant: NewConstant, fake_mode: Any, opts: Any, report: Report,
                 autotune: bool = False) -> None:
        self.gm, self.new_constant, self.fake_mode, self.report = gm, new_constant, fake_mode, report
        self.bits = 4 if opts.weights == "int4" else 8
        self.block = int(opts.block_size)
        self.keep = opts.weights_keep
        self.min_snr = float(opts.weights_min_snr) if opts.weights_min_snr is not None else DEFAULT_MIN_SNR[self.bits]
        self.use_kernel = opts.kernels != "none" and hasattr(torch.ops.graphopt, "wq_linear")
        self.autotune = autotune and self.use_kernel
        self.kept: list[str] = []
        self.summary = WeightQuantSummary(weights=opts.weights, block_size=self.block, symmetric=True, form="per layer",
                                          accuracy_level=None, min_snr_db=self.min_snr)

    def layer(self, node: fx.Node, site_name: str, weight: torch.Tensor, reason: str, detail: str,
              q: Any = None, form: str = "", snr_db: float | None = None) -> None:
        """The layer's row in the report's weight_quantization (quantized when `form` is set; `snr_db`:
        the form's own measured SNR where it has its own quantization, int8pack's per channel)."""
        k, n = (int(d) for d in weight.shape)
        self.summary.layers.append(WeightLayer(
            node=site_name, op=_op_name(node), k=k, n=n, quantized=bool(form), reason=reason,
            snr_db=None if q is None else float(q.snr_db if snr_db is None else snr_db),
            weight_snr_db=None if q is None else float(q.weight_snr_db), layer_form=form, detail=detail))
        if form:
            stored = q.int8pack if form == "int8pack" else (q.packed, q.scales, q.zeros)
            self.summary.quantized += 1
            self.summary.symmetric = self.summary.symmetric and (form == "int8pack" or q.zeros is None)
            self.summary.bytes_before += weight.numel() * weight.element_size()
            self.summary.bytes_after += sum(t.numel() * t.element_size() for t in stored if t is not None)
        else:
            self.summary.kept += 1

    def decide(self, node: fx.Node, site_name: str, reason: str, chosen: str = "unquantized", basis: str = "forced",
               alternatives: list[Alternative] | None = None) -> None:
        self.report.decisions.append(DecisionRecord(kind="weights", site=site_name, chosen=chosen, baseline="unquantized",
                                                    basis=basis, reason=reason, alternatives=alternatives or []))

    def rewrite(self, node: fx.Node) -> bool:
        site = _site(self.gm, node)
        if site is None:
            return False
        x, w_node, bias, weight = site
        names = _module_names(self.gm, w_node, weight)
        site_name = "+".join(names) if names else node.name
        kind = f"int{self.bits}"
        blocked = _keep_reason(node, names, self.keep)
        if blocked is not None:
            code, reason = blocked
            self.kept.append(f"{site_name} ({reason})")
            self.decide(node, site_name, reason)
            self.layer(node, site_name, weight, code, reason)
            return False
        quantized = quantize_weight(weight, self.bits, self.block, self.min_snr)
        snr = f"SNR {quantized.snr_db:.1f} dB"
        if not quantized.snr_db >= self.min_snr:
            reason = f"{kind}: {snr} < the {self.min_snr:g} dB budget"
            self.kept.append(f"{site_name} ({reason})")
            self.decide(node, site_name, reason)
            self.layer(node, site_name, weight, "budget", reason, quantized)
            return False
        form, alternatives, basis, why, form_snr = self.choose(node, x, bias, weight, quantized)
        scheme = "per channel" if form == "int8pack" else f"block {self.block}{'' if quantized.zeros is None else ' with zero points'}"
        self.decide(node, site_name, f"{kind} {scheme}: {snr} >= {self.min_snr:g} dB; {why}", chosen=form, basis=basis,
                    alternatives=alternatives)
        if form == "unquantized":
            self.kept.append(f"{site_name} (unquantized measured faster)")
            self.layer(node, site_name, weight, "speed_measured", f"unquantized measured faster: {why}", quantized)
            return False
        zero_points = quantized.zeros is not None and form != "int8pack"
        self.layer(node, site_name, weight, "", f"{'zero points; ' if zero_points else ''}{why}", quantized, form, form_snr)
        self.emit(node, form, x, bias, weight, quantized, site_name)
        return True

    def candidates(self, bias_t: torch.Tensor | None, weight: torch.Tensor, q: Any) -> list[Candidate]:
        """The forms timed for this weight: CUDA's (graphopt's kernel, dequantize + matmul, tinygemm)
        or, on the CPU, its packed kernels; the unquantized matmul always."""
        k, n = weight.shape
        args = (q.packed, q.scales, q.zeros, bias_t, self.bits, self.block, k)
        found = []
        on_cpu = weight.device.type == "cpu" and not MEASURE_OFF_CUDA
        if not on_cpu:
            if self.use_kernel:
                found.append(Candidate("wq_linear", lambda x: torch.ops.graphopt.wq_linear(x, *args)))
            found.append(Candidate("dequant", lambda x: dequant_linear(x, *args)))
        int4 = int4pack_weight(q.blocks, weight.device) if self.bits == 4 else None
        if int4 is not None:
            q.int4pack = int4
            found.append(Candidate("int4pack", lambda x: int4pack_linear(x, int4[0], int4[1], self.block, n, bias_t)))
        int8 = int8pack_weight(weight) if self.bits == 8 and on_cpu else None
        if int8 is not None:
            q.int8pack = int8
            found.append(Candidate("int8pack", lambda x: int8pack_linear(x, int8[0], int8[1], n, bias_t)))
        found.append(Candidate("unquantized", lambda x: unquantized_linear(x, weight, bias_t)))
        return found

    def choose(self, node: fx.Node, x: fx.Node, bias: Any, weight: torch.Tensor,
               q: Any) -> tuple[str, list[Alternative], str, str, float | None]:
        """(form, the alternatives with their times, basis, why, the form's own SNR where it has its own
        quantization): the fastest form, a quantized one only MARGIN ahead of the unquantized matmul
        and within the layer's SNR budget as it runs."""
        default = "wq_linear" if self.use_kernel else "dequant"
        if weight.device.type not in ("cuda", "cpu") and not MEASURE_OFF_CUDA:
            return default, [], "forced", f"{default} (not timed on {weight.device.type})", None
        bias_t = attr_tensor(self.gm, str(bias.target)) if isinstance(bias, fx.Node) and bias.op == "get_attr" else None
        x_val = x.meta["val"]
        rows = _rows(x_val)
        sample = torch.randn(rows, weight.shape[0], device=weight.device, dtype=weight.dtype)
        candidates = self.candidates(bias_t, weight, q)
        snrs: dict[str, float] = {}
        for candidate in candidates:
            if candidate.name in ("int4pack", "int8pack"):  # their own activation cast (and int8pack its own scales)
                snrs[candidate.name] = form_snr_db(candidate.run, weight, bias_t)
        failed = {name: db for name, db in snrs.items() if not db >= self.min_snr}
        candidates = [c for c in candidates if c.name not in failed]
        key = (rows, *weight.shape, weight.dtype, weight.device.type, self.bits, self.block, q.zeros is not None, self.use_kernel,
               bias_t is not None, tuple(c.name for c in candidates))
        times = fastest(key, sample, candidates)
        if not times:
            return default, [], "forced", f"{default} (no candidate could be timed)", None
        best = min(times, key=lambda name: times[name])
        if best != "unquantized" and "unquantized" in times and times[best] > (1.0 - MARGIN) * times["unquantized"]:
            best = "unquantized"  # inside the noise margin: the model as it came
        listed = ", ".join(f"{name} {ms:.4f} ms" for name, ms in sorted(times.items(), key=lambda kv: kv[1]))
        alternatives = [Alternative(name, measured_ms=ms, source=f"timed at M={rows}") for name, ms in times.items()]
        refused = "".join(f"; {name} refused: SNR {db:.1f} dB < {self.min_snr:g}" for name, db in failed.items())
        return best, alternatives, "measured", f"{best} fastest at M={rows} ({listed}){refused}", snrs.get(best)

    def emit(self, node: fx.Node, form: str, x: fx.Node, bias: Any, weight: torch.Tensor, q: Any, site_name: str) -> None:
        graph, label = self.gm.graph, site_name.replace(".", "_").replace("+", "_")[-60:]
        with graph.inserting_before(node):
            if form == "int4pack":
                packed = self.new_constant(q.int4pack[0], f"wq_{label}_int4pack")
                sz = self.new_constant(q.int4pack[1], f"wq_{label}_scales_and_zeros")
                target: Any = int4pack_linear
                args: tuple[Any, ...] = (x, packed, sz, self.block, weight.shape[1], bias)
            elif form == "int8pack":
                q8 = self.new_constant(q.int8pack[0], f"wq_{label}_int8pack")
                scales8 = self.new_constant(q.int8pack[1], f"wq_{label}_channel_scales")
                target = int8pack_linear
                args = (x, q8, scales8, weight.shape[1], bias)
            else:
                packed = self.new_constant(q.packed, f"wq_{label}_packed")
                scales = self.new_constant(q.scales, f"wq_{label}_scales")
                zeros = self.new_constant(q.zeros, f"wq_{label}_zeros") if q.zeros is not None else None
                target = torch.ops.graphopt.wq_linear.default if form == "wq_linear" else dequant_linear
                args = (x, packed, scales, zeros, bias, self.bits, self.block, weight.shape[0])
                if form == "wq_linear" and self.autotune:  # inductor times it against its dequantize + GEMM (graphopt.inductor_choices)
                    target = torch.ops.graphopt.tuned_wq_linear.default
                    absent = {"zeros": torch.zeros(0, dtype=torch.uint8, device=weight.device), "bias": torch.zeros(0, dtype=weight.dtype, device=weight.device)}
                    args = (x, packed, scales, zeros if zeros is not None else self.new_constant(absent["zeros"], f"wq_{label}_no_zeros"),
                            bias if bias is not None else self.new_constant(absent["bias"], f"wq_{label}_no_bias"),
                            self.bits, self.block, weight.shape[0])
            replacement = graph.call_function(target, args)
            replacement.meta["val"] = _fake_call(self.fake_mode, target, fx.node.map_arg(args, lambda n: n.meta["val"]))
            if node.target is aten._addmm_activation.default:  # the epilogue as its own op, after the product
                epilogue: tuple[Any, dict[str, Any]] = ((aten.relu.default, {}) if _activation(node) == "relu"
                                                        else (aten.gelu.default, {"approximate": "tanh"}))
                product = replacement
                replacement = graph.call_function(epilogue[0], (product,), epilogue[1])
                replacement.meta["val"] = _fake_call(self.fake_mode, epilogue[0], (product.meta["val"],), epilogue[1])
        node.replace_all_uses_with(replacement)
        graph.erase_node(node)


def quantize_weights(gm: fx.GraphModule, new_constant: NewConstant, fake_mode: Any, opts: Any, report: Report,
                     autotune: bool = False) -> int:
    """Quantize every eligible matmul's weight (opts.weights "int8"/"int4"); returns how many
    matmuls were replaced (`autotune`: inductor will time graphopt::wq_linear against its own dequantize +
    GEMM, graphopt.inductor_choices: the kernel's sites are written for that). Each matmul with a constant weight leaves a "weights" decision in the
    report (quantized with its SNR and form, or kept and why) and a row in its weight_quantization
    (the same summary the ONNX path fills: SNR, form, reason code); a warning lists those kept."""
    if opts.weights is None:
        return 0
    from graphopt.ops.torch_custom_ops import ensure_kernels

    ensure_kernels()  # torch.ops.graphopt.wq_linear (the "dequant" form serves where it failed to register)
    rewriter = _Rewriter(gm, new_constant, fake_mode, opts, report, autotune)
    changed = sum(rewriter.rewrite(node) for node in list(gm.graph.nodes))
    release_timing_buffers()
    if rewriter.summary.layers:
        report.weight_quantization = rewriter.summary
    if rewriter.kept:
        report.warnings.append(f"weights {opts.weights}: {changed} matmuls quantized; kept in full precision: {'; '.join(rewriter.kept)}")
    return changed
