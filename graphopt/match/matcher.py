"""Match one rule at one root node.

Matching is a depth-first search written with generators: every place with a
choice (commutative operands, tagged alternatives, an optional operand) yields
each way it can match, so later failures backtrack into earlier choices without
the rule being cloned. The bindings are small dicts copied on extension.

When no way matches, the attempt keeps its *deepest* failure (the one reached
after matching the most ops): that is the near-miss the report shows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphopt.ir.view import GraphView
from graphopt.match.context import MatchContext
from graphopt.ops.registry import attribute_default
from graphopt.pattern.ir import (
    COMMUTATIVE_FIRST_TWO,
    COMMUTATIVE_OPS,
    MISSING,
    AltMatch,
    Call,
    Lit,
    MatchNode,
    OpMatch,
    Ref,
    Rule,
    ValueConstraint,
    Var,
    bound_names,
    op_key_text,
)
from graphopt.pattern.native import call_native, lookup

__all__ = ["OpBinding", "Match", "Failure", "MatchContext", "Matcher"]


@dataclass(frozen=True)
class OpBinding:
    """What a `let` name bound to a matched op refers to: the node and the output used."""

    node: Any
    value: Any


@dataclass(frozen=True)
class Match:
    rule: Rule
    root: Any
    bindings: dict[str, Any]
    nodes: tuple[Any, ...]  # matched nodes, root first


@dataclass(frozen=True)
class Failure:
    depth: int  # ops matched before failing; deeper = nearer miss
    node: Any  # where it failed (a node, or None when a value had no producer)
    reason: str
    #: The nodes matched before the failure (the part of the subgraph that was tried).
    nodes: tuple[Any, ...] = ()


class _Env:
    __slots__ = ("bindings", "nodes", "shared")

    def __init__(self, bindings: dict[str, Any], nodes: tuple[Any, ...], shared: frozenset[int] = frozenset()) -> None:
        self.bindings = bindings
        self.nodes = nodes
        self.shared = shared  # ids of nodes matched by `shared` ops: exempt from the single-use check

    def bind(self, name: str, value: Any) -> _Env:
        b = dict(self.bindings)
        b[name] = value
        return _Env(b, self.nodes, self.shared)

    def add_node(self, node: Any, shared: bool = False) -> _Env:
        return _Env(self.bindings, self.nodes + (node,), self.shared | {id(node)} if shared else self.shared)


def _same_attr(actual: Any, expected: Any) -> bool:
    if isinstance(actual, np.ndarray) or isinstance(expected, np.ndarray):
        return bool(np.array_equal(np.asarray(actual), np.asarray(expected)))
    if isinstance(actual, (list, tuple)) and isinstance(expected, (list, tuple)):
        return len(actual) == len(expected) and all(_same_attr(a, e) for a, e in zip(actual, expected))
    if isinstance(actual, float) or isinstance(expected, float):
        try:
            return bool(np.float32(actual) == np.float32(expected))
        except (TypeError, ValueError):
            return False
    return bool(actual == expected)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value)


class Matcher:
    def __init__(self, view: GraphView) -> None:
        self.view = view
        self._best: Failure | None = None
        self._scope: Any = None
        self._names: dict[str, set[str]] = {}

    # ---------------------------------------------------------------- entry
    def attempt(self, rule: Rule, root: Any) -> Match | Failure:
        """The first complete match of `rule` rooted at `root`, or the nearest miss."""
        self._best = None
        self._scope = self.view.scope_of(root)
        for guard in rule.guards:
            version = self.view.opset(guard.domain)
            if not guard.admits(version):
                return Failure(0, root, f"the model's {'opset' if not guard.domain else guard.domain + ' opset'} is {version}; the rule needs {guard.describe()}")
        ctx = MatchContext(self.view, self._scope)
        for env in self._match_node(rule.root, root, _Env({}, ()), depth=0):
            nodes = env.nodes
            problem = self._check_interior(nodes, env.shared)
            if problem is None:
                problem = self._check_constraints(rule, env.bindings, ctx)
            if problem is None:
                return Match(rule, root, self._complete(rule, env.bindings), nodes)
            self._fail(len(nodes) + 1, problem[0], problem[1], nodes)
        return self._best or Failure(0, root, "no match")

    def _complete(self, rule: Rule, bindings: dict[str, Any]) -> dict[str, Any]:
        # Names bound only in the alternative branch that did not match read as None.
        names = self._names.get(rule.name)
        if names is None:
            names = self._names[rule.name] = bound_names(rule.root)
        missing = names.difference(bindings)
        return {**bindings, **dict.fromkeys(missing)} if missing else bindings

    def _fail(self, depth: int, node: Any, reason: str, matched: tuple[Any, ...] = ()) -> None:
        if self._best is None or depth > self._best.depth:
            self._best = Failure(depth, node, reason, matched)

    # ---------------------------------------------------------------- values
    def _match_value(self, p: MatchNode, value: Any, env: _Env, depth: int) -> Iterator[_Env]:
        if isinstance(p, Var):
            yield from self._match_var(p, value, env, depth)
        elif isinstance(p, OpMatch):
            yield from self._match_op_value(p, value, env, depth)
        else:
            assert isinstance(p, AltMatch)
            for tag, branch in p.branches:
                yield from self._match_value(branch, value, env.bind(p.tag_var, tag), depth)

    def _match_var(self, p: Var, value: Any, env: _Env, depth: int) -> Iterator[_Env]:
        if value is None:
            if p.optional:
                yield env if p.name == "_" else env.bind(p.name, None)
            else:
                self._fail(depth, env.nodes[-1] if env.nodes else None, f"operand '{p.name}' is missing", env.nodes)
            return
        if p.name != "_" and p.name in env.bindings:
            bound = env.bindings[p.name]
            if bound is value:
                yield env
            else:
                self._fail(depth, self.view.producer(value), f"'{p.name}' must be the same value in both places", env.nodes)
            return
        for constraint in p.constraints:
            reason = self._check_value_constraint(constraint, value)
            if reason is not None:
                self._fail(depth, self.view.producer(value), f"'{p.name}' {reason}", env.nodes)
                return
        yield env if p.name == "_" else env.bind(p.name, value)

    def _match_op_value(self, p: OpMatch, value: Any, env: _Env, depth: int) -> Iterator[_Env]:
        where = env.nodes[-1] if env.nodes else None
        if value is None:
            self._fail(depth, where, f"expected {_op_name(p)}, but the operand is missing", env.nodes)
            return
        if p.name and p.name in env.bindings:
            bound = env.bindings[p.name]
            if isinstance(bound, OpBinding) and bound.value is value:
                yield env
            else:
                self._fail(depth, where, f"'{p.name}' must be the same node in both places", env.nodes)
            return
        producer = self.view.producer(value)
        if producer is None:
            kind = "a constant" if self.view.is_const(value) else "a graph input"
            self._fail(depth, where, f"expected {_op_name(p)}, got {kind}", env.nodes)
            return
        if self.view.scope_of(producer) is not self._scope:
            self._fail(depth, where, f"expected {_op_name(p)} in the same graph, got a value from an outer scope", env.nodes)
            return
        if self.view.output_index(value) != p.output:
            index = self.view.output_index(value)
            self._fail(depth, producer, f"uses output {index} of {_op_name(p)}, pattern wants output {p.output}", env.nodes)
            return
        yield from self._match_node(p, producer, env, depth)

    # ---------------------------------------------------------------- nodes
    def _match_node(self, p: OpMatch, node: Any, env: _Env, depth: int) -> Iterator[_Env]:
        view = self.view
        key = view.op_key(node)
        if key != (p.domain, p.op_type) and key not in p.alternatives:
            self._fail(depth, node, f"expected {_op_name(p)}, got {_key_name(key)}", env.nodes)
            return
        if p.type_bind is not None:
            env = env.bind(p.type_bind, op_key_text(key))
        for a in p.attrs:
            actual = view.attr(node, a.name)  # the node's, else its onnx schema's default
            if actual is MISSING:  # graphopt's own ops: the default declared in the op registry
                actual = attribute_default(*key, a.name)
            if actual is MISSING:
                actual = a.default
            if a.literal is not MISSING:
                if actual is MISSING:
                    self._fail(depth, node, f"attribute {a.name} is not set (pattern wants {_fmt(a.literal)})", env.nodes)
                    return
                if not _same_attr(actual, a.literal):
                    self._fail(depth, node, f"attribute {a.name} = {_fmt(actual)}, pattern wants {_fmt(a.literal)}", env.nodes)
                    return
            if a.bind:
                value = None if actual is MISSING else actual
                if a.bind in env.bindings:
                    if not _same_attr(env.bindings[a.bind], value):
                        self._fail(depth, node, f"attribute {a.name} differs from '{a.bind}' bound earlier", env.nodes)
                        return
                else:
                    env = env.bind(a.bind, value)
        inputs = list(view.inputs(node))
        while inputs and inputs[-1] is None:
            inputs.pop()
        required = sum(1 for o in p.operands if not (isinstance(o, Var) and o.optional))
        if not required <= len(inputs) <= len(p.operands):
            want = f"{required}" if required == len(p.operands) else f"{required} to {len(p.operands)}"
            self._fail(depth, node, f"{_key_name(key)} has {len(inputs)} inputs, pattern wants {want}", env.nodes)
            return
        inputs.extend([None] * (len(p.operands) - len(inputs)))
        env = env.add_node(node, p.shared)
        if p.name:
            outputs = view.outputs(node)
            env = env.bind(p.name, OpBinding(node, outputs[p.output] if len(outputs) > p.output else None))
        depth += 1
        orders: list[tuple[Any, ...]]
        if (key in COMMUTATIVE_OPS and len(p.operands) == 2) or (key in COMMUTATIVE_FIRST_TWO and len(p.operands) >= 2):
            orders = [tuple(inputs), (inputs[1], inputs[0], *inputs[2:])]
            if inputs[0] is inputs[1]:
                orders = orders[:1]
        else:
            orders = [tuple(inputs)]
        for values in orders:
            yield from self._match_operands(p.operands, values, 0, env, depth)

    def _match_operands(self, operands: tuple[MatchNode, ...], values: tuple[Any, ...], i: int, env: _Env, depth: int) -> Iterator[_Env]:
        if i == len(operands):
            yield env
            return
        for env2 in self._match_value(operands[i], values[i], env, len(env.nodes)):
            yield from self._match_operands(operands, values, i + 1, env2, len(env2.nodes))

    # ---------------------------------------------------------------- checks
    def _check_value_constraint(self, c: ValueConstraint, value: Any) -> str | None:
        view = self.view
        if c.kind == "Const":
            return None if view.is_const(value) else "is not a constant"
        if c.kind == "Rank":
            shape = view.shape(value)
            if shape is None:
                return f"has unknown rank (pattern wants rank {c.args[0]})"
            return None if len(shape) == c.args[0] else f"has rank {len(shape)}, pattern wants {c.args[0]}"
        if c.kind == "DType":
            dtype = view.dtype(value)
            return None if dtype in c.args else f"has dtype {dtype}, pattern wants one of {', '.join(map(str, c.args))}"
        if c.kind == "OneUse":
            n = len(view.users(value)) + (1 if view.is_graph_output(value) else 0)
            return None if n == 1 else f"has {n} uses, pattern wants one"
        if c.kind == "Scalar":
            shape = view.shape(value)
            if shape is None or any(not isinstance(d, int) for d in shape):
                return "is not known to be a scalar"
            return None if math.prod(d for d in shape if isinstance(d, int)) == 1 else f"has shape {list(shape)}, pattern wants a scalar"
        return f"has unknown constraint {c.kind}"

    def _check_interior(self, nodes: tuple[Any, ...], shared: frozenset[int]) -> tuple[Any, str] | None:
        """Interior nodes are single-use by default: every user of an interior value is
        itself part of the match, and no interior value is a graph output."""
        if len(nodes) <= 1:
            return None
        matched = set(map(id, nodes))
        view = self.view
        for node in nodes[1:]:
            if id(node) in shared:
                continue
            for out in view.outputs(node):
                if view.is_graph_output(out):
                    return node, f"interior node {view.label(node)} produces a graph output"
                for user in view.users(out):
                    if id(user) not in matched:
                        return node, f"interior node {view.label(node)} has another user, {view.label(user)}"
        return None

    def _check_constraints(self, rule: Rule, bindings: dict[str, Any], ctx: MatchContext) -> tuple[Any, str] | None:
        for call in rule.constraints:
            native = lookup("Constraint", call.name)
            if native is None:  # loaders reject this; guard for hand-built rules
                return None, f"constraint {call.name} is not registered"
            args = [_native_arg(evaluate_constraint_arg(a, bindings)) for a in call.args]
            result = call_native(native, ctx, *args, rule=rule.name)
            if result is True or result is None:
                continue
            reason = result if isinstance(result, str) else "returned false"
            return _node_of(bindings, call), f"{call.name}: {reason}"
        return None


def evaluate_constraint_arg(expr: Any, bindings: dict[str, Any]) -> Any:
    if isinstance(expr, Ref):
        value = bindings.get(expr.name)
        if expr.field is not None:
            return None if value is None else value[expr.field] if isinstance(value, dict) else getattr(value, expr.field)
        return value
    if isinstance(expr, Lit):
        return expr.value
    if isinstance(expr, Call):
        raise TypeError("nested calls are not allowed in constraints")
    raise TypeError(f"cannot evaluate {expr!r} in a constraint")


def _native_arg(value: Any) -> Any:
    # Natives receive values, not OpBindings: a let-bound op stands for its output.
    return value.value if isinstance(value, OpBinding) else value


def _node_of(bindings: dict[str, Any], call: Call) -> Any:
    for arg in call.args:
        if isinstance(arg, Ref) and isinstance(bindings.get(arg.name), OpBinding):
            return bindings[arg.name].node
    return None


def _op_name(p: OpMatch) -> str:
    return "|".join(op_key_text(k) for k in p.keys)


_key_name = op_key_text
