"""Passes that are not single patterns. Each works in place on the main graph,
subgraphs and function bodies, returns how many changes it made, and can record its
run in a `graphopt.report.model.PassStats` (``stats=``). `fold_constants` takes the
`OnnxView` (it names new values through it); the others take an `ir.Model` or an
`OnnxView`."""

from graphopt.passes.constant_folding import DEFAULT_SIZE_LIMIT_BYTES, fold_constants
from graphopt.passes.control_flow import inline_constant_ifs
from graphopt.passes.cse import eliminate_common_subexpressions
from graphopt.passes.dce import eliminate_dead_code
from graphopt.passes.shapes import infer_shapes, refine_shapes

__all__ = [
    "DEFAULT_SIZE_LIMIT_BYTES",
    "fold_constants",
    "inline_constant_ifs",
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "infer_shapes",
    "refine_shapes",
]
