"""What every program emitter shares: safe names, literals, usage comments,
the rule table type and black formatting. Nothing here knows a target."""

from __future__ import annotations

import builtins
import keyword
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracelog.errors import UnsupportedOpError
from tracelog.ir import Graph, Node, TensorType, Value
from tracelog.log import GraphEntry, TraceLog
from tracelog.registry import Table

_ILLEGAL = re.compile(r"[^0-9a-zA-Z_]+")


class Namespace:
    """One namespace per emitted program (torch.fx's _Namespace): sanitise,
    then make unique with _N; keywords, builtins and imports are reserved."""

    def __init__(self, reserved: Iterable[str] = ()) -> None:
        self._used: set[str] = set(keyword.kwlist) | set(dir(builtins)) | set(reserved)
        self._names: dict[Any, str] = {}

    def name(self, candidate: str, obj: Any = None) -> str:
        if obj is not None and obj in self._names:
            return self._names[obj]
        base = _ILLEGAL.sub("_", candidate).strip("_") or "_unnamed"
        if base[0].isdigit():
            base = f"_{base}"
        name, n = base, 0
        while name in self._used:
            n += 1
            name = f"{base}_{n}"
        self._used.add(name)
        if obj is not None:
            self._names[obj] = name
        return name


def einsum_equation(c: RuleCtx) -> str:
    """An Einsum node's equation as a literal; only einsum's own characters
    pass into generated code."""
    eq = str(c.attr("equation"))
    if not re.fullmatch(r"[A-Za-z,. ]*(->[A-Za-z. ]*)?", eq):
        raise NotImplementedError(f"einsum equation {eq!r}")
    return literal(eq.replace(" ", ""))


def literal(value: Any) -> str:
    """A Python literal for a number or nested list of numbers. Never repr()
    of an arbitrary object: only these types reach generated code."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        f = float(value)
        if f != f:
            return 'float("nan")'
        if f in (float("inf"), float("-inf")):
            return 'float("inf")' if f > 0 else '-float("inf")'
        return repr(f)
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, np.ndarray):
        return literal(value.tolist())
    raise TypeError(f"no literal for {type(value).__name__}")


def shape_text(ty: TensorType) -> str:
    return "[" + ", ".join(str(d) for d in ty.shape) + "]"


def usage_comment(entries: list[GraphEntry]) -> str:
    parts = []
    for e in entries:
        u = e.usage
        epochs = u.epochs
        span = (
            f"epoch {epochs[0]}"
            if len(epochs) == 1
            else (
                f"epochs {epochs[0]}-{epochs[-1]}"
                if epochs == list(range(epochs[0], epochs[-1] + 1))
                else "epochs " + ",".join(map(str, epochs))
            )
        )
        first = f"{u.first[0]}:{u.first[1]}" if u.first else "-"
        last = f"{u.last[0]}:{u.last[1]}" if u.last else "-"
        count = f"{u.batches} batch" if u.batches == 1 else f"{u.batches} batches"
        parts.append(f"{e.phase}: {count}, {span}, first {first}, last {last}")
    return "; ".join(parts)


@dataclass
class RuleCtx:
    """What an emitter rule sees: the node, printed names of its inputs, and
    constant values where an input is a constant."""

    graph: Graph
    node: Node
    names: dict[str, str]
    constants: dict[str, np.ndarray]
    helpers: set[str] = field(default_factory=set)
    outs: list[str] = field(default_factory=list)
    mask_key: str = ""  # Dropout: the key of its mask in the rng dict ("mask.<k>")

    def i(self, k: int) -> str:
        name = self.node.inputs[k] if k < len(self.node.inputs) else ""
        return self.names[name] if name else "None"

    def has(self, k: int) -> bool:
        return k < len(self.node.inputs) and bool(self.node.inputs[k])

    def const(self, k: int) -> np.ndarray | None:
        if not self.has(k):
            return None
        v = self.graph.values[self.node.inputs[k]]
        if v.kind != "const":
            return None
        return const_value(v, self.constants)

    def ints(self, k: int) -> list[int] | None:
        c = self.const(k)
        return None if c is None else [int(x) for x in np.asarray(c).reshape(-1)]

    def in_type(self, k: int) -> TensorType:
        return self.graph.values[self.node.inputs[k]].type

    def out_type(self, k: int = 0) -> TensorType:
        return self.graph.values[self.node.outputs[k]].type

    def attr(self, key: str, default: Any = None) -> Any:
        return self.node.attrs.get(key, default)

    def use(self, helper: str) -> str:
        self.helpers.add(helper)
        return helper


def slice_expr(c: RuleCtx, target: str) -> str:
    """ONNX Slice with constant bounds as Python subscript syntax, x[a:b:s],
    which TensorFlow, PyTorch and JAX tensors all accept."""
    starts, ends = c.ints(1), c.ints(2)
    axes = c.ints(3) if c.has(3) else None
    steps = c.ints(4) if c.has(4) else None
    if (
        starts is None
        or ends is None
        or (c.has(3) and axes is None)
        or (c.has(4) and steps is None)
    ):
        raise NotImplementedError(f"{target}: Slice with computed bounds")
    rank = len(c.in_type(0).shape)
    axes = axes or list(range(len(starts)))
    steps = steps or [1] * len(starts)
    index = [":"] * rank
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        end = "" if e >= 2**62 else str(e)
        step = "" if st == 1 else f":{st}"
        index[a % rank] = f"{s if s else ''}:{end}{step}"
    while index and index[-1] == ":":
        index.pop()
    return f"{c.i(0)}[{', '.join(index)}]"


def chain(c: RuleCtx, fn: str) -> str:
    """A variadic ONNX op (Max, Min) as nested binary calls of fn."""
    expr = c.i(0)
    for k in range(1, len(c.node.inputs)):
        expr = f"{fn}({expr}, {c.i(k)})"
    return expr


Rule = Callable[[RuleCtx], str | list[str]]


class EmitTable(Table[Rule]):
    """IR op (qualified, e.g. "Conv" or "tracelog.BatchNormTraining") -> rule.
    A rule returns one expression, or one per output for multi-output ops."""


def const_value(v: Value, constants: dict[str, np.ndarray]) -> np.ndarray:
    from tracelog.emit.onnx import const_array

    return const_array(v, constants)


def check_supported(log: TraceLog, table: EmitTable, target: str) -> None:
    """Raise UnsupportedOpError listing every op of the log the table lacks."""
    found: dict[str, tuple[int, list[str]]] = {}
    for g in log.graphs.values():
        for n in g.nodes:
            key = n.qualified_op
            if key == "tracelog.Unsupported":
                key = str(n.attrs.get("source", key))
            elif key in table:
                continue
            count, mods = found.get(key, (0, []))
            found[key] = (count + 1, mods if n.module in mods else mods + [n.module])
    if found:
        raise UnsupportedOpError(target, [(k, c, m) for k, (c, m) in sorted(found.items())])


def format_source(text: str) -> str:
    import black

    return black.format_str(text, mode=black.Mode(line_length=100))
