"""The CTC loss of speech and handwriting models (F.ctc_loss, nn.CTCLoss).

aten.ctc_loss is a composite: under the dispatcher it is aten._ctc_loss
(lengths as tensors, or as int lists), the per-sample losses, then the
reduction as ordinary ops (zero_infinity's where, the mean's division by the
target lengths), which record by their own rules. aten._ctc_loss is one IR
op, tracelog.CTCLoss; the log-alpha it returns beside the losses is for its
own backward: nothing of the graph reads it.

Registered into ``ATEN`` on import (the last line of ``rules.py``)."""

from __future__ import annotations

from tracelog.adapters.builder import Ctx, NotSupported
from tracelog.adapters.tape import TArg
from tracelog.adapters.torch.rules import ATEN, Names


def _lengths(ctx: Ctx, i: int, name: str) -> str:
    """Lengths given as a tensor, or as a list of ints (a constant)."""
    a = ctx.arg(i, name)
    if isinstance(a, TArg):
        return ctx.t(i, name)
    if isinstance(a, list | tuple) and all(type(v) is int for v in a):
        return ctx.ints([int(v) for v in a])
    raise NotSupported(f"CTC {name} of {type(a).__name__}")


@ATEN.register("aten._ctc_loss.default", "aten._ctc_loss.Tensor")
def _ctc_loss(ctx: Ctx) -> Names:
    # (neg_log_likelihood [N], log_alpha): log_probs [T, N, C], targets [N, S] or 1-D
    if len(ctx.in_type(0).shape) != 3:
        raise NotSupported("CTC loss of unbatched log-probabilities")
    blank = int(ctx.arg(4, "blank", 0))
    zero_infinity = int(bool(ctx.arg(5, "zero_infinity", False)))
    inputs = [
        ctx.t(0),
        ctx.t(1),
        _lengths(ctx, 2, "input_lengths"),
        _lengths(ctx, 3, "target_lengths"),
    ]
    (loss,) = ctx.node(
        "CTCLoss", inputs, outs=1, domain="tracelog", blank=blank, zero_infinity=zero_infinity
    )
    return [loss, None]
