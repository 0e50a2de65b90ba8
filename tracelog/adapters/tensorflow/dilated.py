"""SpaceToBatchND and BatchToSpaceND, and the dilated convolutions TensorFlow
builds from them.

TensorFlow's CPU convolutions take no dilation: ``tf.nn.convolution`` runs a
dilated one as SpaceToBatchND(x, block, pads) + the convolution at dilation 1
(strides 1) + BatchToSpaceND(y, block, crops) (``_WithSpaceToBatch`` in
tensorflow/python/ops/nn_ops.py). Each op has a plain rule here (Pad,
Reshape, Transpose, Reshape; and back), right wherever it occurs. Between
the two, a stride-1 convolution over the blocked axes reads each of the
block's interleaved sub-images alone, which is the convolution of the padded
input at dilation block * d: so BatchToSpaceND, when its input comes from
SpaceToBatchND through one Conv and only shape ops (Unsqueeze, Squeeze,
Transpose: Keras' 1-D convolutions), is written as that one Conv on the
SpaceToBatchND's input, its pads the block's pads plus block * the inner
pads, less the crops. The plain nodes it bypasses are then read by nothing,
and leave the graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tracelog.adapters.builder import Ctx, NotSupported
from tracelog.adapters.tensorflow.rules import TF_OPS, Names, const_array
from tracelog.ir import Node, TensorType, is_symbolic

_BIG = 2**62  # a Slice end past any size


@dataclass(frozen=True)
class Blocked:
    """What SpaceToBatchND made a value from: ``base`` (channels-last, its
    spatial axes 1..M blocked by ``block``), padded by ``pads`` (begin, end)."""

    base: str
    base_type: TensorType
    block: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]


def _notes(ctx: Ctx) -> dict[str, Blocked]:
    """The SpaceToBatchND outputs of this tape, by IR name."""
    found: dict[str, Blocked] = ctx.b.notes.setdefault("space_to_batch", {})
    return found


def _block_args(ctx: Ctx, rank: int) -> tuple[list[int], list[tuple[int, int]]]:
    """(block_shape, [(begin, end)] per blocked axis) of a SpaceToBatchND or
    BatchToSpaceND, when known at recording time."""
    block, pads = const_array(ctx, 1), const_array(ctx, 2)
    if block is None or pads is None:
        raise NotSupported(f"{ctx.rec.op} with a block or paddings computed at run time")
    b = [int(v) for v in block.reshape(-1)]
    p = [(int(lo), int(hi)) for lo, hi in pads.reshape(-1, 2)]
    if len(b) != len(p) or not 1 <= len(b) < rank:
        raise NotSupported(f"{ctx.rec.op} with block {b} and paddings {p}")
    return b, p


def _static_dims(ctx: Ctx, ty: TensorType, axes: Sequence[int]) -> list[int]:
    dims = [ty.shape[a] for a in axes]
    if any(is_symbolic(d) for d in dims):
        raise NotSupported(f"{ctx.rec.op} over a symbolic axis")
    return [int(d) for d in dims]


@TF_OPS.register("tf.SpaceToBatchND")
def _space_to_batch(ctx: Ctx) -> Names:
    """input [N, S1..SM, R...]: padded, each Si split into (Si / bi, bi), the
    block offsets moved in front of N: [b1 * ... * bM * N, S1 / b1, ..., R...]."""
    xt = ctx.in_type(0)
    rank = len(xt.shape)
    block, pads = _block_args(ctx, rank)
    m = len(block)
    sizes = [
        s + lo + hi
        for s, (lo, hi) in zip(_static_dims(ctx, xt, range(1, m + 1)), pads, strict=True)
    ]
    if any(s % b for s, b in zip(sizes, block, strict=True)):
        raise NotSupported(f"SpaceToBatchND of sizes {sizes} by block {block}")
    n, rest = xt.shape[0], list(xt.shape[m + 1 :])
    x = ctx.t(0)
    if any(lo or hi for lo, hi in pads):
        onnx_pads = [0, *(lo for lo, _ in pads), *[0] * len(rest)]
        onnx_pads += [0, *(hi for _, hi in pads), *[0] * len(rest)]
        x = ctx.helper(
            "Pad",
            [x, ctx.ints(onnx_pads)],
            TensorType(xt.dtype, (n, *sizes, *rest)),
            mode="constant",
        )
    split: list[int | str] = [n]
    for s, b in zip(sizes, block, strict=True):
        split += [s // b, b]
    split += rest
    x = ctx.helper("Reshape", [x, ctx.shape_const(split)], TensorType(xt.dtype, tuple(split)))
    # [N, S1/b1, b1, ..., R] -> [b1, ..., bM, N, S1/b1, ..., SM/bM, R]
    perm = [2 + 2 * i for i in range(m)] + [0] + [1 + 2 * i for i in range(m)]
    perm += list(range(2 * m + 1, 2 * m + 1 + len(rest)))
    moved = TensorType(xt.dtype, tuple(split[p] for p in perm))
    x = ctx.helper("Transpose", [x], moved, perm=perm)
    out = ctx.one("Reshape", [x, ctx.shape_const(list(ctx.out_type().shape))])
    _notes(ctx)[out[0]] = Blocked(ctx.t(0), xt, tuple(block), tuple(pads))
    return out


@TF_OPS.register("tf.BatchToSpaceND")
def _batch_to_space(ctx: Ctx) -> Names:
    """input [b1 * ... * bM * N, S1..SM, R...]: the block offsets moved back
    beside their axes, [N, S1 * b1, ..., R...], then cropped by crops."""
    yt = ctx.in_type(0)
    rank = len(yt.shape)
    block, crops = _block_args(ctx, rank)
    fused = _dilated_conv(ctx, block, crops)
    if fused is not None:
        return fused
    m = len(block)
    sizes = _static_dims(ctx, yt, range(1, m + 1))
    out = ctx.out_type()
    n, rest = out.shape[0], list(yt.shape[m + 1 :])
    split: list[int | str] = [*block, n, *sizes, *rest]
    y = ctx.helper(
        "Reshape", [ctx.t(0), ctx.shape_const(split)], TensorType(yt.dtype, tuple(split))
    )
    # [b1, ..., bM, N, S1, ..., SM, R] -> [N, S1, b1, ..., SM, bM, R]
    perm = [m]
    for i in range(m):
        perm += [m + 1 + i, i]
    perm += list(range(2 * m + 1, 2 * m + 1 + len(rest)))
    moved = TensorType(yt.dtype, tuple(split[p] for p in perm))
    y = ctx.helper("Transpose", [y], moved, perm=perm)
    whole: list[int | str] = [n, *(s * b for s, b in zip(sizes, block, strict=True)), *rest]
    if not any(lo or hi for lo, hi in crops):
        return ctx.one("Reshape", [y, ctx.shape_const(whole)])
    y = ctx.helper("Reshape", [y, ctx.shape_const(whole)], TensorType(yt.dtype, tuple(whole)))
    starts = [lo for lo, _ in crops]
    ends = [-hi if hi else _BIG for _, hi in crops]
    axes = list(range(1, m + 1))
    return ctx.one("Slice", [y, ctx.ints(starts), ctx.ints(ends), ctx.ints(axes)])


def _producer(ctx: Ctx, name: str) -> Node | None:
    for node in reversed(ctx.b.nodes):
        if name in node.outputs:
            return node
    return None


def _const_ints(ctx: Ctx, name: str) -> list[int] | None:
    v = ctx.b.values.get(name)
    if v is None or v.const is None or v.const.data is None:
        return None
    return [int(x) for x in np.asarray(v.const.data).reshape(-1)]


def _chain(ctx: Ctx, name: str) -> tuple[Blocked, list[Node]] | None:
    """The SpaceToBatchND that `name` comes from through shape ops and Conv
    nodes, and those nodes in order; None if it comes from elsewhere."""
    chain: list[Node] = []
    notes = _notes(ctx)
    while name not in notes:
        node = _producer(ctx, name)
        if node is None or node.op not in _THROUGH or len(chain) > 8:
            return None
        chain.append(node)
        name = node.inputs[0]
    return notes[name], chain[::-1]


_THROUGH = ("Unsqueeze", "Squeeze", "Transpose", "Conv")


def _moved(ctx: Ctx, node: Node, axes: list[int], rank_in: int) -> list[int] | None:
    """Where the blocked axes are after a shape op; None if it moves the
    batch axis or drops a blocked one."""
    if node.op == "Transpose":
        perm = node.ints_attr("perm")
        return [perm.index(a) for a in axes] if perm[0] == 0 else None
    given = _const_ints(ctx, node.inputs[1])
    if given is None:
        return None
    unsqueeze = node.op == "Unsqueeze"
    rank = rank_in + len(given) if unsqueeze else rank_in
    dims = sorted(a % rank for a in given)
    if 0 in dims or (not unsqueeze and set(dims) & set(axes)):
        return None
    for d in dims if unsqueeze else reversed(dims):
        axes = [a + (a >= d) if unsqueeze else a - (a > d) for a in axes]
    return axes


def _dilated_conv(ctx: Ctx, block: list[int], crops: list[tuple[int, int]]) -> Names | None:
    """BatchToSpaceND(ops(SpaceToBatchND(x, block, pads)), block, crops) as
    the same ops on x with the one Conv among them dilated by the block; None
    where the input is not such a chain (the plain rule then stands)."""
    found = _chain(ctx, ctx.t(0))
    if found is None:
        return None
    src, chain = found
    if list(src.block) != block or sum(n.op == "Conv" for n in chain) != 1:
        return None
    m = len(block)
    # where each blocked axis is now, and its size (the padding waits for the Conv)
    axes = list(range(1, m + 1))
    sizes = [int(d) for d in src.base_type.shape[1 : m + 1]]
    cur_shape = list(src.base_type.shape)
    steps: list[tuple[str, list[str], dict[str, object], TensorType]] = []
    for node in chain:
        out_type = ctx.b.values[node.outputs[0]].type
        attrs: dict[str, object] = dict(node.attrs)
        if node.op == "Conv":
            conv = _dilate(node, axes, src, block, crops, sizes)
            if conv is None:
                return None
            attrs.update(conv)
        else:
            moved = _moved(ctx, node, axes, len(cur_shape))
            if moved is None:
                return None
            axes = moved
        cur_shape = [cur_shape[0], *out_type.shape[1:]]
        for i, a in enumerate(axes):
            cur_shape[a] = sizes[i]
        steps.append(
            (node.op, node.inputs[1:], attrs, TensorType(out_type.dtype, tuple(cur_shape)))
        )
    if axes != list(range(1, m + 1)) or tuple(cur_shape) != ctx.out_type().shape:
        return None
    cur = src.base
    for op, rest, attrs, ty in steps[:-1]:
        cur = ctx.helper(op, [cur, *rest], ty, **attrs)
    op, rest, attrs, _ty = steps[-1]
    return ctx.one(op, [cur, *rest], **attrs)


def _dilate(
    conv: Node,
    axes: list[int],
    src: Blocked,
    block: list[int],
    crops: list[tuple[int, int]],
    sizes: list[int],
) -> dict[str, object] | None:
    """The Conv's dilations and pads on the unblocked input (channels first:
    axis a is spatial axis a - 2), updating `sizes`; None where a blocked axis
    is not a stride-1 spatial axis or the crops exceed the padding."""
    k = conv.ints_attr("kernel_shape")
    n = len(k)
    strides = conv.ints_attr("strides", [1] * n)
    dil = conv.ints_attr("dilations", [1] * n)
    pads = conv.ints_attr("pads", [0] * (2 * n))
    for i, a in enumerate(axes):
        j, b = a - 2, block[i]
        if j < 0 or strides[j] != 1:
            return None
        # the padding SpaceToBatchND added, the inner one of each sub-image
        # (b apart in x), less what BatchToSpaceND crops
        dil[j] *= b
        pads[j] = src.pads[i][0] + b * pads[j] - crops[i][0]
        pads[n + j] = src.pads[i][1] + b * pads[n + j] - crops[i][1]
        if pads[j] < 0 or pads[n + j] < 0:
            return None
        sizes[i] += pads[j] + pads[n + j] - (k[j] - 1) * dil[j]
    return {"dilations": dil, "pads": pads}
