"""A user rule in the embedded Python form (load with `--patterns examples/custom_patterns`).

Parameters are the pattern's variables, their annotations its constraints; the
body builds the match with `op.*` and returns the replacement. It is the same
pattern IR as the .pdll file beside it would give
(`graphopt.pattern.printer.print_rule(ReluOfRelu)` prints it as text).
"""

from graphopt.pattern.python import op, replace, rule


@rule
def ReluOfRelu(x):
    """Relu(Relu(x)) -> Relu(x): Relu is idempotent"""
    inner = op.Relu(x)
    outer = op.Relu(inner)
    return replace(outer, op.Relu(x))
