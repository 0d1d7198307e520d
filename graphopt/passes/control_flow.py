"""Inline an If whose condition is a constant: its taken branch replaces it.

Exporters leave such Ifs behind (a rank or size test that is static for the
exported model), and they often become constant only after Shape/Size folding.
Inlining lets folding and the rules see through them; it also removes Ifs whose
untaken branch onnxruntime would otherwise still have to load.
"""

from __future__ import annotations

import time
from typing import Any

import onnx_ir as ir

from graphopt.ir.onnx_view import OnnxView
from graphopt.passes._common import ONNX_DOMAINS, record

__all__ = ["inline_constant_ifs"]


def inline_constant_ifs(view: OnnxView, *, stats: Any = None) -> int:
    started = time.perf_counter()
    inlined = 0
    for scope in view.scopes():
        for node in list(scope):
            if node.op_type == "If" and node.domain in ONNX_DOMAINS and node.graph is scope and _inline(view, node):
                inlined += 1
    record(stats, inlined, started)
    return inlined


def _inline(view: OnnxView, node: ir.Node) -> bool:
    condition = node.inputs[0] if node.inputs else None
    array = view.const_array(condition) if condition is not None else None
    if array is None or array.size != 1:
        return False
    branch_attr = node.attributes.get("then_branch" if bool(array.reshape(-1)[0]) else "else_branch")
    if branch_attr is None or branch_attr.type != ir.AttributeType.GRAPH:
        return False
    branch: ir.Graph = branch_attr.value
    if branch.initializers or len(branch.outputs) != len(node.outputs):
        return False  # rare; not worth moving initializers between scopes
    scope = node.graph
    assert scope is not None
    moved = list(branch)
    results = list(branch.outputs)
    branch.outputs.clear()
    branch.remove(moved)
    scope.insert_before(node, moved)
    for old, new in zip(node.outputs, results):
        if new.producer() is None or new.producer() not in moved or new.is_graph_output():
            # The branch returned an outer value (or one value twice): copy it, so the
            # If's output keeps its own name.
            identity = ir.Node("", "Identity", [new], name=view.fresh_name("Identity"))
            scope.insert_before(node, identity)
            new = identity.outputs[0]
        view.redirect(old, new)
    # Detach the If (and the untaken branch's uses of outer values) before removing it.
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            for inner in ir.traversal.RecursiveGraphIterator(attr.value):
                for i in range(len(inner.inputs)):
                    inner.replace_input_with(i, None)
    for i in range(len(node.inputs)):
        node.replace_input_with(i, None)
    scope.remove(node)
    return True
