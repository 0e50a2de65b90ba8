"""What every emitter shares: safe names, literals, usage comments, the
unsupported-op check and black formatting. Nothing here knows a target."""

from __future__ import annotations

import builtins
import keyword
import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from tracelog.errors import UnsupportedOpError
from tracelog.ir import TensorType
from tracelog.log import GraphEntry, TraceLog
from tracelog.registry import Table

_ILLEGAL = re.compile(r"[^0-9a-zA-Z_]+")


class Namespace:
    """One namespace per emitted program (torch.fx's _Namespace): sanitise,
    then make unique with _N; keywords, builtins and imports are reserved."""

    def __init__(self, reserved: Iterable[str] = ()) -> None:
        self._used: set[str] = set(keyword.kwlist) | set(dir(builtins)) | set(reserved)
        self._names: dict[Any, str] = {}

    def child(self) -> Namespace:
        """A namespace for one function: every name taken here stays taken."""
        ns = Namespace()
        ns._used = set(self._used)
        return ns

    def free(self, name: str) -> bool:
        return name not in self._used

    def name(self, candidate: str, obj: Any = None) -> str:
        if obj is not None and obj in self._names:
            return self._names[obj]
        base = identifier(candidate)
        name, n = base, 0
        while name in self._used:
            n += 1
            name = f"{base}_{n}"
        self._used.add(name)
        if obj is not None:
            self._names[obj] = name
        return name


def comment_text(text: str) -> str:
    """Text for a comment that cannot end the comment line: every character
    that is not printable (each line end Python or a tool recognises: \\n,
    \\r, \\x0b, \\x0c, \\x1c-\\x1e, \\x85, \\u2028, \\u2029; NUL; lone
    surrogates) written as its escape."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def identifier(candidate: str) -> str:
    """A Python identifier made from any text, as Namespace makes them (no
    uniqueness): characters outside [0-9A-Za-z_] become _."""
    base = _ILLEGAL.sub("_", candidate).strip("_") or "_unnamed"
    return f"_{base}" if base[0].isdigit() else base


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


def check_supported(log: TraceLog, table: Table[Any], target: str) -> None:
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


LINE_LENGTH = 88
"""black's default: what a user's CI checks a file with no configuration at."""


def format_source(text: str, line_length: int = LINE_LENGTH) -> str:
    import black

    return black.format_str(text, mode=black.Mode(line_length=line_length))
