"""Rounding divisions and remainders in ONNX ops, shared by the adapters: each
framework's kernels (torch's BinaryOpsKernel.cpp, TensorFlow's cwise_ops.h)
start from C's fmod (ONNX Mod, fmod=1) or the truncated quotient and correct
it by the operands' signs."""

from __future__ import annotations

from tracelog.adapters.builder import Ctx
from tracelog.ir import TensorType


def is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint", "bool"))


def _zero(ctx: Ctx, ty: TensorType) -> str:
    return ctx.const(0 if is_int(ty.dtype) else 0.0, ty.dtype)


def signs_differ(ctx: Ctx, u: str, v: str, ty: TensorType) -> str:
    """(u < 0) != (v < 0)."""
    mask = TensorType("bool", ty.shape)
    u_neg = ctx.helper("Less", [u, _zero(ctx, ty)], mask)
    v_neg = ctx.helper("Less", [v, _zero(ctx, ty)], mask)
    return ctx.helper("Xor", [u_neg, v_neg], mask)


def nonzero(ctx: Ctx, u: str, ty: TensorType) -> str:
    mask = TensorType("bool", ty.shape)
    return ctx.helper("Not", [ctx.helper("Equal", [u, _zero(ctx, ty)], mask)], mask)


def fmod_of(ctx: Ctx, a: str, b: str, ty: TensorType) -> str:
    """C's fmod: the dividend's sign."""
    return ctx.helper("Mod", [a, b], ty, fmod=1)


def floor_mod_of(ctx: Ctx, a: str, b: str, ty: TensorType) -> str:
    """Python's a % b, the divisor's sign. Integers: ONNX Mod (fmod=0, which
    ONNX defines for integers only); floats: m = fmod(a, b), m + b where m is
    not 0 and its sign is not b's."""
    if is_int(ty.dtype):
        return ctx.helper("Mod", [a, b], ty)
    m = fmod_of(ctx, a, b, ty)
    mask = TensorType("bool", ty.shape)
    fix = ctx.helper("And", [nonzero(ctx, m, ty), signs_differ(ctx, b, m, ty)], mask)
    return ctx.helper("Where", [fix, ctx.helper("Add", [m, b], ty), m], ty)


def int_floor_div_of(ctx: Ctx, a: str, b: str, ty: TensorType) -> str:
    """An integer a // b: the truncated quotient (ONNX integer Div), less 1
    where the signs differ and the division is not exact."""
    q = ctx.helper("Div", [a, b], ty)
    if ty.dtype.startswith(("uint", "bool")):
        return q
    m = fmod_of(ctx, a, b, ty)
    mask = TensorType("bool", ty.shape)
    fix = ctx.helper("And", [signs_differ(ctx, a, b, ty), nonzero(ctx, m, ty)], mask)
    return ctx.helper("Where", [fix, ctx.helper("Sub", [q, ctx.const(1, ty.dtype)], ty), q], ty)


def trunc_of(ctx: Ctx, x: str, ty: TensorType) -> str:
    """trunc(x): ceil below 0, floor elsewhere (ONNX has no Trunc); no gradient."""
    below = ctx.helper("Less", [x, ctx.const(0.0, ty.dtype)], TensorType("bool", ty.shape))
    return ctx.helper(
        "Where", [below, ctx.helper("Ceil", [x], ty), ctx.helper("Floor", [x], ty)], ty
    )


def sign_of(ctx: Ctx, x: str, ty: TensorType) -> str:
    """(x > 0) - (x < 0) in x's dtype; no gradient, as torch's and TensorFlow's."""
    dt, mask = ty.dtype, TensorType("bool", ty.shape)
    zero = ctx.const(0.0 if dt.startswith(("float", "bfloat")) else 0, dt)
    positive = ctx.helper("Cast", [ctx.helper("Greater", [x, zero], mask)], ty, to=dt)
    negative = ctx.helper("Cast", [ctx.helper("Less", [x, zero], mask)], ty, to=dt)
    return ctx.helper("Sub", [positive, negative], ty)
