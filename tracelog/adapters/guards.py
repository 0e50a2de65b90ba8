"""The guarded fast path's bookkeeping, framework-agnostic (DESIGN.md, "Recording").

A batch has a key: what decides its graphs and is cheap to read without the
recorder: ``(static, inputs, calls)``: the model's facts as the window opens,
the modes and the data inputs' shapes/dtypes/devices as the forward starts,
and the sequence of module and function calls (with their arguments' shapes)
the batch made. An exact recording maps its key to the pair of graphs it
counted. Once the exact recordings of one ``(static, inputs)`` gave the same
key and pair K times in a row, later batches that open with the same
``static`` run without the recorder; one whose ``inputs`` then match no
trusted key is recorded exactly from its forward on (nothing before the
forward is recorded anyway). A fast batch is counted for the pair its whole
key maps to. Every Nth batch of a ``static``, and the first of each epoch,
is recorded exactly again.

What the key cannot see (a data-dependent branch inside a module's own
arithmetic, a constant computed from the data) is what the exact
re-recordings are for: one that maps a known key to another pair means the
key does not decide the graphs of this model, and the run records exactly
from then on, saying so. A guarded batch whose key was never recorded (a
branch that calls other modules or functions) is held until an exact
recording of that key says its pair, the run recording exactly meanwhile;
one never resolved is counted unrecorded at close, with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

Pair = tuple[str, str | None]  # (prediction hash, loss hash or None)
Position = tuple[str, int, int]  # (phase, epoch, batch)

MODES = ("guarded", "exact")
MAX_NOTES = 20
UNRESOLVED = (
    "guarded: this batch took a path (module or function calls) that no exact recording "
    "showed before the run ended (a data-dependent branch)"
)


@dataclass
class Streak:
    """One key and the pair it gave, ``count`` exact recordings in a row."""

    key: tuple[Hashable, ...]
    pair: Pair
    count: int = 1
    # the log's usages its guarded batches count into (TraceLog.usages), found
    # on its first guarded batch: (phase, usages)
    usages: Any = field(default=None, compare=False, repr=False)

    @property
    def static(self) -> Hashable:
        return self.key[0]

    @property
    def inputs(self) -> Hashable:
        return self.key[1]


@dataclass
class GuardBook:
    """Which batches may be counted by guards, and what the guards saw."""

    mode: str = "guarded"
    k: int = 3
    n: int = 100
    table: dict[tuple[Hashable, ...], Pair] = field(default_factory=dict)
    # by (static, inputs): the latest exact recordings' streak, and the trusted one
    streaks: dict[tuple[Hashable, Hashable], Streak] = field(default_factory=dict)
    trusted: dict[tuple[Hashable, Hashable], Streak] = field(default_factory=dict)
    trusted_statics: set[Hashable] = field(default_factory=set)
    since_exact: dict[Hashable, int] = field(default_factory=dict)
    epoch_of_exact: dict[Hashable, int] = field(default_factory=dict)
    pending: dict[tuple[Hashable, ...], list[Position]] = field(default_factory=dict)
    guarded: int = 0
    exact: int = 0
    switched: dict[str, Any] | None = None  # why the run went back to exact mode
    branches: list[dict[str, Any]] = field(default_factory=list)
    branch_count: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"guard_after (K) must be an int >= 1, got {self.k!r}")
        if not isinstance(self.n, int) or self.n < 2:
            raise ValueError(f"rerecord_every (N) must be an int >= 2, got {self.n!r}")

    # -- deciding ------------------------------------------------------------------------
    def may_guard(self, static: Hashable, epoch: int) -> bool:
        """May a batch that opens with this ``static`` run without the recorder?"""
        if self.mode == "exact" or self.switched is not None or self.pending:
            return False
        if static not in self.trusted_statics or self.epoch_of_exact.get(static) != epoch:
            return False  # the first batch of each epoch is recorded exactly
        return self.since_exact.get(static, 0) + 1 < self.n  # every Nth batch too

    def trusted_for(self, static: Hashable, inputs: Hashable) -> Streak | None:
        """The trusted streak of a fast batch whose forward starts with ``inputs``."""
        return self.trusted.get((static, inputs))

    # -- counting ------------------------------------------------------------------------
    def recorded(self, key: tuple[Hashable, ...], pair: Pair, where: Position) -> list[Position]:
        """An exact recording of ``key`` counted ``pair``: returns the held
        guarded batches that key resolves (to count for ``pair`` now)."""
        self.exact += 1
        static = key[0]
        self.since_exact[static] = 0
        self.epoch_of_exact[static] = where[1]
        known = self.table.get(key)
        if known is not None and known != pair and self.switched is None:
            self.switched = {
                "phase": where[0],
                "epoch": where[1],
                "batch": where[2],
                "why": (
                    "an exact recording gave other graphs than earlier batches with the same "
                    "guards (a data-dependent branch the guards cannot see): every batch is "
                    "recorded exactly from here on; batches counted under guards before "
                    "may be counted for the other graphs"
                ),
                "guarded_before": self.guarded,
            }
        self.table[key] = pair
        prefix = (static, key[1])
        streak = self.streaks.get(prefix)
        if streak is not None and streak.key == key and streak.pair == pair:
            streak.count += 1
        else:
            streak = self.streaks[prefix] = Streak(key, pair)
        if streak.count >= self.k:
            self.trusted[prefix] = streak
            self.trusted_statics.add(static)
        return self.pending.pop(key, [])

    def not_recorded(self, static: Hashable | None, inputs: Hashable) -> None:
        """An exact batch failed: its streak starts again."""
        self.streaks.pop((static, inputs), None)

    def counted(self, key: tuple[Hashable, ...], expected: Streak, where: Position) -> Pair | None:
        """A guarded batch ended with ``key``: the pair to count it for, or None
        (a path no exact recording showed: held until one does)."""
        self.guarded += 1
        self.since_exact[expected.static] = self.since_exact.get(expected.static, 0) + 1
        if key == expected.key:
            return expected.pair
        self.branch_count += 1
        if len(self.branches) < MAX_NOTES:
            self.branches.append(
                {
                    "phase": where[0],
                    "epoch": where[1],
                    "batch": where[2],
                    "known": key in self.table,
                }
            )
        pair = self.table.get(key)
        if pair is None:
            self.pending.setdefault(key, []).append(where)
        return pair

    def unresolved(self) -> list[Position]:
        """Held batches no exact recording resolved (at close)."""
        held = [p for positions in self.pending.values() for p in positions]
        self.pending.clear()
        return held

    def to_json(self) -> dict[str, Any]:
        """trace.json's ``recording``."""
        return {
            "mode": self.mode,
            "guard_after": self.k,
            "rerecord_every": self.n,
            "exact": self.exact,
            "guarded": self.guarded,
            "branches": self.branch_count,
            "branch_batches": list(self.branches),
            "switched_to_exact": self.switched,
        }


class GuardedCounting:
    """What a listener with a guard book does as a window ends, whatever the
    framework: count a fast window for the pair its key maps to, teach the
    book an exact window's key, warn once per kind of surprise. A listener
    mixing it in has ``_book``, ``_warned_guards``, ``log``,
    ``last_counted``, ``last_guarded`` and ``no_forward_reason``."""

    _book: GuardBook
    _warned_guards: set[str]
    log: Any
    last_counted: Any
    last_guarded: bool
    no_forward_reason: str

    def _count_fast(self, w: Any, no_forward: str | None = None) -> None:
        """A fast window ended: count it for the pair its key maps to."""
        if w.root_calls == 0:
            raise RuntimeError(no_forward or self.no_forward_reason)
        key = w.key()
        where = (w.phase, w.epoch, w.batch)
        assert w.streak is not None  # set as its forward started
        pair = self._book.counted(key, w.streak, where)
        if key != w.streak.key:
            self._warn_guards(
                "branch",
                "tracelog: batch (epoch %d, batch %d) made other module or function calls "
                "than the recorded batches with the same guards (a data-dependent branch); "
                "it is counted for the graphs of its own path%s",
                w.epoch,
                w.batch,
                "" if pair is not None else ", once an exact recording shows them",
            )
        if pair is None:
            self.last_counted = "held: its path was not recorded yet"
            return
        self.log.count(w.phase, pair[0], pair[1], w.epoch, w.batch, guarded=True)
        self.last_counted = pair
        self.last_guarded = True

    def _exact_counted(self, w: Any, key: tuple[Hashable, ...] | None) -> None:
        """An exact window counted its pair: the guard book learns its key."""
        pair = self.last_counted
        if key is None or not isinstance(pair, tuple):
            return
        switched = self._book.switched
        for phase, epoch, batch in self._book.recorded(key, pair, (w.phase, w.epoch, w.batch)):
            self.log.count(phase, pair[0], pair[1], epoch, batch, guarded=True)
        if switched is None and self._book.switched is not None:
            self._warn_guards(
                "switched",
                "tracelog: batch (epoch %d, batch %d), recorded exactly, gave other graphs than "
                "earlier batches with the same guards (a data-dependent branch the guards do "
                "not see); every batch is recorded exactly from here on",
                w.epoch,
                w.batch,
            )

    def _warn_guards(self, what: str, msg: str, *args: Any) -> None:
        if what not in self._warned_guards:
            self._warned_guards.add(what)
            logging.getLogger("tracelog").warning(msg, *args)

    def _count_unresolved(self) -> None:
        """At close: held guarded batches no exact recording resolved."""
        for phase, epoch, batch in self._book.unresolved():
            self.log.count_failure(phase, epoch, batch, UNRESOLVED)
