"""The Python front end's compiler: what one run of a rule function built -> one `ir.Rule`.

The op passed first to `replace(...)` is the root; whatever is reachable from it is
the match, the other ops and native calls reached from the replacement are the
rewrite. Local variable names become let names; other names are generated only
where the rule needs one.
"""

from __future__ import annotations

from graphopt.errors import PatternError
from graphopt.pattern.ir import (
    MISSING,
    AltMatch,
    AttrMatch,
    Build,
    Call,
    Expr,
    FirstOf,
    Let,
    Lit,
    MatchNode,
    NativeDecl,
    OpMatch,
    OpsetChoose,
    OpsetGuard,
    Ref,
    Replace,
    Rule,
    SourceLoc,
    Statement,
    Var,
)
from graphopt.pattern.pdll import is_name
from graphopt.pattern.python_symbols import (
    _Alt,
    _AttrSpec,
    _describe,
    _fail,
    _Field,
    _FirstPick,
    _is_literal,
    _literal,
    _NameRef,
    _NativeCall,
    _OpNode,
    _OpsetPick,
    _Recording,
    _Replace,
    _site_loc,
    _Sym,
    _Value,
    _Wildcard,
)

__all__ = ["RuleCompiler"]


class RuleCompiler:
    """Splits what the function built into match and rewrite halves and builds the Rule."""

    def __init__(
        self,
        name: str,
        benefit: int | None,
        doc: str,
        loc: SourceLoc,
        params: list[_Value],
        recording: _Recording,
        local_vars: dict[str, object],
        guards: tuple[OpsetGuard, ...] = (),
    ) -> None:
        self.guards = guards
        self.name, self.benefit, self.doc, self.loc = name, benefit, doc, loc
        self.def_site = (loc.file, loc.line)
        self.params = params
        self.recording = recording
        # First local name of each op / native call, in the function's variable order.
        self.local_names: dict[int, str] = {}
        for var, value in local_vars.items():
            if isinstance(value, (_OpNode, _NativeCall)) and id(value) not in self.local_names and is_name(var):
                self.local_names[id(value)] = var
        self.taken: set[str] = set(local_vars) | {p.name for p in params}
        self.owner: dict[str, str] = {p.name: f"parameter '{p.name}'" for p in params}  # match-level names

        self.match_ops: dict[int, _OpNode] = {}
        self.match_uses: dict[int, int] = {}
        self.used_params: set[str] = set()
        self.attr_binds: set[str] = set()
        self.tags: set[str] = set()
        self.type_binds: set[str] = set()
        self.needs_name: set[int] = set()  # match ops the rewrite or a constraint refers to
        self.rw_nodes: dict[int, _OpNode | _NativeCall] = {}
        self.rw_uses: dict[int, int] = {}
        self.rw_fields: set[int] = set()
        self.rw_walking: set[int] = set()  # on the current walk path, to catch cycles

    def error(self, site: tuple[str, int], message: str) -> PatternError:
        return _fail(site, f"rule {self.name}: {message}")

    def claim(self, name: str, what: str, site: tuple[str, int]) -> None:
        """Reserve a match-level name; two different things may not share one."""
        if name in self.owner and self.owner[name] != what:
            raise self.error(site, f"'{name}' names both {self.owner[name]} and {what}")
        self.owner[name] = what
        self.taken.add(name)

    def fresh(self, base: str) -> str:
        base = base.lower() if is_name(base.lower()) else "t"
        name, i = base, 1
        while name in self.taken or not is_name(name):
            i += 1
            name = f"{base}{i}"
        self.taken.add(name)
        return name

    # -------------------------------------------------------------- analysis
    def compile(self, result: object) -> Rule:
        if isinstance(result, _Replace):
            replaces = [result]
        elif isinstance(result, (list, tuple)) and result and all(isinstance(r, _Replace) for r in result):
            replaces = list(result)
        else:
            raise self.error(self.def_site, f"the function must return replace(...) or a list of them, not {_describe(result)}")
        root = replaces[0].target
        if not isinstance(root, _OpNode):
            raise self.error(replaces[0].site, f"replace() needs an op as its first argument, not {_describe(root)}")
        self.walk_match(root, replaces[0].site)
        for r in replaces:
            if not (isinstance(r.target, _OpNode) and id(r.target) in self.match_ops):
                raise self.error(r.site, f"only a matched op can be replaced, not {_describe(r.target)}")
            self.needs_name.add(id(r.target))
            if not r.values:
                raise self.error(r.site, "replace() needs at least one value")
            for v in r.values:
                self.walk_rewrite(v, r.site)
        for call in self.recording.required:
            for a in call.args:
                self.check_constraint_arg(a, call.site)
        self.check_everything_used(replaces)
        for p in self.params:
            if p.name not in self.used_params:
                raise self.error(self.def_site, f"parameter '{p.name}' is not used by the match")
        self.assign_names(root)
        return self.build(root, replaces)

    def walk_match(self, node: object, site: tuple[str, int]) -> None:
        if isinstance(node, _Value):
            self.used_params.add(node.name)
        elif isinstance(node, _Wildcard):
            pass
        elif isinstance(node, _OpNode):
            self.match_uses[id(node)] = self.match_uses.get(id(node), 0) + 1
            if id(node) in self.match_ops:
                return
            self.match_ops[id(node)] = node
            if node.copy_from is not None or node.num_outputs != 1:
                raise self.error(node.site, f"{node.describe()} is matched; copy_attrs() and outputs() are for ops the rewrite builds")
            if node.type_ref is not None:
                raise self.error(node.site, "op.same_as() builds an op in the rewrite; in the match use op.one_of(..., bind=...)")
            if node.type_bind is not None:
                if not is_name(node.type_bind):
                    raise self.error(node.site, f"'{node.type_bind}' cannot be an op type binding")
                self.claim(node.type_bind, "an op type binding", node.site)
                self.type_binds.add(node.type_bind)
            for key, value in node.attr_items:
                self.check_match_attr(node, key, value)
            for i, operand in enumerate(node.operands):
                if not isinstance(operand, (_Value, _Wildcard, _OpNode, _Alt)):
                    raise self.error(
                        node.site,
                        f"operand {i + 1} of matched {node.describe()} is {_describe(operand)}; a match takes parameters, ops, alt(...) or wildcard()",
                    )
                self.walk_match(operand, node.site)
        elif isinstance(node, _Alt):
            self.match_uses[id(node)] = self.match_uses.get(id(node), 0) + 1
            if id(node) in self.match_ops:
                return
            self.match_ops[id(node)] = node  # type: ignore[assignment]
            if node.tag_var in self.tags:
                raise self.error(node.site, f"two alternatives use the tag '{node.tag_var}'")
            if not is_name(node.tag_var):
                raise self.error(node.site, f"'{node.tag_var}' cannot be an alternative tag")
            self.tags.add(node.tag_var)
            self.claim(node.tag_var, f"the tag of {node.describe()}", node.site)
            if not node.branches:
                raise self.error(node.site, "alt() needs at least one branch")
            for label, branch in node.branches:
                if not is_name(label):
                    raise self.error(node.site, f"'{label}' cannot be a branch label")
                if not isinstance(branch, (_Value, _Wildcard, _OpNode, _Alt)):
                    raise self.error(node.site, f"branch '{label}' is {_describe(branch)}; a branch is a parameter, an op or alt(...)")
                self.walk_match(branch, node.site)
        else:
            raise self.error(site, f"{_describe(node)} cannot be matched")

    def check_match_attr(self, node: _OpNode, key: str, value: object) -> None:
        if isinstance(value, _AttrSpec):
            if (value.bind is None) == (value.equals is MISSING):
                raise self.error(node.site, f"attribute '{key}': give attr() either a name to bind or equals=, not both or neither")
            if value.bind is not None:
                if not is_name(value.bind):
                    raise self.error(node.site, f"attribute '{key}': '{value.bind}' cannot be a binding name")
                self.claim(value.bind, "an attribute binding", node.site)
                self.attr_binds.add(value.bind)
            for lit in (value.equals, value.default):
                if lit is not MISSING:
                    _literal(lit, node.site)
        elif not _is_literal(value):
            raise self.error(node.site, f"attribute '{key}' of matched {node.describe()} is {_describe(value)}; use a literal or attr(...)")
        else:
            _literal(value, node.site)

    def walk_rewrite(self, obj: object, site: tuple[str, int], operand: bool = False) -> None:
        if isinstance(obj, _OpNode) and id(obj) in self.match_ops:
            if obj.indexed:
                raise self.error(site, f"{obj.describe()} was indexed with [i]; refer to the indexed op instead")
            self.needs_name.add(id(obj))
        elif isinstance(obj, (_OpNode, _NativeCall)):
            if isinstance(obj, _NativeCall) and obj.required:
                raise self.error(obj.site, f"{obj.describe()} is a constraint (.require()) and cannot also be used in the rewrite")
            if id(obj) in self.rw_walking:
                raise self.error(obj.site, f"{obj.describe()} refers to itself (through .attrs())")
            self.rw_uses[id(obj)] = self.rw_uses.get(id(obj), 0) + 1
            if id(obj) in self.rw_nodes:
                return
            self.rw_nodes[id(obj)] = obj
            self.rw_walking.add(id(obj))
            if isinstance(obj, _NativeCall):
                if not is_name(obj.name):
                    raise self.error(obj.site, f"'{obj.name}' cannot be a native name")
                for a in obj.args:
                    self.walk_rewrite(a, obj.site)
            else:
                self.walk_build(obj)
            self.rw_walking.discard(id(obj))
        elif isinstance(obj, (_OpsetPick, _FirstPick)):
            for value in obj.values():
                self.walk_rewrite(value, obj.site, operand)
        elif isinstance(obj, _Field):
            if not is_name(obj.field):
                raise self.error(site, f"'{obj.field}' cannot be a result name")
            self.rw_fields.add(id(obj.call))
            self.walk_rewrite(obj.call, site)
        else:
            self.check_name_ref(obj, site, operand)

    def walk_build(self, obj: _OpNode) -> None:
        if obj.type_ref is not None and obj.type_ref not in self.type_binds:
            raise self.error(obj.site, f"op type '{obj.type_ref}' is not bound by the match")
        if obj.alternatives or obj.type_bind is not None:
            raise self.error(obj.site, "op.one_of() matches; to build the type that matched, use op.same_as(type_of(...))")
        if obj.output != 0:
            raise self.error(obj.site, f"{obj.describe()}[{obj.output}]: output selection is only for matched ops")
        if not isinstance(obj.num_outputs, int) or isinstance(obj.num_outputs, bool) or obj.num_outputs < 1:
            raise self.error(obj.site, f"outputs() takes a positive int, got {obj.num_outputs!r}")
        for o in obj.operands:
            self.walk_rewrite(o, obj.site, operand=True)
        for _, v in obj.attr_items:
            self.walk_rewrite(v, obj.site)
        if obj.copy_from is not None:
            src = obj.copy_from
            if not (isinstance(src, _OpNode) and id(src) in self.match_ops):
                raise self.error(obj.site, f"copy_attrs() takes a matched op, not {_describe(src)}")
            self.needs_name.add(id(src))

    def check_constraint_arg(self, obj: object, site: tuple[str, int]) -> None:
        if isinstance(obj, _OpNode):
            if id(obj) not in self.match_ops:
                raise self.error(site, f"constraint argument {obj.describe()} is not part of the match")
            self.needs_name.add(id(obj))
        elif isinstance(obj, (_NativeCall, _Field)):
            raise self.error(site, f"constraint arguments must be parameters, matched ops, attr(...) or literals, not {_describe(obj)}")
        else:
            self.check_name_ref(obj, site, operand=False)

    def check_name_ref(self, obj: object, site: tuple[str, int], operand: bool) -> None:
        """A leaf of the rewrite or a constraint: a bound name, a literal, or (operand) None."""
        if isinstance(obj, _Value):
            if obj.name not in self.used_params:
                raise self.error(site, f"parameter '{obj.name}' is not bound by the match")
        elif isinstance(obj, _AttrSpec):
            if obj.bind is None or obj.equals is not MISSING or obj.default is not MISSING:
                raise self.error(site, 'in the rewrite, attr() takes just the name of a bound attribute: attr("eps")')
            if obj.bind not in self.attr_binds:
                raise self.error(site, f"attribute binding '{obj.bind}' is not bound by the match")
        elif isinstance(obj, _NameRef):
            if obj.name not in (self.tags if obj.kind == "tag" else self.type_binds):
                raise self.error(site, f"{obj.describe()} is not bound by the match")
        elif obj is None:
            if not operand:
                raise self.error(site, "None (an omitted input) can only be an operand of an op the rewrite builds")
        elif _is_literal(obj):
            _literal(obj, site)
        else:
            raise self.error(site, f"{_describe(obj)} cannot be used in the rewrite")

    def check_everything_used(self, replaces: list[_Replace]) -> None:
        returned = {id(r) for r in replaces}
        for sym in self.recording.created:  # first: a forgotten replace explains the unused ops it holds
            if isinstance(sym, _Replace) and id(sym) not in returned:
                raise self.error(sym.site, "this replace(...) is not returned by the function")
        for sym in self.recording.created:
            if isinstance(sym, _OpNode) and not sym.indexed and id(sym) not in self.match_ops and id(sym) not in self.rw_nodes:
                raise self.error(sym.site, f"{sym.describe()} is neither connected to the root nor used by the replacement")
            if isinstance(sym, _Alt) and id(sym) not in self.match_ops:
                raise self.error(sym.site, f"{sym.describe()} is not connected to the root")
            if isinstance(sym, _NativeCall) and not sym.required and id(sym) not in self.rw_nodes:
                raise self.error(
                    sym.site, f"{sym.describe()} is not used: call .require() to make it a constraint, or use its result in the replacement"
                )

    def assign_names(self, root: _OpNode) -> None:
        self.op_names: dict[int, str] = {}
        for key, node in self.match_ops.items():
            if isinstance(node, _OpNode) and key in self.local_names:
                self.claim(self.local_names[key], f"matched {node.describe()}", node.site)
                self.op_names[key] = self.local_names[key]
        self.let_names: dict[int, str] = {}
        for key, value in self.rw_nodes.items():
            if key in self.local_names:
                self.claim(self.local_names[key], f"rewrite value {value.describe()}", value.site)
                self.let_names[key] = self.local_names[key]
        # Generated names only where the rule needs one, in creation order for stable output.
        for key, node in sorted(self.match_ops.items(), key=lambda kv: kv[1].seq):
            if isinstance(node, _OpNode) and key not in self.op_names:
                if node is root or key in self.needs_name or self.match_uses[key] > 1:
                    self.op_names[key] = self.fresh(node.op_type)
        for key, value in sorted(self.rw_nodes.items(), key=lambda kv: kv[1].seq):
            if key not in self.let_names and (self.rw_uses[key] > 1 or key in self.rw_fields):
                self.let_names[key] = self.fresh(value.op_type if isinstance(value, _OpNode) else value.name)

    # -------------------------------------------------------------- IR
    def build(self, root: _OpNode, replaces: list[_Replace]) -> Rule:
        self.match_ir: dict[int, MatchNode] = {}
        root_ir = self.to_match(root)
        assert isinstance(root_ir, OpMatch)
        body = self.statements(replaces)
        constraints = tuple(Call(c.name, tuple(self.to_expr(a) for a in c.args)) for c in self.recording.required)  # type: ignore[misc]
        natives: dict[tuple[str, str], NativeDecl] = {}
        for sym in self.recording.created:
            if isinstance(sym, _NativeCall):
                kind = "Constraint" if sym.required else "Rewrite"
                natives.setdefault((kind, sym.name), NativeDecl(kind, sym.name, loc=_site_loc(*sym.site)))
        return Rule(self.name, root_ir, body, constraints, self.benefit, self.doc, self.loc, guards=self.guards, natives=tuple(natives.values()))

    def to_match(self, node: object) -> MatchNode:
        if isinstance(node, _Value):
            return Var(node.name, node.constraints, node.optional)
        if isinstance(node, _Wildcard):
            return Var("_", node.constraints, node.optional)
        if id(node) in self.match_ir:
            return self.match_ir[id(node)]
        if isinstance(node, _Alt):
            out: MatchNode = AltMatch(node.tag_var, tuple((label, self.to_match(b)) for label, b in node.branches))
        else:
            assert isinstance(node, _OpNode)
            attrs = tuple(self.attr_match(k, v, node.site) for k, v in node.attr_items)
            operands = tuple(self.to_match(o) for o in node.operands)
            out = OpMatch(
                node.op_type, node.domain, operands, attrs, self.op_names.get(id(node)), node.output,
                shared=node.is_shared, alternatives=node.alternatives, type_bind=node.type_bind,
            )
        self.match_ir[id(node)] = out
        return out

    @staticmethod
    def attr_match(key: str, value: object, site: tuple[str, int]) -> AttrMatch:
        if isinstance(value, _AttrSpec):
            equals = value.equals if value.equals is MISSING else _literal(value.equals, site)
            default = value.default if value.default is MISSING else _literal(value.default, site)
            return AttrMatch(key, equals, value.bind, default)
        return AttrMatch(key, _literal(value, site))

    def statements(self, replaces: list[_Replace]) -> tuple[Statement, ...]:
        """Lets and replaces in creation order, each let after the lets it uses."""
        body: list[Statement] = []
        emitted: set[int] = set()

        def emit(node: _OpNode | _NativeCall) -> None:
            if id(node) in emitted:
                return
            emitted.add(id(node))
            for dep in self.let_deps(node):
                emit(dep)
            body.append(Let(self.let_names[id(node)], self.value_expr(node)))

        def emit_for(value: object) -> None:
            target = value.call if isinstance(value, _Field) else value
            if isinstance(target, (_OpNode, _NativeCall)) and id(target) in self.let_names:
                emit(target)
            else:
                for dep in self.let_deps(target):
                    emit(dep)

        items: list[_Sym] = [n for k, n in self.rw_nodes.items() if k in self.let_names] + list(replaces)
        for item in sorted(items, key=lambda s: s.seq):
            if isinstance(item, _Replace):
                for v in item.values:
                    emit_for(v)
                body.append(Replace(self.op_names[id(item.target)], tuple(self.to_expr(v) for v in item.values)))  # type: ignore[misc]
            else:
                emit(item)  # type: ignore[arg-type]
        return tuple(body)

    def let_deps(self, obj: object) -> list[_OpNode | _NativeCall]:
        """The let-bound rewrite values that `obj`'s expression refers to directly."""
        if isinstance(obj, _Field):
            return self.let_deps(obj.call)
        if isinstance(obj, (_OpsetPick, _FirstPick)):
            children = obj.values()
        elif not (isinstance(obj, (_OpNode, _NativeCall)) and id(obj) in self.rw_nodes):
            return []
        else:
            children = list(obj.args) if isinstance(obj, _NativeCall) else list(obj.operands) + [v for _, v in obj.attr_items]
        deps: list[_OpNode | _NativeCall] = []
        for c in children:
            target = c.call if isinstance(c, _Field) else c
            if isinstance(target, (_OpNode, _NativeCall)) and id(target) in self.let_names:
                deps.append(target)
            else:
                deps += self.let_deps(target)
        return deps

    def value_expr(self, obj: _OpNode | _NativeCall) -> Expr:
        """The full expression of a rewrite value (not a reference to its let)."""
        if isinstance(obj, _NativeCall):
            return Call(obj.name, tuple(self.to_expr(a) for a in obj.args))  # type: ignore[misc]
        copy_from = self.op_names[id(obj.copy_from)] if obj.copy_from is not None else None
        return Build(
            obj.op_type,
            obj.domain,
            tuple(self.to_expr(o) for o in obj.operands),
            tuple((k, self.to_expr(v)) for k, v in obj.attr_items),  # type: ignore[misc]
            copy_from,
            obj.num_outputs,
            obj.type_ref,
        )

    def to_expr(self, obj: object) -> Expr | None:
        if isinstance(obj, _OpNode) and id(obj) in self.match_ops:
            return Ref(self.op_names[id(obj)])
        if isinstance(obj, (_OpNode, _NativeCall)):
            return Ref(self.let_names[id(obj)]) if id(obj) in self.let_names else self.value_expr(obj)
        if isinstance(obj, _Field):
            return Ref(self.let_names[id(obj.call)], obj.field)
        if isinstance(obj, _Value):
            return Ref(obj.name)
        if isinstance(obj, _AttrSpec):
            return Ref(obj.bind)  # type: ignore[arg-type]  # checked in check_name_ref
        if isinstance(obj, _NameRef):
            return Ref(obj.name)
        if isinstance(obj, _FirstPick):
            return FirstOf(tuple(self.to_expr(o) for o in obj.options))  # type: ignore[misc]
        if isinstance(obj, _OpsetPick):
            branches = tuple((guard, self.to_expr(value)) for guard, value in obj.branches)
            return OpsetChoose(obj.branches[0][0].domain, branches)  # type: ignore[arg-type]
        if obj is None:
            return None
        return Lit(_literal(obj, self.def_site))
