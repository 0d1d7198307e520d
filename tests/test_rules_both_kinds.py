"""One rule, both graph kinds (tests/both_kinds.py): each case of tests/both_kinds_cases.py
applies one rule to the ONNX export of a torch module and to the FX graph of the same
module, and must rewrite the expected number of times on each, with the module's outputs.
Every built-in rule is proven on both kinds or says in its .pdll file why it serves one.

`python tests/both_kinds.py` prints the per-rule table.
"""

from __future__ import annotations

import pytest
from both_kinds import Case, coverage, one_kind_reasons, run_case
from both_kinds_cases import CASES, NEGATIVE_CASES

from graphopt.api import builtin_rules

#: Rules proven on both kinds by CASES (a floor: raise it as rules join, never lower it).
PROVEN_ON_BOTH_AT_LEAST = 60  # of 74 (81 %; 59 of 72 before FuseRMSNormDowncast (both) and FuseGatedGelu (FX only); 55 of 68 before FuseLayerNormMoments, FuseLayerNormUnscaled, FoldScaleIntoLayerNorm and FoldBiasIntoLayerNorm came in on both kinds; 53 of 66 before FuseRMSNormUpcast and FuseLayerNormSecondMoment came in on both kinds; issue 13's goal is 80 %; 51 of 66 when DropZeroPad, CollapseShapeOps and ConstantReshapeTarget came in ONNX only, 50 of 62 before; 48 before gqa.pdll's two rules got an FX side); 28 of 69 before hard_activations, linear_affine, bias_fold, cleanup, FusedConv, GroupNorm, Attention, GemmActivation and GeGLU rules were proven on both, and cloned families became one rule each


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rule_rewrites_the_same_on_both_kinds(case: Case) -> None:
    outcome = run_case(case)
    if "onnx" in case.kinds:
        assert outcome.onnx_problem is None, outcome.onnx_problem
        assert outcome.onnx_rewrites == case.count, f"ONNX: {outcome.onnx_rewrites} rewrites; near-misses {outcome.onnx_misses[:3]}"
    if "fx" in case.kinds:
        assert outcome.fx_problem is None, outcome.fx_problem
        assert outcome.fx_rewrites == case.count, f"FX: {outcome.fx_rewrites} rewrites; near-misses {outcome.fx_misses[:3]}"


@pytest.mark.parametrize("case", NEGATIVE_CASES, ids=[c.id for c in NEGATIVE_CASES])
def test_rule_does_not_fire_on_a_look_alike_on_either_kind(case: Case) -> None:
    assert case.count == 0
    outcome = run_case(case)
    assert (outcome.onnx_problem, outcome.fx_problem) == (None, None)
    assert (outcome.onnx_rewrites, outcome.fx_rewrites) == (0, 0)


def test_every_case_names_a_rule_of_the_library() -> None:
    names = {r.name for r in builtin_rules()}
    assert [c.rule for c in [*CASES, *NEGATIVE_CASES] if c.rule not in names] == []
    assert [a for c in [*CASES, *NEGATIVE_CASES] for a in c.along if a not in names] == []


def test_every_rule_is_proven_on_both_kinds_or_says_why() -> None:
    reasons = one_kind_reasons()
    on_both = {c.rule for c in CASES if len(c.kinds) == 2}
    one_kind = {c.rule: c.kinds[0] for c in CASES if len(c.kinds) == 1}
    names = [r.name for r in builtin_rules()]
    assert [n for n in names if n not in on_both and n not in reasons] == [], "neither a both-kinds case nor a '// ONNX only:' / '// FX only:' line"
    assert sorted(on_both & set(reasons)) == [], "proven on both kinds, yet its file says it serves one"
    assert {n: k for n, k in one_kind.items() if reasons.get(n, ("?",))[0].lower() != k} == {}, "a one-kind case on the other kind than its file says"


def test_share_of_rules_proven_on_both_kinds_does_not_drop() -> None:
    names = {r.name for r in builtin_rules()}
    on_both = {c.rule for c in CASES if len(c.kinds) == 2} & names
    assert len(on_both) >= PROVEN_ON_BOTH_AT_LEAST, f"{len(on_both)} of {len(names)} rules have a both-kinds case"
    assert len(on_both) >= 0.8 * len(names), f"{len(on_both)} of {len(names)} rules proven on both kinds: under 80 %"


def test_coverage_table_reports_a_failing_case() -> None:
    """The table says FAILED, not "both", when a case does not rewrite as it claims."""
    wrong = next(c for c in CASES if c.rule == "CollapseCastChain")
    claims_two = Case(wrong.rule, wrong.module, wrong.inputs, count=2)
    table = coverage([claims_two], names=["CollapseCastChain"])
    assert table["CollapseCastChain"].startswith("FAILED CollapseCastChain: onnx 1, fx 1, expected 2")
