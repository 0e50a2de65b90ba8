"""Fusions the adapters apply to every graph they record, before hashing: the
adapter rules write each source op as plain IR, and these rules fold the
patterns into the op a target runs fused. A stored log holds the fused form.

Each adapter names the rewrites it applies (``tracelog.adapters.builder.
use_rewrites``): the rules here hold for any graph, but a log must stay what
the adapter recorded before, so an adapter opts in per rule set.
"""

from __future__ import annotations

from tracelog.ir import Node, dim_scale, is_symbolic
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


def _repeat_as_resize(m: Match) -> list[Node] | None:
    """x with a new axis a + 1, tiled r times there, the two axes merged: each
    element along axis a repeated r times (tf.repeat; Keras' nearest
    UpSampling). That is ONNX Resize nearest over axis a at scale r with
    asymmetric coordinates and floor: out[i] = x[floor(i / r)]."""
    x, out = m.type(m["x"]), m.type(m.root.outputs[0])
    given, reps = m.ints(m["axis"]), m.ints(m["reps"])
    rank = len(x.shape)
    if given is None or reps is None or len(given) != 1 or len(reps) != rank + 1:
        return None
    a = given[0] % (rank + 1) - 1
    r = reps[a + 1] if a >= 0 else 0
    if r < 2 or any(k != 1 for i, k in enumerate(reps) if i != a + 1):
        return None
    d = x.shape[a]
    merged = dim_scale(d, r) if is_symbolic(d) else int(d) * r
    if tuple(out.shape) != (*x.shape[:a], merged, *x.shape[a + 1 :]) or out.dtype != x.dtype:
        return None
    scales = m.const([float(r)], "float32")
    return [m.node_as("Resize", [m["x"], "", scales], _NEAREST_FLOOR, axes=[a])]


_NEAREST_FLOOR = {
    "mode": "nearest",
    "coordinate_transformation_mode": "asymmetric",
    "nearest_mode": "floor",
}


def _resizes_merged(m: Match) -> list[Node] | None:
    """Nearest resizes (by scales) of disjoint axes, one after the other: one
    Resize of both sets of axes (each axis is resized on its own)."""
    inner, outer = m.nodes["inner"], m.root
    if any(n.attrs.get(k) != v for n in (inner, outer) for k, v in _NEAREST_FLOOR.items()):
        return None
    if set(inner.attrs) != set(outer.attrs) or set(inner.attrs) != {*_NEAREST_FLOOR, "axes"}:
        return None
    rank = len(m.type(m["x"]).shape)
    a1 = [a % rank for a in inner.ints_attr("axes")]
    a2 = [a % rank for a in outer.ints_attr("axes")]
    s1, s2 = m.floats(m["s1"]), m.floats(m["s2"])
    if s1 is None or s2 is None or set(a1) & set(a2) or len(s1) != len(a1) or len(s2) != len(a2):
        return None
    axes, scales = zip(*sorted(zip(a1 + a2, s1 + s2, strict=True)), strict=True)
    merged = m.const(list(scales), "float32")
    return [m.node_as("Resize", [m["x"], "", merged], _NEAREST_FLOOR, axes=list(axes))]


REPEATS = Rewrites(
    [
        # Reshape(Tile(Unsqueeze(x, [a + 1]), r at a + 1), x's shape with axis a * r)
        #   -> Resize(x, scales=[r], axes=[a], nearest, asymmetric, floor)   (tf.repeat)
        (P("Reshape", P("Tile", P("Unsqueeze", "x", "axis"), "reps"), None), _repeat_as_resize),
        # Resize(Resize(x, s1, axes A), s2, axes B), nearest, A and B disjoint
        #   -> Resize(x, s1 + s2, axes A + B)   (UpSampling2D: a repeat per axis)
        (
            P("Resize", P("Resize", "x", None, "s1", name="inner"), None, "s2"),
            _resizes_merged,
        ),
    ]
)


def _softmax_axis(m: Match) -> list[Node] | None:
    """Transpose(p) -> (Log)Softmax over the last axis -> Transpose(p^-1):
    the softmax over axis p[-1] of x (TF's softmax over a non-last axis)."""
    p, back = m.nodes["into"].ints_attr("perm"), m.root.ints_attr("perm")
    sm = m.nodes["softmax"]
    rank = len(p)
    if len(back) != rank or any(p[back[i]] != i for i in range(rank)):
        return None
    if sm.int_attr("axis", -1) % rank != rank - 1:
        return None
    return [m.node_as(sm.op, [m["x"]], axis=p[-1])]


SOFTMAX_AXES = Rewrites(
    [
        # Transpose(Softmax(Transpose(x, p), axis=-1), p^-1) -> Softmax(x, axis=p[-1])
        (
            P(
                "Transpose",
                P(
                    ("Softmax", "LogSoftmax"),
                    P("Transpose", "x", name="into"),
                    name="softmax",
                ),
            ),
            _softmax_axis,
        ),
    ]
)
