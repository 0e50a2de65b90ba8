"""Dense linear algebra of training code (torch.linalg): inverse, solve,
determinants, Cholesky, triangular solves, over the last two dims with any
batch dims before them. Each is one IR op (ONNX's Det, tracelog's Inverse,
Solve, SlogDet, Cholesky, SolveTriangular): every target runs its own
factorisation, and its autodiff gives the gradient. The LU factors, pivots
and error codes aten returns beside the result are for its own backward and
error checks: nothing of the graph reads them.

Registered into ``ATEN`` on import (the last line of ``rules.py``)."""

from __future__ import annotations

import numpy as np

from tracelog.adapters.builder import Ctx, NotSupported
from tracelog.adapters.torch.rules import ATEN, Names
from tracelog.ir import TensorType


def _linalg(ctx: Ctx, op: str, n_inputs: int, **attrs: int) -> list[str]:
    """The op's results (the record's first outputs), in the record's dtypes."""
    n_out = 2 if op == "SlogDet" else 1
    domain = "" if op == "Det" else "tracelog"
    return ctx.node(op, [ctx.t(i) for i in range(n_inputs)], outs=n_out, domain=domain, **attrs)


def _mt_type(ty: TensorType) -> TensorType:
    """``ty`` with its last two dims swapped."""
    return TensorType(ty.dtype, (*ty.shape[:-2], ty.shape[-1], ty.shape[-2]))


def _swap_last(rank: int) -> list[int]:
    """Transpose's perm that swaps the last two of ``rank`` dims."""
    return [*range(rank - 2), rank - 1, rank - 2]


def _mt(ctx: Ctx, x: str, ty: TensorType) -> str:
    """``x`` (of type ``ty``) with its last two dims swapped (torch's ``mT``)."""
    return ctx.helper("Transpose", [x], _mt_type(ty), perm=_swap_last(len(ty.shape)))


def _eye(ctx: Ctx, ty: TensorType, what: str, dtype: str = "bool") -> str:
    """The identity of ``ty``'s last dim as a constant: a size known when
    recorded, or ``what`` is refused."""
    n = ty.shape[-1]
    if not isinstance(n, int):
        raise NotSupported(f"{what} of a batch-sized matrix")
    return ctx.const(np.eye(n, dtype=bool), dtype)


def _unit_diagonal(ctx: Ctx, a: str, ty: TensorType) -> str:
    """``a`` with ones on its diagonal (a unitriangular solve reads them so)."""
    eye = _eye(ctx, ty, "a unitriangular solve")
    return ctx.helper("Where", [eye, ctx.const(1.0, ty.dtype), a], ty)


@ATEN.register("aten.linalg_inv_ex.default")
def _inv(ctx: Ctx) -> Names:
    # (inverse, info)
    return [*_linalg(ctx, "Inverse", 1), None]


@ATEN.register("aten._linalg_solve_ex.default")
def _solve(ctx: Ctx) -> Names:
    # (result, LU, pivots, info). B is a vector, or a batch of them, where it is
    # 1-D or A's shape less its last dim (torch's linalg_solve_is_vector_rhs);
    # left=False solves X A = B, that is A^T X^T = B^T, as torch computes it
    a_t, b_t, out = ctx.in_type(0), ctx.in_type(1), ctx.out_type()
    vector = len(b_t.shape) == 1 or b_t.shape == a_t.shape[:-1]
    left = bool(ctx.arg(2, "left", True))
    a = ctx.t(0) if left else _mt(ctx, ctx.t(0), a_t)
    if vector:
        b = ctx.helper(
            "Unsqueeze", [ctx.t(1), ctx.ints([-1])], TensorType(b_t.dtype, (*b_t.shape, 1))
        )
        x = ctx.helper("Solve", [a, b], TensorType(out.dtype, (*out.shape, 1)), domain="tracelog")
        result = ctx.one("Squeeze", [x, ctx.ints([-1])])
    elif left:
        result = _linalg(ctx, "Solve", 2)
    else:
        x = ctx.helper("Solve", [a, _mt(ctx, ctx.t(1), b_t)], _mt_type(out), domain="tracelog")
        result = ctx.one("Transpose", [x], perm=_swap_last(len(out.shape)))
    return [*result, None, None, None]


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
    return [*ctx.node("Transpose", [lower], outs=1, perm=_swap_last(len(out.shape))), None]


@ATEN.register("aten.linalg_solve_triangular.default")
def _solve_triangular(ctx: Ctx) -> Names:
    # left=False solves X A = B: A^T X^T = B^T, A^T triangular the other way;
    # unitriangular=True reads ones for A's diagonal
    a_t, b_t, out = ctx.in_type(0), ctx.in_type(1), ctx.out_type()
    upper = bool(ctx.arg(2, "upper"))
    left = bool(ctx.arg(3, "left", True))
    a = ctx.t(0)
    if bool(ctx.arg(4, "unitriangular", False)):
        a = _unit_diagonal(ctx, a, a_t)
    if left:
        return ctx.one("SolveTriangular", [a, ctx.t(1)], domain="tracelog", upper=int(upper))
    x = ctx.helper(
        "SolveTriangular",
        [_mt(ctx, a, a_t), _mt(ctx, ctx.t(1), b_t)],
        _mt_type(out),
        domain="tracelog",
        upper=int(not upper),
    )
    return ctx.one("Transpose", [x], perm=_swap_last(len(out.shape)))


@ATEN.register("aten.triangular_solve.default")
def _triangular_solve(ctx: Ctx) -> Names:
    # torch.triangular_solve(B, A, upper=True, transpose=False, unitriangular=False),
    # deprecated: (X, a copy of A); transpose=True solves A^T X = B, A^T
    # triangular the other way
    a_t = ctx.in_type(1)
    upper = bool(ctx.arg(2, "upper", True))
    a = ctx.t(1)
    if bool(ctx.arg(4, "unitriangular", False)):
        a = _unit_diagonal(ctx, a, a_t)
    if bool(ctx.arg(3, "transpose", False)):
        a, upper = _mt(ctx, a, a_t), not upper
    x = ctx.one("SolveTriangular", [a, ctx.t(0)], domain="tracelog", upper=int(upper))
    return [*x, ctx.t(1)]


@ATEN.register("aten.cholesky.default")
def _cholesky_deprecated(ctx: Ctx) -> Names:
    # torch.cholesky(A, upper=False), deprecated: linalg.cholesky's factor alone
    return _cholesky(ctx)[:1]


@ATEN.register("aten.cholesky_inverse.default")
def _cholesky_inverse(ctx: Ctx) -> Names:
    # A^-1 given A's Cholesky factor: cholesky_solve of the identity
    ft = ctx.in_type(0)
    eye = _eye(ctx, ft, "cholesky_inverse", ft.dtype)
    return _factor_solves(ctx, ctx.t(0), ft, eye, bool(ctx.arg(1, "upper", False)))


def _factor_solves(ctx: Ctx, factor: str, ft: TensorType, b: str, upper: bool) -> Names:
    """X with A X = B, A = L L^T given L (upper: A = U^T U given U): two
    triangular solves, by the factor and by its transpose, as LAPACK's potrs."""
    turned = ctx.helper("Transpose", [factor], ft, perm=_swap_last(len(ft.shape)))
    first, second = (turned, factor) if upper else (factor, turned)
    out = ctx.out_type()
    y = ctx.helper("SolveTriangular", [first, b], out, domain="tracelog", upper=0)
    return ctx.one("SolveTriangular", [second, y], domain="tracelog", upper=1)


@ATEN.register("aten.cholesky_solve.default")
def _cholesky_solve(ctx: Ctx) -> Names:
    # torch.cholesky_solve(B, factor, upper=False)
    return _factor_solves(ctx, ctx.t(1), ctx.in_type(1), ctx.t(0), bool(ctx.arg(2, "upper", False)))


@ATEN.register("aten._linalg_check_errors.default")
def _check_errors(ctx: Ctx) -> Names:
    # raises in the source on a singular input; computes nothing
    return []
