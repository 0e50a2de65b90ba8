"""Dense linear algebra of training code (torch.linalg): inverse, solve,
determinants, Cholesky, triangular solves, over the last two dims with any
batch dims before them. Each is one IR op (ONNX's Det, tracelog's Inverse,
Solve, SlogDet, Cholesky, SolveTriangular): every target runs its own
factorisation, and its autodiff gives the gradient. The LU factors, pivots
and error codes aten returns beside the result are for its own backward and
error checks: nothing of the graph reads them.

Registered into ``ATEN`` on import (the last line of ``rules.py``)."""

from __future__ import annotations

from tracelog.adapters.builder import Ctx, NotSupported
from tracelog.adapters.torch.rules import ATEN, Names


def _linalg(ctx: Ctx, op: str, n_inputs: int, **attrs: int) -> list[str]:
    """The op's results (the record's first outputs), in the record's dtypes."""
    n_out = 2 if op == "SlogDet" else 1
    domain = "" if op == "Det" else "tracelog"
    return ctx.node(op, [ctx.t(i) for i in range(n_inputs)], outs=n_out, domain=domain, **attrs)


@ATEN.register("aten.linalg_inv_ex.default")
def _inv(ctx: Ctx) -> Names:
    # (inverse, info)
    return [*_linalg(ctx, "Inverse", 1), None]


@ATEN.register("aten._linalg_solve_ex.default")
def _solve(ctx: Ctx) -> Names:
    # (result, LU, pivots, info); torch.linalg.solve(A, B, left=False) solves X A = B
    if not bool(ctx.arg(2, "left", True)):
        raise NotSupported("linalg.solve with left=False")
    if len(ctx.in_type(1).shape) == len(ctx.in_type(0).shape) - 1:
        raise NotSupported("linalg.solve of a batch of vectors (B one dim short of A)")
    return [*_linalg(ctx, "Solve", 2), None, None, None]


@ATEN.register("aten._linalg_det.default")
def _det(ctx: Ctx) -> Names:
    # (det, LU, pivots)
    return [*_linalg(ctx, "Det", 1), None, None]


@ATEN.register("aten._linalg_slogdet.default")
def _slogdet(ctx: Ctx) -> Names:
    # (sign, logabsdet, LU, pivots)
    return [*_linalg(ctx, "SlogDet", 1), None, None]


@ATEN.register("aten.linalg_cholesky_ex.default")
def _cholesky(ctx: Ctx) -> Names:
    # (L, info); upper=True: L's transpose (U^T U = A)
    upper = bool(ctx.arg(1, "upper", False))
    if not upper:
        return [*_linalg(ctx, "Cholesky", 1), None]
    out = ctx.out_type()
    (lower,) = ctx.node("Cholesky", [ctx.t(0)], outs=[out], domain="tracelog")
    rank = len(out.shape)
    perm = [*range(rank - 2), rank - 1, rank - 2]
    return [*ctx.node("Transpose", [lower], outs=1, perm=perm), None]


@ATEN.register("aten.linalg_solve_triangular.default")
def _solve_triangular(ctx: Ctx) -> Names:
    upper = bool(ctx.arg(2, "upper"))
    if not bool(ctx.arg(3, "left", True)) or bool(ctx.arg(4, "unitriangular", False)):
        raise NotSupported("solve_triangular with left=False or unitriangular=True")
    return _linalg(ctx, "SolveTriangular", 2, upper=int(upper))


@ATEN.register("aten.cholesky_solve.default")
def _cholesky_solve(ctx: Ctx) -> Names:
    # X with A X = B, A = L L^T given L (upper: A = U^T U given U): two
    # triangular solves, by the factor and by its transpose
    ft = ctx.in_type(1)
    upper = bool(ctx.arg(2, "upper", False))
    rank = len(ft.shape)
    perm = [*range(rank - 2), rank - 1, rank - 2]
    factor = ctx.t(1)
    turned = ctx.helper("Transpose", [factor], ft, perm=perm)
    first, second = (turned, factor) if upper else (factor, turned)
    out = ctx.out_type()
    y = ctx.helper("SolveTriangular", [first, ctx.t(0)], out, domain="tracelog", upper=0)
    return ctx.one("SolveTriangular", [second, y], domain="tracelog", upper=1)


@ATEN.register("aten._linalg_check_errors.default")
def _check_errors(ctx: Ctx) -> Names:
    # raises in the source on a singular input; computes nothing
    return []
