"""The batch-dim replay's shape rule for pointwise ops (batch_dims._pointwise_meta)
against torch's own meta kernels, for every aten overload torch tags
``pointwise``: the same output shape where the kernel runs, a raise where the
kernel raises (arguments that do not broadcast, an in-place op whose
broadcast is larger than its target)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the replay runs on torch's meta tensors")

from tracelog.adapters.torch.batch_dims import _pointwise, _pointwise_meta  # noqa: E402
from tracelog.adapters.torch.tensors import dtype_name  # noqa: E402

# each case: the first tensor argument's shape, the other tensor arguments' shape
_CASES = [
    ((2, 3, 4), (2, 3, 4)),  # alike
    ((2, 3, 4), (3, 1)),  # the others broadcast into the first
    ((3, 1), (2, 3, 4)),  # the first broadcast into the others (in place: raises)
    ((2, 3, 4), (5, 4)),  # no broadcast
    ((2, 1, 4), ()),  # a 0-d other
]
_DTYPES = (torch.float32, torch.bool, torch.int64, torch.float64, torch.complex64)


def _overloads() -> list[Any]:
    found = []
    for name in dir(torch.ops.aten):
        try:
            packet = getattr(torch.ops.aten, name)
            overloads = packet.overloads()
        except Exception:
            continue
        for overload in overloads:
            op = getattr(packet, overload)
            if _pointwise(op):
                found.append(op)
    return found


def _args(
    op: Any, first: tuple[int, ...], other: tuple[int, ...], dtype: Any
) -> tuple[list[Any], dict[str, Any]] | None:
    """Arguments from the op's schema: tensors of the case's shapes, plain
    values where a number, a flag or a rounding mode is asked; None where the
    schema asks for something else."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    tensors = 0
    for a in op._schema.arguments:
        kind = str(a.type)
        if "Tensor" in kind:
            shape = first if tensors == 0 else other
            value: Any = torch.empty(shape, dtype=dtype, device="meta")
            tensors += 1
        elif a.has_default_value() and kind != "Optional[number]":  # (clamp's min and max)
            continue  # it takes its default
        elif kind in ("number", "Scalar", "float", "Optional[number]"):
            value = 2.0 if dtype.is_floating_point or dtype.is_complex else 2
        elif kind in ("int", "SymInt"):
            value = 1
        elif kind == "bool":
            value = False
        elif kind in ("str", "Optional[str]"):
            value = "trunc"  # div's rounding mode
        elif kind.startswith("Optional"):
            value = None
        else:
            return None
        if a.kwarg_only:
            kwargs[a.name] = value
        else:
            args.append(value)
    return (args, kwargs) if tensors else None


def _kernel_dtype(op: Any) -> Any:
    """A dtype the op's meta kernel runs on alike-shaped arguments, or None."""
    for dtype in _DTYPES:
        found = _args(op, (2, 3, 4), (2, 3, 4), dtype)
        if found is None:
            return None
        try:
            op(*found[0], **found[1])
        except Exception:
            continue
        return dtype
    return None


_OPS = _overloads()


def test_the_table_is_torch_s_pointwise_ops() -> None:
    names = {str(op) for op in _OPS}
    assert {"aten.add.Tensor", "aten.mul_.Tensor", "aten.where.self", "aten.tanh.default"} <= names
    # not pointwise, or not one new tensor: kept on the kernels
    assert not any(
        n in names
        for n in ("aten.add.out", "aten.frexp.Tensor", "aten.mm.default", "aten.sum.dim_IntList")
    )
    assert _pointwise(torch.ops.aten.add_.Tensor) == "self"
    assert _pointwise(torch.ops.aten.add.Tensor) == "new"


@pytest.mark.parametrize("op", _OPS, ids=str)
def test_pointwise_shapes_as_the_meta_kernel(op: Any) -> None:
    dtype = _kernel_dtype(op)
    if dtype is None:
        pytest.skip(f"{op}: no meta kernel runs on these arguments, nothing to compare")
    kind = _pointwise(op)
    compared = 0
    for first, other in _CASES:
        found = _args(op, first, other, dtype)
        assert found is not None
        args, kwargs = found
        try:
            out = op(*args, **kwargs)
        except Exception:
            want = None
        else:
            want = tuple(out.shape)
        rec = SimpleNamespace(
            outs=[SimpleNamespace(dtype=dtype_name(out.dtype if want is not None else dtype))]
        )
        try:
            got = _pointwise_meta(rec, kind, list(args), kwargs)
        except RuntimeError:
            assert want is None, f"{op} {first} {other}: the kernel gives {want}, the rule raised"
            continue
        assert want is not None, f"{op} {first} {other}: the kernel raised, the rule gave a shape"
        assert tuple(got.shape) == want, (op, first, other)
        assert got.dtype == out.dtype
        if kind == "self":
            assert got is args[0]
        compared += 1
    assert compared >= 2
