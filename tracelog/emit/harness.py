"""The parity check of a program that does not carry it.

An emitted program carries its model, its weights loader and the recorded
batch's step; the check that replays the batch and prints the parity table
is the same in every program of a target, so by default it stays here and a
program run as a script calls ``main(globals(), target)``. The code run is
the text a standalone program (``tracelog emit --standalone``) inlines, from
the same modules (``Target.check``), executed in the program's own namespace:
it reads the program's PARAMETERS, sample_step and runtime as the inlined
copy does.
"""

from __future__ import annotations

import functools
import types
from typing import Any

from tracelog.emit import targets
from tracelog.emit.inline import import_block, used_names

# what a program must define for the check to run in its namespace
PROGRAM_NEEDS = ("PARAMETERS", "sample_step", "_load", "_as_param", "_as_const", "FLOAT_MODULES")


@functools.cache
def _code(target: str) -> types.CodeType:
    """The check for `target`'s programs, compiled once per process."""
    tgt = targets.get(target).program
    used: set[str] = set()
    for text in tgt.check:
        used |= used_names(text)
    source = "\n\n\n".join([import_block(tgt.pieces, used), *tgt.check]) + "\n"
    return compile(source, f"<tracelog parity check: {target}>", "exec")


def attach(namespace: dict[str, Any], target: str) -> None:
    """Define the parity check's functions (check_parity, main, ...) in a
    program's namespace; a standalone program, which has them, is left as it is."""
    if "check_parity" in namespace:
        return
    missing = [name for name in PROGRAM_NEEDS if name not in namespace]
    if missing:
        raise ValueError(
            f"not a {target} program tracelog emitted (no {', '.join(missing)}): "
            "emit it again with this tracelog"
        )
    exec(_code(target), namespace)


def main(namespace: dict[str, Any], target: str) -> int:
    """A program's __main__: its parity check on the recorded batch (the log
    directory is argv[1], or the program's own), the table, 0 on parity."""
    attach(namespace, target)
    return int(namespace["main"]())
