"""Training graphs handed back to aot_autograd after graphopt's passes.

graphopt traces dynamo's graph to a functional ATen graph whose buffer updates are `copy_`
nodes at the end (BatchNorm's running statistics: `copy_(running_mean, new_mean)`). When
inductor traces that graph again for autograd, the ops that read such an input save it for
the backward (`_native_batch_norm_legit_functional` saves running_mean/var), and the trailing
`copy_` then bumps its version: "one of the variables needed for gradient computation has been
modified by an inplace operation" (ResNet-50 training through the backend on an H100, the
first time graphopt's channels-last pass made the graph its own). Readers of a mutated input
get a copy instead; the copies are as small as the buffers (a BatchNorm's C floats).
"""

from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten


def copy_mutated_inputs_for_autograd(gm: fx.GraphModule) -> int:
    """Each graph input written by `copy_` is read through one clone by its other users."""
    graph = gm.graph
    changed = 0
    for placeholder in list(graph.find_nodes(op="placeholder")):
        writes = [u for u in placeholder.users if u.target is aten.copy_.default and u.args[0] is placeholder]
        readers = [u for u in placeholder.users if u not in writes]
        if not writes or not readers:
            continue
        with graph.inserting_after(placeholder):
            copy = graph.call_function(aten.clone.default, (placeholder,))
        if "val" in placeholder.meta:
            copy.meta["val"] = placeholder.meta["val"]
        for reader in readers:
            reader.replace_input_with(placeholder, copy)
        changed += 1
    if changed:
        graph.lint()
        gm.recompile()
    return changed
