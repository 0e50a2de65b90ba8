"""Stable names for the values of an emitted graph function.

A value is named from the module that computed it and the role it plays
there, never from a counter over the whole graph, so that adding, removing or
changing one module renames only that module's values:

- A module path becomes its identifier: ``layer1.0.conv1`` -> ``layer1_0_conv1``.
- A module whose nodes in the graph are a single node names its output by the
  path alone: the Conv of ``layer1.0.conv1`` is ``layer1_0_conv1``.
- A module with several nodes adds each node's role, the op in snake case
  (a few shortened: ``matmul``, ``batch_norm``, ``layer_norm``, ``nll_loss``):
  ``layer1_0_relu``, ``layer1_0_add``, ``attn_matmul``, ``attn_softmax``.
- Nodes outside any module (the root module's own ops, the loss graph) are
  named by role alone: ``relu``, ``log_softmax``, ``nll_loss``.
- A path that starts with a digit (an ``nn.Sequential`` index) puts the role
  first: the Gemm of module ``0`` is ``gemm_0``.
- A node's further outputs are the module's path and the output's name in
  the op's schema: ``drop_mask`` (Dropout), ``bn1_new_running_mean``,
  ``lstm_y_h`` (role-named first outputs get the suffix after the role).
- Names are unique within their function only: a repeated name takes
  ``_1``, ``_2``, ... in order of definition (the second ReLU of block
  ``layer1.0`` is ``layer1_0_relu_1``); the counter is the module's own,
  since no other module's names share its prefix.

Every candidate passes through the function's ``Namespace`` (which sanitises
and reserves keywords, builtins, the program's own names, its data inputs and
parameter locals, bound first), so no text from a log reaches a program raw
and no value takes a name already in use.
"""

from __future__ import annotations

import re
from collections import Counter

from tracelog.ir import Graph, Node
from tracelog.ops import OPS

_ILLEGAL = re.compile(r"[^0-9a-zA-Z_]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")

# roles shorter than their op's snake case
_ROLES = {
    "MatMul": "matmul",
    "BatchNormalization": "batch_norm",
    "BatchNormTraining": "batch_norm",
    "LayerNormalization": "layer_norm",
    "GroupNormalization": "group_norm",
    "InstanceNormalization": "instance_norm",
    "NegativeLogLikelihoodLoss": "nll_loss",
    "SoftmaxCrossEntropyLoss": "cross_entropy",
}


def role(op: str) -> str:
    """The role word of an op: ``LogSoftmax`` -> ``log_softmax``."""
    return _ROLES.get(op) or _CAMEL.sub("_", op).lower()


def _path(module: str) -> str:
    """A module path as identifier text (possibly empty): not yet a name."""
    return _ILLEGAL.sub("_", module).strip("_")


def _output_suffix(node: Node, k: int) -> str:
    """The suffix of a node's k-th output (k >= 1): its schema name, or none
    for a variadic output (the namespace numbers those)."""
    schema = OPS.get((node.domain, node.op))
    outputs = schema.outputs if schema is not None else ()
    if k >= len(outputs) or outputs[k].endswith("*"):
        return ""
    return "_" + _path(_CAMEL.sub("_", outputs[k].rstrip("?"))).lower()


def value_candidates(graph: Graph) -> dict[str, str]:
    """IR value name -> the candidate name of each node output, before the
    function's namespace makes it a unique identifier."""
    counts = Counter(n.module for n in graph.nodes)
    found: dict[str, str] = {}
    for node in graph.nodes:
        path, op_role = _path(node.module), role(node.op)
        if not path:
            base = op_role
        elif path[0].isdigit():
            base = f"{op_role}_{path}"
        elif counts[node.module] == 1:
            base = path
        else:
            base = f"{path}_{op_role}"
        for k, out in enumerate(node.outputs):
            suffix = _output_suffix(node, k) if k else ""
            if out and suffix and path and not path[0].isdigit():
                found[out] = path + suffix  # bn1_new_running_mean, not bn1_batch_norm_new_...
            elif out:
                found[out] = base + suffix
    return found
