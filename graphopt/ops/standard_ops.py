"""What graphopt knows about standard ops: their facts, one line per op.

Inputs, outputs and attributes of standard ONNX ops are onnx's schemas (the registry
reads `onnx.defs`); only what onnx does not say is written here -- the facts the passes
act on (see `FACTS` in graphopt/ops/opspec.py for each one's meaning and reader). The
onnxruntime contrib ops graphopt lowers its own ops to (domain com.microsoft) are here
for the same reason. Why some ops are, or are not, listed:

* commutative: bit-exact in IEEE arithmetic too (a+b == b+a); Max/Min are left out
  because NaN handling is not symmetric in every runtime.
* never_folded: Constant is one already; folding Quantize/DequantizeLinear would turn
  int8 weights into float ones and break QDQ fusion.
* never_merged: Quantize/DequantizeLinear and their constants -- onnxruntime's QDQ
  transformers fuse DQ -> op -> Q into QLinearAdd/QLinearConv/... where each node unit
  has a DequantizeLinear of its own, and convert int8 constants to uint8 in place where
  no other node reads them; merging the equal zero biases of a static per-channel BERT
  (quantize_static gives them all scale 1) took it from 26 QLinearAdd to 2.
* nan_order_sensitive: onnxruntime's ReduceMax skips NaNs where numpy's propagates them,
  its ArgMax picks another index, its Clip ignores a NaN bound.
* keep_fp32: reductions whose accumulation loses precision in 16 bits, range-expanding
  math (Pow, Exp, Log), standalone softmax, normalization statistics without a fused
  kernel, running sums and generated sequences, random numbers, boxes, signal
  processing, quantization scales. Fused kernels (LayerNormalization, attention,
  graphopt's ops) accumulate in float32 internally and are not listed; neither are Erf,
  Tanh and Sigmoid (bounded outputs), nor ReduceMax/ReduceMin/ArgMax (exact in any type).
* heavy: ops whose precision decides a fusion's worth; ops outside the standard domain
  (fused ops) count as heavy too (graphopt/passes/precision.py says so).
* fp32_outputs: statistics outputs in the stash type, float32 whatever the input type.
* slower_on_ort_cpu: Softplus's CPU kernel is a scalar loop (log1p(exp) per element)
  where Exp, Add and Log are vectorized: 8.9 ms against 1.18 ms for Exp+Add+Log on
  1x64x80x80 float32, one thread, onnxruntime 1.32 (hb-yolo-mish-op18 ran 1.24x slower
  with Log(1 + Exp(x)) folded into it). A model's own Softplus nodes are left alone.
"""

from __future__ import annotations

from graphopt.ops.opspec import MS_DOMAIN, OpSpec, facts

__all__ = ["STANDARD_OPS"]


def _op(name: str, *fact_names: str, domain: str = "", fp32_outputs: tuple[int, ...] = (), fp32_inputs: tuple[int, ...] = ()) -> OpSpec:
    return OpSpec(domain, name, facts=facts(*fact_names), fp32_outputs=fp32_outputs, fp32_inputs=fp32_inputs)


STANDARD_OPS: tuple[OpSpec, ...] = (
    _op("Abs", "elementwise", "follows_inputs"),
    _op("Add", "commutative", "broadcasting", "follows_inputs"),
    _op("AffineGrid", "unbounded_output"),
    _op("And", "commutative", "broadcasting"),
    _op("ArgMax", "nan_order_sensitive"),
    _op("ArgMin", "nan_order_sensitive"),
    _op("Attention", "heavy"),
    _op("AveragePool", "nhwc_internal_pool"),
    _op("BatchNormalization", "same_shape"),
    _op("Bernoulli", "non_deterministic", "keep_fp32", "attribute_typed"),
    _op("BitShift", "broadcasting"),
    _op("BitwiseAnd", "commutative"),
    _op("BitwiseOr", "commutative"),
    _op("BitwiseXor", "commutative"),
    _op("BlackmanWindow", "unbounded_output"),
    _op("Cast", "elementwise", "follows_inputs"),
    _op("CastLike", "same_shape"),
    _op("Ceil", "elementwise"),
    _op("Celu", "elementwise"),
    _op("CenterCropPad", "unbounded_output"),
    _op("Clip", "elementwise", "nan_order_sensitive", "follows_inputs"),
    _op("Col2Im", "unbounded_output"),
    _op("Concat", "moves_data", "follows_inputs"),
    _op("ConstantOfShape", "attribute_typed"),
    _op("Conv", "unbounded_output", "heavy"),
    _op("ConvInteger", "unbounded_output"),
    _op("ConvTranspose", "unbounded_output", "heavy"),
    _op("Cos", "elementwise"),
    _op("CumSum", "keep_fp32"),
    _op("DFT", "unbounded_output", "keep_fp32"),
    _op("Constant", "never_folded"),
    _op("DequantizeLinear", "never_folded", "never_merged", "keep_fp32"),
    _op("Div", "broadcasting", "follows_inputs"),
    _op("Dropout", "elementwise"),
    _op("DynamicQuantizeLinear", "keep_fp32"),
    _op("Einsum", "unbounded_output", "heavy"),
    _op("Elu", "elementwise"),
    _op("Equal", "commutative", "broadcasting"),
    _op("Erf", "elementwise"),
    _op("Exp", "elementwise", "keep_fp32", "follows_inputs"),
    _op("Expand", "moves_data", "follows_inputs"),
    _op("EyeLike", "attribute_typed"),
    _op("Flatten", "moves_data", "follows_inputs"),
    _op("Floor", "elementwise"),
    _op("GRU", "heavy", "recurrent"),
    _op("Gather", "follows_inputs"),
    _op("GatherND", "unbounded_output"),
    _op("Gelu", "elementwise"),
    _op("Gemm", "heavy"),
    _op("GlobalAveragePool", "nhwc_internal_pool"),
    _op("GlobalLpPool", "keep_fp32"),
    _op("GlobalMaxPool", "nan_order_sensitive", "nhwc_internal_pool"),
    _op("Greater", "broadcasting"),
    _op("GreaterOrEqual", "broadcasting"),
    _op("GroupNormalization", "heavy"),
    _op("HammingWindow", "unbounded_output"),
    _op("HannWindow", "unbounded_output"),
    _op("HardSigmoid", "elementwise"),
    _op("HardSwish", "elementwise"),
    _op("Identity", "elementwise", "moves_data", "follows_inputs"),
    _op("InstanceNormalization", "same_shape", "heavy"),
    _op("IsInf", "elementwise"),
    _op("IsNaN", "elementwise"),
    _op("LRN", "keep_fp32"),
    _op("LSTM", "heavy", "recurrent"),
    _op("LayerNormalization", "same_shape", "heavy", fp32_outputs=(1, 2)),
    _op("LeakyRelu", "elementwise"),
    _op("Less", "broadcasting"),
    _op("LessOrEqual", "broadcasting"),
    _op("Log", "elementwise", "keep_fp32", "follows_inputs"),
    _op("LogSoftmax", "same_shape", "keep_fp32"),
    _op("LpNormalization", "keep_fp32"),
    _op("LpPool", "keep_fp32"),
    _op("MatMul", "heavy"),
    _op("MatMulInteger", "unbounded_output"),
    _op("Max", "broadcasting", "follows_inputs"),
    _op("MaxPool", "nan_order_sensitive", "nhwc_internal_pool"),
    _op("MaxRoiPool", "nan_order_sensitive"),
    _op("MaxUnpool", "unbounded_output"),
    _op("Mean", "broadcasting", "follows_inputs"),
    _op("MeanVarianceNormalization", "keep_fp32"),
    _op("MelWeightMatrix", "unbounded_output"),
    _op("Min", "broadcasting", "follows_inputs"),
    _op("Mish", "elementwise"),
    _op("Mod", "broadcasting"),
    _op("Mul", "commutative", "broadcasting", "follows_inputs"),
    _op("Multinomial", "non_deterministic", "keep_fp32", "attribute_typed"),
    _op("Neg", "elementwise", "follows_inputs"),
    _op("NonMaxSuppression", "keep_fp32"),
    _op("Not", "elementwise"),
    _op("Or", "commutative", "broadcasting"),
    _op("PRelu", "broadcasting"),
    _op("Pad", "unbounded_output"),
    _op("Pow", "broadcasting", "keep_fp32", "follows_inputs"),
    _op("QLinearConv", "unbounded_output"),
    _op("QLinearMatMul", "unbounded_output"),
    _op("QuantizeLinear", "never_folded", "never_merged", "keep_fp32"),
    _op("RMSNormalization", "same_shape", "heavy"),
    _op("RNN", "heavy", "recurrent"),
    _op("RandomNormal", "non_deterministic", "keep_fp32", "attribute_typed"),
    _op("RandomNormalLike", "non_deterministic", "keep_fp32", "attribute_typed"),
    _op("RandomUniform", "non_deterministic", "keep_fp32", "attribute_typed"),
    _op("RandomUniformLike", "non_deterministic", "keep_fp32", "attribute_typed"),
    _op("Range", "keep_fp32"),
    _op("Reciprocal", "elementwise", "follows_inputs"),
    _op("ReduceL1", "reduce", "keep_fp32"),
    _op("ReduceL2", "reduce", "keep_fp32"),
    _op("ReduceLogSum", "reduce", "keep_fp32"),
    _op("ReduceLogSumExp", "reduce", "keep_fp32"),
    _op("ReduceMax", "reduce", "nan_order_sensitive"),
    _op("ReduceMean", "reduce", "keep_fp32"),
    _op("ReduceMin", "reduce", "nan_order_sensitive"),
    _op("ReduceProd", "reduce", "keep_fp32"),
    _op("ReduceSum", "reduce", "keep_fp32"),
    _op("ReduceSumSquare", "reduce", "keep_fp32"),
    _op("Relu", "elementwise"),
    _op("Reshape", "moves_data", "follows_inputs"),
    _op("Resize", "unbounded_output"),
    _op("RoiAlign", "keep_fp32"),
    _op("Round", "elementwise"),
    _op("STFT", "unbounded_output", "keep_fp32"),
    _op("Selu", "elementwise"),
    _op("Sigmoid", "elementwise"),
    _op("Sign", "elementwise"),
    _op("SimplifiedLayerNormalization", "same_shape", fp32_outputs=(1,)),
    _op("Sin", "elementwise"),
    _op("Slice", "moves_data", "follows_inputs"),
    _op("Softmax", "same_shape", "keep_fp32"),
    _op("Softplus", "elementwise", "slower_on_ort_cpu"),
    _op("Softsign", "elementwise"),
    _op("Split", "follows_inputs"),
    _op("Sqrt", "elementwise", "follows_inputs"),
    _op("Squeeze", "moves_data", "follows_inputs"),
    _op("Sub", "broadcasting", "follows_inputs"),
    _op("Sum", "broadcasting", "follows_inputs"),
    _op("Tanh", "elementwise"),
    _op("ThresholdedRelu", "elementwise"),
    _op("Tile", "follows_inputs"),
    _op("TopK", "nan_order_sensitive"),
    _op("Transpose", "moves_data", "follows_inputs"),
    _op("Trilu", "same_shape"),
    _op("Unsqueeze", "moves_data", "follows_inputs"),
    _op("Upsample", "unbounded_output"),
    _op("Where", "broadcasting", "follows_inputs"),
    _op("Xor", "commutative", "broadcasting"),
    # onnxruntime's contrib ops that graphopt's own ops lower to
    _op("BiasGelu", "same_shape", domain=MS_DOMAIN),
    _op("FastGelu", "same_shape", domain=MS_DOMAIN),
    _op("Gelu", "elementwise", domain=MS_DOMAIN),
    _op("QuickGelu", "elementwise", domain=MS_DOMAIN),
    _op("SkipLayerNormalization", "same_shape", domain=MS_DOMAIN, fp32_outputs=(1, 2)),
    _op("SkipSimplifiedLayerNormalization", "same_shape", domain=MS_DOMAIN, fp32_outputs=(1, 2)),
    # The CUDA GroupNorm reads gamma and beta with Data<float>() (contrib_ops/cuda/diffusion/
    # group_norm.cc): float16 ones fail at run time; onnxruntime's own float16 converter keeps
    # the same inputs float32 (transformers/float16.py, ALWAYS_FLOAT_INPUTS).
    _op("GroupNorm", domain=MS_DOMAIN, fp32_inputs=(1, 2)),
    _op("SkipGroupNorm", domain=MS_DOMAIN, fp32_inputs=(1, 2)),
)
