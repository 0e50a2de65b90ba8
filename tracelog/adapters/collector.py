"""Python's cyclic garbage collector, paused while a batch is recorded op by op.

An exact window keeps about ten small container objects per recorded op
alive until the batch ends (the tape's records, their arguments, the refs
of tensors). Python's collector runs on allocation counts, so mid-batch it
scans them, finds them alive, and promotes them; the promotions then
trigger full collections of the whole process heap (a training process
holds hundreds of thousands of objects: torch, transformers). Measured on a
4-layer GPT-2 step: about 10% of the step's time went to collections that
freed nothing (``benchmarks/recording_overhead.py --gc``). The tape dies by
reference counting at the window's end, so pausing the collector over the
window and resuming it once the window's objects are gone skips that work.

The pause is counted across listeners (two models' windows may overlap) and
restores the collector only if it was enabled when the first pause began
(a user who disabled it keeps it disabled). Cyclic garbage the user's own
code makes inside a window is collected after the window, not during it.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_depth = 0
_was_enabled = False


def pause() -> None:
    """One more window recording: the collector stays off until every pause
    is resumed."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1


def resume() -> None:
    """One window less; the last one restores the collector as it was."""
    global _depth
    with _lock:
        if _depth == 0:
            return
        _depth -= 1
        if _depth == 0 and _was_enabled:
            gc.enable()


def paused() -> int:
    """How many windows hold the pause (for tests)."""
    return _depth


__all__ = ["pause", "paused", "resume"]
