"""Fusions the adapters apply to every graph they record, before hashing: the
adapter rules write each source op as plain IR, and these rules fold the
patterns into the op a target runs fused. A stored log holds the fused form.

Each adapter names the rewrites it applies (``tracelog.adapters.builder.
use_rewrites``): the rules here hold for any graph, but a log must stay what
the adapter recorded before, so an adapter opts in per rule set.
"""

from __future__ import annotations

from tracelog.ir import Node
from tracelog.passes.rewrite import Match, P, Rewrites


def _rank2(m: Match, *values: str) -> bool:
    return all(len(m.type(v).shape) == 2 for v in values)


def _matmul_transposed_b(m: Match) -> list[Node] | None:
    if not _rank2(m, m["a"], m["w"]):
        return None
    return [m.node_as("Gemm", [m["a"], m["w"]], transB=1)]


def _gemm_transposed_b(m: Match) -> list[Node] | None:
    gemm = m.root
    if gemm.attrs.get("transA", 0) or gemm.attrs.get("transB", 0):
        return None
    return [m.node_as("Gemm", [m["a"], m["w"], *gemm.inputs[2:]], gemm.attrs, transB=1)]


# The transpose stays where something else reads it (shared=True): torch's
# `t` of a weight feeds the matmul and, now and then, other ops too.
_W_T = P("Transpose", "w", perm=[1, 0], shared=True)

GEMM_TRANSPOSES = Rewrites(
    [
        # MatMul(a, Transpose(w, [1, 0])), both 2-D -> Gemm(a, w, transB=1)  (aten t + mm)
        (P("MatMul", "a", _W_T), _matmul_transposed_b),
        # Gemm(a, Transpose(w, [1, 0]), c?) -> Gemm(a, w, c?, transB=1)  (aten t + addmm)
        (P("Gemm", "a", _W_T, ...), _gemm_transposed_b),
    ]
)
