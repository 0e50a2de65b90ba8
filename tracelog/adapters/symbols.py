"""Symbols beside the batch: sizes of the data (a sequence length, the length
of a second sequence) that other batches of the same model may have at other
values, so that a loader padding each batch to its longest sequence gives one
graph, not one per length.

A candidate is a size that non-leading dims of the data inputs and targets
share (input_ids, attention_mask and labels all [B, T]: T). The tape is
replayed (by the adapter, on shapes only) with that size one larger, alone
and together with the batch; each data-derived dim is then fitted as a
polynomial over the symbols (monomials 1, batch, seq, batch*seq; where that
fit does not hold, seq*count too, from one replay per pair: rows selected
from [B, T, C] and flattened with the sequence), and the fit is checked by
one more replay at sizes far from the recorded ones (about twice the
recorded size: a strided convolution's floor shows there). A
candidate whose replays fail or whose fit does not hold is not a symbol (an
image size behind a strided convolution, a sequence into a fixed-size
position table): its dims stay numbers, as before.

Whatever the replays choose, the graph evaluated at the recorded sizes is the
recorded batch (every polynomial is fitted through them); the symbols only
decide which other batches share the graph, and each batch's own graph is
built from its own ops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tracelog.adapters.tape import Ref, Tape, TArg, concrete_shape, map_targs
from tracelog.ir import BATCH, Dim, dim_value, format_dim, symbol_key

# symbol -> (its size in the recorded batch, the (data ref, axis) pairs that have it)
Sources = dict[str, tuple[int, list[tuple[Ref, int]]]]
# ref -> its shape in one replay
Shapes = dict[Ref, tuple[int, ...]]
# (sizes of the symbols that differ from the recording, sources, the axes of
# each ref whose size the replay must give, and that size) -> shapes, or None
Fixed = dict[Ref, dict[int, int]]
Replay = Callable[[dict[str, int], Sources, Fixed], Shapes | None]
# (symbol, symbol) -> the shapes of a replay with both one larger
Pairs = dict[tuple[str, ...], Shapes]

SYMBOLS = ("seq", "seq2", "seq3")  # at most three sizes beside the batch
# and at most 32 counts of the data's selections (x[mask]: the adapter's candidates;
# a mixture of experts' loop selects each expert's tokens: one count per expert)
COUNTS = ("count", *(f"count{k}" for k in range(2, 33)))
Candidates = Sequence[tuple[int, list[tuple[Ref, int]]]]
_DATA = ("i", "t", "o")  # refs whose dims may follow a symbol


def candidates(tape: Tape) -> list[tuple[int, list[tuple[Ref, int]]]]:
    """Sizes that non-leading dims of the data share, in order of first
    appearance, with the places that have them. Sizes below 2 and the batch
    size itself are no candidates."""
    batch = tape.batch_size
    found: dict[int, list[tuple[Ref, int]]] = {}
    made = []  # masks made to fit the model's dims: they follow the data's sizes
    for a in (*tape.inputs.values(), *tape.targets):
        if a.ref[0] == "i" and a.ref[1] in tape.external:
            made.append(a)
            continue
        for axis, d in enumerate(a.shape):
            if axis == 0 or not isinstance(d, int) or d < 2 or d == batch:
                continue
            found.setdefault(d, []).append((a.ref, axis))
    for a in made:  # a place of a size the data has, never a size of its own
        for axis, d in enumerate(a.shape):
            if axis and d in found:
                found[d].append((a.ref, axis))
    return list(found.items())


def _shapes_of(tape: Tape) -> dict[Ref, TArg]:
    """Every data-derived TArg of the tape, by ref."""
    found: dict[Ref, TArg] = {}
    for a in (*tape.inputs.values(), *tape.targets):
        found[a.ref] = a
    for rec in tape.recs:
        for a in (*rec.tensor_args(), *rec.outs):
            if a.ref[0] in _DATA:
                found.setdefault(a.ref, a)
    return found


def with_symbols(tape: Tape, batch_tape: Tape, replay: Replay, selections: Candidates = ()) -> Tape:
    """`batch_tape` (the tape with exact batch dims) with the dims that follow
    a candidate size written over its symbols; `batch_tape` itself when no
    candidate is a symbol. `selections`: counts the data decides (how many
    elements x[mask] selects: the places are record outputs), tried as
    symbols count, count2, ... after the sequence sizes; a count with no
    symbol stays a number, and the adapter's rule refuses its record."""
    batch = tape.batch_size
    assert batch is not None
    base = {ref: concrete_shape(a.shape, batch) for ref, a in _shapes_of(tape).items()}
    batched = _shapes_of(batch_tape)
    bumped_batch = {ref: concrete_shape(a.shape, batch + 1) for ref, a in batched.items()}
    accepted: Sources = {}
    runs: dict[str, tuple[Shapes, Shapes]] = {}  # symbol -> (alone, with the batch)
    pairs: Pairs = {}  # (symbol, symbol) -> both one larger, where a product was needed
    fitted: dict[Ref, tuple[Dim, ...]] | None = None
    named: list[tuple[tuple[str, ...], tuple[int, list[tuple[Ref, int]]]]]
    named = [(SYMBOLS, c) for c in candidates(tape)]
    named += [(COUNTS, (size, places)) for size, places in selections]
    for names, (size, places) in named:
        taken = sum(1 for s in accepted if s in names)
        if taken == len(names):
            continue
        symbol = names[taken]
        trial = {**accepted, symbol: (size, places)}
        alone = replay({symbol: size + 1}, trial, {})
        if alone is None:
            continue
        # a dim that moves with neither the batch nor the symbol alone moves with
        # neither together (ints equal to both, B = heads = 4, are told apart so),
        # and one that moves with one of them alone moves so together (_joint)
        joint = replay(
            {BATCH: batch + 1, symbol: size + 1}, trial, _joint(base, bumped_batch, alone)
        )
        if joint is None:
            continue
        trial_runs = {**runs, symbol: (alone, joint)}
        polys = _fit(base, bumped_batch, batch, trial, trial_runs, pairs)
        fixed_all = _unmoved(base, bumped_batch, [a for a, _j in trial_runs.values()])
        holds = polys is not None and _holds(polys, batch, trial, replay, fixed_all)
        trial_pairs: Pairs | None = pairs
        if polys is not None and not holds and accepted:
            # a dim may be the product of this symbol and another's (a count of
            # rows selected from [B, T, C], then flattened: count*seq): one more
            # replay per accepted symbol, with both one larger, gives each such term
            trial_pairs = _pair_runs(symbol, size, accepted, trial, replay, fixed_all, pairs)
            if trial_pairs is not None:
                polys = _fit(base, bumped_batch, batch, trial, trial_runs, trial_pairs)
                holds = polys is not None and _holds(polys, batch, trial, replay, fixed_all)
        if not holds or polys is None or trial_pairs is None:
            continue
        accepted, runs, fitted, pairs = trial, trial_runs, polys, trial_pairs
    if fitted is None:
        return batch_tape
    final = fitted

    def resym(a: TArg) -> TArg:
        if a.ref in final:
            return a._replace(shape=final[a.ref])
        return a._replace(shape=concrete_shape(a.shape, batch))

    new = map_targs(tape, resym)
    new.symbols = {symbol: places[0] for symbol, (_size, places) in accepted.items()}
    return new


def _pair_runs(
    symbol: str,
    size: int,
    accepted: Sources,
    trial: Sources,
    replay: Replay,
    fixed: Fixed,
    pairs: Pairs,
) -> Pairs | None:
    """`pairs` and, per symbol accepted before `symbol` (the batch aside), the
    replay with both one larger (_fit's symbol*symbol terms); None where one fails."""
    found = dict(pairs)
    for other, (other_size, _places) in accepted.items():
        both = replay({symbol: size + 1, other: other_size + 1}, trial, fixed)
        if both is None:
            return None
        found[_monomial(other, symbol)] = both
    return found


def _monomial(*symbols: str) -> tuple[str, ...]:
    return tuple(sorted(symbols, key=symbol_key))


def _unmoved(
    base: dict[Ref, tuple[int, ...]], bumped_batch: dict[Ref, tuple[int, ...]], runs: list[Shapes]
) -> Fixed:
    """Per ref, the axes no single-symbol replay moved, at their size."""
    fixed: Fixed = {}
    for ref, d in base.items():
        shapes = [bumped_batch.get(ref)] + [r.get(ref) for r in runs]
        fixed[ref] = {
            axis: d0
            for axis, d0 in enumerate(d)
            if all(sh is not None and len(sh) == len(d) and sh[axis] == d0 for sh in shapes)
        }
    return fixed


def _joint(
    base: dict[Ref, tuple[int, ...]], bumped_batch: dict[Ref, tuple[int, ...]], alone: Shapes
) -> Fixed:
    """Per ref, the axes whose size in the replay with the batch and a symbol
    both one larger the two replays of each alone give: an axis that moved
    in at most one of them. (A dim with a batch*symbol term moves in both: a
    term that moved in neither is zero; one in one alone is linear in it.)
    So only the dims that moved with both are the joint replay's to find,
    and an int that two readings fit (a length of 8 = 2 * batch beside a
    batch of 4: `torch.zeros(4, 8, 4)` of a one-hot) is read as each alone
    read it."""
    fixed: Fixed = {}
    for ref, d in base.items():
        b, s = bumped_batch.get(ref), alone.get(ref)
        if b is None or s is None or len(b) != len(d) or len(s) != len(d):
            continue
        fixed[ref] = {
            axis: d0 + (b[axis] - d0) + (s[axis] - d0)
            for axis, d0 in enumerate(d)
            if b[axis] == d0 or s[axis] == d0
        }
    return fixed


def _fit(
    base: dict[Ref, tuple[int, ...]],
    bumped_batch: dict[Ref, tuple[int, ...]],
    batch: int,
    sources: Sources,
    runs: dict[str, tuple[Shapes, Shapes]],
    pairs: Pairs | None = None,
) -> dict[Ref, tuple[Dim, ...]] | None:
    """Each dim as c0 + cB*batch + sum(ci*seq_i + cBi*batch*seq_i) + sum(cij*seq_i*seq_j)
    (the last over `pairs` only), from the recording, the batch replay and, per
    symbol, its replays alone and with the batch (one more: mixed differences
    give the batch*seq terms), and per pair of symbols, their replay together."""
    pairs = pairs or {}
    fitted: dict[Ref, tuple[Dim, ...]] = {}
    for ref, d in base.items():
        rb = bumped_batch.get(ref, d)
        shapes = [runs[s][0].get(ref) for s in sources] + [runs[s][1].get(ref) for s in sources]
        shapes += [both.get(ref) for both in pairs.values()]
        if any(sh is None or len(sh) != len(d) for sh in shapes) or len(rb) != len(d):
            return None
        dims: list[Dim] = []
        for axis, d0 in enumerate(d):
            poly: dict[tuple[str, ...], int] = {}
            batch_slope = rb[axis] - d0
            rest = d0
            # d(s_i + 1, s_j + 1) - d(s_i + 1) - d(s_j + 1) + d = cij
            products: dict[tuple[str, ...], int] = {}
            for (si, sj), both in pairs.items():
                cij = both[ref][axis] - runs[si][0][ref][axis] - runs[sj][0][ref][axis] + d0
                products[(si, sj)] = cij
                poly[(si, sj)] = cij
                rest -= cij * sources[si][0] * sources[sj][0]
            for symbol, (size, _places) in sources.items():
                alone, joint = runs[symbol][0][ref][axis], runs[symbol][1][ref][axis]
                cross = joint - rb[axis] - alone + d0
                # alone - d = ci + cBi*batch + sum over j of cij*s_j
                others = sum(
                    c * sources[m[1] if m[0] == symbol else m[0]][0]
                    for m, c in products.items()
                    if symbol in m
                )
                linear = alone - d0 - cross * batch - others
                poly[(BATCH, symbol)] = cross
                poly[(symbol,)] = linear
                batch_slope -= cross * size
                rest -= linear * size + cross * batch * size
            poly[(BATCH,)] = batch_slope
            poly[()] = rest - batch_slope * batch
            dims.append(format_dim(poly))
        fitted[ref] = tuple(dims)
    return fitted


def _holds(
    polys: dict[Ref, tuple[Dim, ...]], batch: int, sources: Sources, replay: Replay, fixed: Fixed
) -> bool:
    """The fit predicts a replay at sizes far from the recorded ones."""
    sizes = {BATCH: batch + 2, **{s: 2 * size + 1 for s, (size, _p) in sources.items()}}
    shapes = replay(sizes, sources, fixed)
    if shapes is None:
        return False
    for ref, dims in polys.items():
        got = shapes.get(ref)
        if got is None or len(got) != len(dims):
            return False
        want = tuple(dim_value(dm, sizes) if isinstance(dm, str) else dm for dm in dims)
        if got != want:
            return False
    return True
