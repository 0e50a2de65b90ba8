"""Turn a tape into IR graphs: convert each record through an adapter's op
table, then cut the prediction graph and the loss graph out of the result.
Framework-neutral: the adapter gives the table and how to read a tensor."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from tracelog.adapters.tape import Rec, Ref, Tape, TArg
from tracelog.ir import (
    BATCH,
    INLINE_CONSTANT_LIMIT,
    ConstData,
    Graph,
    Node,
    Output,
    TensorType,
    Value,
    array_digest,
    is_symbolic,
    parse_dim,
)
from tracelog.ops import TRACELOG_DOMAIN, is_random
from tracelog.passes.rewrite import Rewrites, rewrite
from tracelog.registry import Table
from tracelog.sample import target_name


class NotSupported(Exception):
    """A converter met a form of its op that tracelog does not model."""


Converter = Callable[["Ctx"], Sequence[str | None]]

# The rewrites (fusions) each adapter's graphs get before they are cut and
# hashed, by the adapter table's name; an adapter declares them next to its table.
_REWRITES: dict[str, Rewrites] = {}


def use_rewrites(table: Table[Converter], rewrites: Rewrites) -> None:
    """Every graph built with ``table`` is rewritten with ``rewrites``."""
    if table.name in _REWRITES:
        raise ValueError(f"{table.name}: rewrites are declared twice")
    _REWRITES[table.name] = rewrites


def _state_names(tape: Tape) -> set[str]:
    """The names of the parameters and buffers the tape reads or updates."""
    names = {name for name, _ref in tape.buffer_updates}
    for rec in tape.recs:
        for a in (*rec.tensor_args(), *rec.outs):
            if isinstance(a, TArg) and a.ref[0] in ("p", "b"):
                names.add(str(a.ref[1]))
    return names


def input_names(tape: Tape, state: set[str] | None = None) -> dict[str, str]:
    """The IR name of each data input: its own, unless a parameter or buffer
    holds that name (a model with an argument x and a parameter x), then with
    "_" appended (the sample keys its inputs by these names too). `state`:
    _state_names(tape), where the caller has it (each is a walk of the tape)."""
    if state is None:
        state = _state_names(tape)
    return {name: internal_name(name, state) for name in tape.inputs}


def user_names(tape: Tape) -> set[str]:
    """The names the user chose, which the IR keeps: parameters, buffers and
    data inputs (whatever text they hold)."""
    state = _state_names(tape)
    return state | set(input_names(tape, state).values())


def internal_name(base: str, taken: set[str]) -> str:
    """A name tracelog makes (targets, constants, helper values): `base`, or
    `base` with "_" appended until no user name holds it (a parameter may be
    called "target" or "h1")."""
    while base in taken:
        base += "_"
    return base


def output_roles(tape: Tape, taken: set[str] | None = None) -> dict[str, str]:
    """The IR role of each prediction output: its own (prediction, ...),
    unless a user name holds it (the loss graph reads a prediction as an
    input named by its role, beside the parameters it reads). `taken`:
    user_names(tape), where the caller has it."""
    if taken is None:
        taken = user_names(tape)
    return {role: internal_name(role, taken) for role, _ref in tape.outputs}


def target_names(tape: Tape, taken: set[str] | None = None) -> list[str]:
    """The IR names of the tape's targets, in order: target, target_1, ...
    (the sample keys its targets by these names too). `taken`:
    user_names(tape), where the caller has it."""
    if taken is None:
        taken = user_names(tape)
    return [internal_name(target_name(k), taken) for k in range(len(tape.targets))]


class Draws(NamedTuple):
    """Per random node (a dropout's mask, a draw's values) of each graph, in
    node order, the record index of what it drew: the sample keeps them
    (tracelog.sample.mask_key, loss_mask_key) for the programs to replay."""

    prediction: list[int]
    loss: list[int]


class Builder:
    def __init__(
        self,
        tape: Tape,
        trainable: dict[str, bool],
        constants: dict[str, np.ndarray],
        table: Table[Converter],
        to_numpy: Callable[[Any], np.ndarray],
    ) -> None:
        self.tape = tape
        self.table = table
        self.to_numpy = to_numpy
        self.trainable = trainable
        self.constants = constants  # digest -> array, shared with the TraceLog
        self.values: dict[str, Value] = {}
        self.nodes: list[Node] = []
        self.node_region: list[str] = []
        self.names: dict[tuple[Any, ...], str | None] = {}
        self.pseudo: dict[str, tuple[Any, ...]] = {}
        # per random node (Dropout), by its first output: the record that drew its mask
        self.random_recs: dict[str, int] = {}
        # facts a rule leaves for the rules of later records, by topic (TF's
        # SpaceToBatchND outputs, which a BatchToSpaceND may fold into a Conv)
        self.notes: dict[str, Any] = {}
        self._n_helper = 0
        self._n_const = 0
        self._const_cache: dict[tuple[Any, ...], str] = {}
        self._current: Rec | None = None  # the record being converted
        # outputs of records autograd did not record (torch.no_grad()), read by a
        # record it did through a StopGradient (one per value, by its name); an
        # in-place op's output by the tensor it wrote, whose history autograd keeps
        self.no_grad_refs: dict[Ref, TArg | None] = {}
        self._stopped: dict[str, str] = {}
        state = _state_names(tape)
        self._inputs = input_names(tape, state)
        self._user = state | set(self._inputs.values())  # user_names(tape)
        self._targets = target_names(tape, self._user)

    # -- values -------------------------------------------------------------------
    def name_of(self, targ: TArg) -> str:
        ref = targ.ref
        kind = ref[0]
        if kind == "o":
            if ref not in self.names:
                raise NotSupported(f"uses a tensor from an op that was not recorded ({ref})")
            name = self.names[ref]
            if name is None:
                raise NotSupported("uses an output that tracelog does not model")
            return name
        if kind in ("p", "b", "i"):
            name = self._inputs[ref[1]] if kind == "i" else ref[1]
            if name not in self.values:
                vkind = {"p": "param", "b": "buffer", "i": "input"}[kind]
                self.values[name] = Value(
                    name, targ.type, vkind, trainable=self.trainable.get(name, False)
                )
            return name
        if kind == "t":
            name = self._targets[ref[1]]
            if name not in self.values:
                self.values[name] = Value(name, targ.type, "input")
            return name
        if kind == "n":
            return self._batch_scalar(targ)
        if kind == "c":
            name = internal_name(f"const{ref[1]}", self._user)
            if name not in self.values:
                info = self.tape.consts[ref[1]]
                arr = np.asarray(self.to_numpy(info.tensor))
                self.values[name] = Value(
                    name,
                    targ.type,
                    "const",
                    const=_const_data(arr, info.digest, self.constants, arr),
                )
            return name
        if kind == "r" and ref in self.tape.draws:
            return self._draw(targ)
        raise NotSupported(f"unknown tensor origin {ref}")

    def _draw(self, targ: TArg) -> str:
        """A random draw that the record being built reads as a value (Keras'
        GaussianNoise): a RandomNormalLike / RandomUniformLike node, its values
        fed back from the sample (the listener's mask() of the reading record
        gives them), one per draw: the first record reading it replays it."""
        rec = self._current
        if rec is None:
            raise NotSupported("a random draw read outside a record")
        # one node per draw: every record reading it reads the same values (the
        # first reader's mask() replays them; a program's fresh run draws once)
        found = self.names.get(("draw", targ.ref))
        if found is not None:
            return found
        if targ.dtype not in ("float16", "bfloat16", "float32", "float64"):
            raise NotSupported(f"a random draw of dtype {targ.dtype}")
        dist, a, b = self.tape.draws[targ.ref]
        ctx = Ctx(self, rec)
        dims: list[int | str] = list(targ.shape)
        if dims and dims[0] == self.tape.batch_size and (self.tape.batch_size or 0) > 1:
            # a draw of the data's shape: the batch-dim replays draw it a row longer
            dims[0] = BATCH
            targ = targ._replace(shape=tuple(dims))
        shape = (
            ctx.dynamic_shape(dims)
            if any(is_symbolic(d) for d in dims)
            else ctx.ints([int(d) for d in dims])
        )
        if dist == "bernoulli":  # a coin as 0.0 / 1.0: a Dropout keep mask of ratio 1 - p
            ones = ctx.helper("ConstantOfShape", [shape], targ.type, value=1.0)
            kept, mask = ctx.node(
                "Dropout",
                [ones, ctx.const(1.0 - a, targ.dtype), ctx.const(True, "bool")],
                outs=[targ.type, TensorType("bool", targ.type.shape)],
            )
            self.random_recs[kept] = rec.index
            y = ctx.helper("Cast", [mask], targ.type, to=targ.dtype)
            self.names[("draw", targ.ref)] = y
            return y
        like = ctx.helper("ConstantOfShape", [shape], targ.type, value=0.0)
        op, attrs = (
            ("RandomNormalLike", {"mean": a, "scale": b})
            if dist == "normal"
            else ("RandomUniformLike", {"low": a, "high": b})
        )
        y = ctx.helper(op, [like], targ.type, **attrs)
        self.random_recs[y] = rec.index
        self.names[("draw", targ.ref)] = y
        return y

    def _batch_scalar(self, targ: TArg) -> str:
        """A constant the adapter saw equal to the batch size (Keras' mean
        reduction divides by it): computed from the data input's shape, so that
        batches of other sizes run the same graph. A ref ("n", dtype, rank, k) is k
        times the batch size (a mean over per-step losses divides by B * T)."""
        k = int(targ.ref[3]) if len(targ.ref) > 3 else 1
        times = f"_x{k}" if k > 1 else ""
        name = internal_name(f"batch_size_{targ.dtype}_{len(targ.shape)}{times}", self._user)
        if name in self.values:
            return name
        first_name, first = next(iter(self.tape.inputs.items()))
        self.name_of(first)
        rec = self._current
        module = rec.module if rec is not None else ("", "")
        region = rec.region if rec is not None else "post"
        shape = self.helper_name()
        self.values[shape] = Value(shape, TensorType("int64", (1,)), "node")
        steps = [
            Node("Shape", [first_name], [shape], {"start": 0, "end": 1}, "", *module, "batch size"),
        ]
        cur = shape
        if len(targ.shape) == 0:
            sq = self.helper_name()
            self.values[sq] = Value(sq, TensorType("int64", ()), "node")
            steps.append(
                Node(
                    "Squeeze",
                    [cur, self.new_const([0], "int64")],
                    [sq],
                    {},
                    "",
                    *module,
                    "batch size",
                )
            )
            cur = sq
        self.values[name] = Value(name, targ.type, "node")
        if k > 1:  # the batch size in the dtype, then times k
            cast = self.helper_name()
            self.values[cast] = Value(cast, targ.type, "node")
            steps.append(Node("Cast", [cur], [cast], {"to": targ.dtype}, "", *module, "batch size"))
            k_name = self.new_const(k, targ.dtype)
            steps.append(Node("Mul", [cast, k_name], [name], {}, "", *module, "batch size"))
        else:
            steps.append(Node("Cast", [cur], [name], {"to": targ.dtype}, "", *module, "batch size"))
        for node in steps:
            self.nodes.append(node)
            self.node_region.append(region)
        return name

    def new_const(self, data: Any, dtype: str) -> str:
        arr = np.asarray(data, dtype=_np_dtype(dtype))
        exact = arr
        if (arr.dtype.kind == "f" or dtype == "bfloat16") and arr.dtype != np.float64:
            # the values as given (a Python 0.3, not float32's 0.30000001): the same
            # float32 constant, and exact where a translation check runs in float64
            wide = np.asarray(data, dtype=np.float64)
            exact = wide if wide.shape == arr.shape else arr
        key = (dtype, arr.shape, exact.tobytes())
        if key in self._const_cache:
            return self._const_cache[key]
        name = internal_name(f"k{self._n_const}", self._user)
        self._n_const += 1
        digest = array_digest(dtype, tuple(arr.shape), np.require(arr, requirements="C").tobytes())
        self.values[name] = Value(
            name,
            TensorType(dtype, tuple(arr.shape)),
            "const",
            const=_const_data(arr, digest, self.constants, exact),
        )
        self._const_cache[key] = name
        return name

    def helper_name(self) -> str:
        self._n_helper += 1
        return internal_name(f"h{self._n_helper}", self._user)

    # -- conversion -----------------------------------------------------------------
    def convert(self) -> None:
        for rec in self.tape.recs:
            self._current = rec
            ctx = Ctx(self, rec)
            rule = self.table.get(rec.op)
            try:
                if rule is None:
                    reason = self.table.reason(rec.op) or f"no rule in the {self.table.name} table"
                    raise NotSupported(reason)
                names = list(rule(ctx))
            except NotSupported as e:
                names = self._unsupported(ctx, str(e))
            for k in range(len(rec.outs)):
                self.names[("o", rec.index, k)] = names[k] if k < len(names) else None
            if not rec.grad:
                written = written_in_place(rec)
                for a in rec.outs:
                    if a.dtype in _FLOATS:
                        self.no_grad_refs[a.ref] = written

    def stopped(self, ctx: Ctx, targ: TArg, name: str) -> str:
        """The value of ``targ`` (named ``name``), made without grad, as a record
        autograd recorded reads it: no gradient through it; or, written in place
        into a tensor autograd tracks (cosine_similarity's clamp_min_ of its
        norms under a NoGradGuard), that tensor's gradient passing the write as
        torch's does: x + StopGradient(y - x). Made once per value."""
        found = self._stopped.get(name)
        if found is not None:
            return found
        ty = targ.type
        written = self.no_grad_refs.get(targ.ref)
        source = None if written is None else self.names.get(written.ref)
        if (
            written is None
            or source is None
            or source in self.pseudo
            or written.ref in self.no_grad_refs
        ):
            found = ctx.helper("StopGradient", [name], ty, domain=TRACELOG_DOMAIN)
        else:
            change = ctx.helper("Sub", [name, source], ty)
            frozen = ctx.helper("StopGradient", [change], ty, domain=TRACELOG_DOMAIN)
            found = ctx.helper("Add", [source, frozen], ty)
        self._stopped[name] = found
        return found

    def _unsupported(self, ctx: Ctx, reason: str) -> list[str | None]:
        inputs = []
        for targ in ctx.rec.tensor_args():
            try:
                name = self.name_of(targ)
            except NotSupported:
                continue
            if name not in self.pseudo:  # a dropout draw is no value of the graph
                inputs.append(name)
        return list(
            ctx.node(
                "Unsupported",
                inputs,
                outs=list(ctx.rec.outs),
                domain=TRACELOG_DOMAIN,
                source=ctx.rec.op,
                reason=reason,
            )
        )

    # -- cutting graphs -------------------------------------------------------------
    def graphs(self) -> tuple[Graph, Graph | None, Draws]:
        """The prediction graph, the loss graph (None without a loss) and, per
        random node (Dropout) of each, the record index of its mask."""
        self._rewrite()
        producer = {o: i for i, n in enumerate(self.nodes) for o in n.outputs if o}
        tape = self.tape
        loss_only_inputs = self._split_loss_in_forward(producer)

        # The loss graph: post-region nodes the loss depends on. Values from the
        # prediction region become its inputs ("features").
        loss_graph = None
        loss_random: list[int] = []
        feature_names: dict[str, str] = {}
        roles = output_roles(tape, self._user)
        output_roles_of = {self._ref_name(ref): roles[role] for role, ref in tape.outputs}
        if tape.loss is not None:
            loss_name = self._ref_name(tape.loss)
            keep, leaves = self._slice([loss_name], producer, region="post")
            for leaf in leaves:
                v = self.values[leaf]
                if v.kind == "node":
                    feature = internal_name(f"feature.{len(feature_names)}", self._user)
                    feature_names[leaf] = output_roles_of.get(leaf) or feature
            loss_graph = self._assemble(
                "loss", keep, [Output(loss_name, "loss")], rename=feature_names
            )
            loss_random = [i for i in keep if is_random(self.nodes[i])]

        outputs = [Output(self._ref_name(ref), roles[role]) for role, ref in tape.outputs]
        for name, role in feature_names.items():
            if name not in output_roles_of:  # a feature, not a prediction
                outputs.append(Output(name, role))
        for buf, ref in tape.buffer_updates:
            outputs.append(Output(self._ref_name(ref), f"update:{buf}"))
        keep, _ = self._slice([o.name for o in outputs], producer, region="pred")
        data_inputs = [self._inputs[n] for n in tape.inputs]
        pred = self._assemble(
            "prediction",
            keep,
            outputs,
            data_inputs=[n for n in data_inputs if n not in loss_only_inputs],
        )
        # the sample's masks, one per random node of each graph in node order
        # (tracelog.sample.mask_key, loss_mask_key): a draw after the predictions
        # (dropout in the loss) is the loss graph's, numbered apart
        random = [i for i in keep if is_random(self.nodes[i])]
        draws = Draws(
            [self.random_recs[self.nodes[i].outputs[0]] for i in random],
            [self.random_recs[self.nodes[i].outputs[0]] for i in loss_random],
        )
        return pred, loss_graph, draws

    def _split_loss_in_forward(self, producer: dict[str, int]) -> set[str]:
        """A loss computed inside the root's forward (a Hugging Face model
        given ``labels=``): the split follows the data. The forward's nodes
        that its other outputs (and buffer updates) need stay in the
        prediction graph; those only the loss needs move to the loss graph,
        which then reads the predictions and the data inputs only it uses
        (the labels). Returns those data inputs' IR names."""
        tape = self.tape
        if tape.loss is None:
            return set()
        loss_name = self._ref_name(tape.loss)
        loss_node = producer.get(loss_name)
        if loss_node is None:
            return set()
        if self.node_region[loss_node] == "pred":
            starts = [loss_name]
        elif tape.forward_loss:  # the forward's loss, read by the loss ops after it
            starts = self._slice([loss_name], producer, region="post")[1]
        else:
            return set()
        roots = []
        for ref in [ref for _, ref in tape.outputs] + [ref for _, ref in tape.buffer_updates]:
            with contextlib.suppress(NotSupported):
                roots.append(self._ref_name(ref))
        needed, _ = self._slice(roots, producer, region="pred")
        for i in self._slice(starts, producer, region="pred")[0]:
            if i not in set(needed):
                self.node_region[i] = "post"
        needed_set = set(needed)
        read_by_pred = {x for i in needed_set for x in self.nodes[i].inputs}
        read_by_loss = {
            x for i, n in enumerate(self.nodes) if self.node_region[i] == "post" for x in n.inputs
        }
        inputs = set(self._inputs.values())
        return (read_by_loss - read_by_pred) & inputs

    def _rewrite(self) -> None:
        """The adapter's fusions over every converted node, before the graphs
        are cut (a fused pattern may span the prediction and loss regions)."""
        rules = _REWRITES.get(self.table.name)
        if not rules:
            return
        tape = self.tape
        refs = [ref for _, ref in tape.outputs] + [ref for _, ref in tape.buffer_updates]
        kept = []
        for ref in refs + ([tape.loss] if tape.loss is not None else []):
            try:
                kept.append(Output(self._ref_name(ref), "kept"))
            except NotSupported:
                continue  # graphs() raises it where it did before
        # only what the graphs keep: a dead reader (a Shape whose value was folded)
        # would count as a second use and stop a fusion
        live = {o.name for o in kept}
        for n in reversed(self.nodes):
            if any(o in live for o in n.outputs if o):
                live.update(i for i in n.inputs if i)
        nodes = [n for n in self.nodes if any(o in live for o in n.outputs if o)]
        whole = Graph("prediction", self.values, nodes, kept)
        done, report = rewrite(whole, rules)
        if not report.replaced:
            return
        region = {id(n): r for n, r in zip(self.nodes, self.node_region, strict=True)}
        for root, new in report.replaced:  # a replacement runs where its root ran
            region.update((id(n), region[id(root)]) for n in new)
        self.values, self.nodes = done.values, done.nodes
        self.node_region = [region[id(n)] for n in self.nodes]

    def _ref_name(self, ref: tuple[Any, ...]) -> str:
        if ref[0] == "o":
            name = self.names.get(ref)
            if name is None:
                raise NotSupported("an output of the batch comes from an unmodelled op")
            return name
        if ref[0] == "i":
            return self._inputs[ref[1]]
        if ref[0] not in ("p", "b"):
            raise NotSupported(f"an output of the batch has origin {ref}")
        return str(ref[1])

    def _slice(
        self, roots: list[str], producer: dict[str, int], region: str
    ) -> tuple[list[int], list[str]]:
        keep: set[int] = set()
        leaves: list[str] = []
        seen: set[str] = set()
        stack = list(reversed(roots))
        while stack:
            name = stack.pop()
            if name in seen or not name:
                continue
            seen.add(name)
            i = producer.get(name)
            if i is None or self.node_region[i] != region:
                if i is not None:
                    leaves.append(name)
                continue
            if i in keep:
                continue
            keep.add(i)
            stack.extend(reversed(self.nodes[i].inputs))
        return sorted(keep), leaves

    def _assemble(
        self,
        kind: str,
        keep: list[int],
        outputs: list[Output],
        rename: dict[str, str] | None = None,
        data_inputs: list[str] | None = None,
    ) -> Graph:
        rename = rename or {}
        values: dict[str, Value] = {}
        tape_names = {ir: name for name, ir in self._inputs.items()}
        for name in data_inputs or []:
            v = self.values.get(name)
            if v is None:  # an input the forward never used
                arg = self.tape.inputs[tape_names[name]]
                v = Value(name, arg.type, "input")
            values[name] = v
        for old, new in rename.items():
            values[new] = Value(new, self.values[old].type, "input")
        nodes: list[Node] = []
        for i in keep:
            n = self.nodes[i]
            ins = [rename.get(x, x) for x in n.inputs]
            for x in ins:
                if x and x not in values:
                    values[x] = self.values[x]
            for o in n.outputs:
                if o:
                    values[o] = self.values[o]
            nodes.append(
                Node(
                    n.op,
                    ins,
                    list(n.outputs),
                    dict(n.attrs),
                    n.domain,
                    n.module,
                    n.module_type,
                    n.source,
                )
            )
        outs = [Output(rename.get(out.name, out.name), out.role) for out in outputs]
        for out in outs:
            if out.name not in values:
                values[out.name] = self.values[out.name]
        graph = Graph(kind, _inputs_first(values), nodes, outs)
        graph.validate()
        return graph


_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})  # values with gradients
# pseudo values (Builder.pseudo) of uninitialised memory: a fresh empty tensor, a view of one
UNINITIALISED = frozenset({"empty", "empty view"})


def written_in_place(rec: Rec) -> TArg | None:
    """The tensor an in-place op (``clamp_min_``) wrote, where it wrote its
    first argument: its value changes, its autograd history stays."""
    name = rec.op.split(".")[1] if rec.op.count(".") >= 1 else ""
    first = rec.args[0] if rec.args else None
    if name.endswith("_") and not name.startswith("_") and isinstance(first, TArg):
        return first if first.dtype in _FLOATS else None
    return None


def _inputs_first(values: dict[str, Value]) -> dict[str, Value]:
    inputs = {k: v for k, v in values.items() if v.kind == "input"}
    return {**inputs, **{k: v for k, v in values.items() if v.kind != "input"}}


class Ctx:
    """What a converter sees: one record, and ways to add IR nodes for it."""

    def __init__(self, builder: Builder, rec: Any) -> None:
        self.b = builder
        self.rec = rec

    @property
    def batch(self) -> int | None:
        return self.b.tape.batch_size

    def arg(self, i: int, name: str | None = None, default: Any = None) -> Any:
        if i < len(self.rec.args):
            return self.rec.args[i]
        if name is not None:
            return self.rec.kwarg(name, default)
        return default

    def t(self, i: int, name: str | None = None) -> str:
        a = self.arg(i, name)
        if not isinstance(a, TArg):
            raise NotSupported(f"argument {i} is not a tensor")
        n = self.b.name_of(a)
        if a.ref in self.b.no_grad_refs and self.rec.grad and n not in self.b.pseudo:
            return self.b.stopped(self, a, n)
        info = self.b.pseudo.get(n)
        if info is not None:
            if info[0] in UNINITIALISED:  # whatever memory held until written
                raise NotSupported("an uninitialised tensor (empty) read or written in part")
            if info[0] == "bernoulli":  # a fresh keep mask read as numbers (alpha dropout)
                return self.keep_mask(a, n, float(info[1]), int(info[2]))
            if info[0] in ("packed", "packed output", "batch sizes"):  # rules_recurrent.py
                raise NotSupported(
                    "a packed sequence's data or batch sizes read other than by a recurrent "
                    "layer or pad_packed_sequence (their sizes are the lengths')"
                )
            if info[0] == "bitcast":  # rules_ops.py: read for its sign bit only
                raise NotSupported("a float's bits read other than for its sign bit")
            raise NotSupported("a random tensor is used outside the dropout pattern")
        return n

    def opt(self, i: int, name: str | None = None) -> str:
        return "" if self.arg(i, name) is None else self.t(i, name)

    def raw_name(self, i: int) -> str:
        """The IR name of tensor arg i, pseudo values allowed."""
        a = self.arg(i)
        if not isinstance(a, TArg):
            raise NotSupported(f"argument {i} is not a tensor")
        return self.b.name_of(a)

    def in_type(self, i: int) -> TensorType:
        a = self.arg(i)
        if not isinstance(a, TArg):
            raise NotSupported(f"argument {i} is not a tensor")
        return a.type

    def out_type(self, k: int = 0) -> TensorType:
        return self.rec.outs[k].type

    def const(self, data: Any, dtype: str) -> str:
        if type(data) is int and self._batch_arg(data):
            return self.batch_number(dtype)
        return self.b.new_const(data, dtype)

    def _batch_arg(self, n: int) -> bool:
        """Whether int n is an argument the batch's fingerprint reads as the
        batch size (Rec.key: an int equal to it in a data-derived record): as
        a constant it would hold the first batch's size in a graph every batch
        size is counted against (x.clamp(max=x.size(0)))."""
        batch = self.batch
        if not self.rec.tainted or batch is None or batch < 2 or n != batch:
            return False
        return any(type(a) is int and a == n for a in self.rec.args) or any(
            type(v) is int and v == n for _, v in self.rec.kwargs
        )

    def batch_number(self, dtype: str, k: int = 1) -> str:
        """k times the batch size, a scalar of `dtype`, computed from the first
        data input's shape (Builder._batch_scalar)."""
        return self.b.name_of(TArg(("n", dtype, 0, *((k,) if k > 1 else ())), dtype, ()))

    def ints(self, data: Sequence[int]) -> str:
        return self.b.new_const(list(data), "int64")

    def node(
        self,
        op: str,
        inputs: Sequence[str],
        *,
        outs: int | Sequence[TensorType | TArg] | None = None,
        domain: str = "",
        **attrs: Any,
    ) -> list[str]:
        """Add a node. outs: None for the record's returned tensors, an int for
        the first n of them, or explicit types for a helper node."""
        if outs is None:
            types = [a.type for a in self.rec.outs[: self.rec.n_returned]]
        elif isinstance(outs, int):
            types = [a.type for a in self.rec.outs[:outs]]
        else:
            types = [o.type if isinstance(o, TArg) else o for o in outs]
        names = []
        for ty in types:
            name = self.b.helper_name()
            self.b.values[name] = Value(name, ty, "node")
            names.append(name)
        path, mtype = self.rec.module
        self.b.nodes.append(
            Node(
                op,
                list(inputs),
                names,
                {k: v for k, v in attrs.items() if v is not None},
                domain,
                path,
                mtype,
                self.rec.op,
            )
        )
        self.b.node_region.append(self.rec.region)
        return names

    def dropout(self, x: str, ratio: float, mask_rec: int, ty: TensorType | None = None) -> str:
        """Dropout(x, ratio) in training mode for the record's first output (a
        helper of type ``ty`` where given); the sample takes its keep mask from
        record ``mask_rec`` (the listener's mask())."""
        out = self.out_type() if ty is None else ty
        y, _mask = self.node(
            "Dropout",
            [x, self.const(ratio, out.dtype), self.const(True, "bool")],
            outs=[out, TensorType("bool", out.shape)],
        )
        self.b.random_recs[y] = mask_rec
        return y

    def keep_mask(self, a: TArg, name: str, keep: float, mask_rec: int) -> str:
        """The 0/1 keep mask record ``mask_rec`` drew (``a``, IR name ``name``) as a
        value of a's type: the mask output of a Dropout of ones, which the sample
        replays as drawn. Made once per mask."""
        found = self.b.notes.setdefault("keep masks", {}).get(name)
        if found is not None:
            return str(found)
        ty = a.type
        ones = self.helper(
            "ConstantOfShape",
            [self.shape_const(list(ty.shape), allow_minus_one=False)],
            ty,
            value=1.0,
        )
        y, kept = self.node(
            "Dropout",
            [ones, self.const(1.0 - keep, ty.dtype), self.const(True, "bool")],
            outs=[ty, TensorType("bool", ty.shape)],
        )
        self.b.random_recs[y] = mask_rec
        mask = self.helper("Cast", [kept], ty, to=ty.dtype)
        self.b.notes["keep masks"][name] = mask
        return mask

    def one(self, op: str, inputs: Sequence[str], **attrs: Any) -> list[str]:
        """A node with the record's first output as its only output."""
        return self.node(op, inputs, outs=1, **attrs)

    def helper(self, op: str, inputs: Sequence[str], ty: TensorType, **attrs: Any) -> str:
        return self.node(op, inputs, outs=[ty], **attrs)[0]

    def shape_const(self, dims: Sequence[int | str], allow_minus_one: bool = True) -> str:
        """A shape tensor for Reshape-like ops: a single batch-derived dim
        becomes -1 when allowed, else it is computed from Shape(first input)."""
        symbolic = [d for d in dims if is_symbolic(d)]
        if not symbolic:
            return self.ints([int(d) for d in dims])
        if allow_minus_one and len(symbolic) == 1 and -1 not in dims:
            return self.ints([-1 if is_symbolic(d) else int(d) for d in dims])
        return self.dynamic_shape(dims)

    def dynamic_shape(self, dims: Sequence[int | str]) -> str:
        """A shape computed at run time: constants for numeric dims, and each
        symbolic dim from the sizes of the data it follows (Shape of the first
        data input for the batch, of the symbol's source for the others)."""
        if not self.b.tape.inputs:
            raise NotSupported("a batch-sized shape with no data input")
        sizes: dict[str, str] = {}  # one Shape node per symbol and shape
        parts = [self.dim_tensor(d, sizes) if is_symbolic(d) else self.ints([int(d)]) for d in dims]
        if len(parts) == 1:
            return parts[0]
        return self.helper("Concat", parts, TensorType("int64", (len(dims),)), axis=0)

    def b_dim(self, d: int | str) -> str:
        """A dim's size as an int64 tensor of shape [1] (computed if symbolic)."""
        return self.dim_tensor(d) if is_symbolic(d) else self.ints([int(d)])

    def dim_tensor(self, d: int | str, sizes: dict[str, str] | None = None) -> str:
        """A symbolic dim's size as an int64 tensor of shape [1]: its
        polynomial written with Mul and Add over the symbols' sizes."""
        one = TensorType("int64", (1,))
        sizes = {} if sizes is None else sizes
        total: str | None = None
        constant = 0
        for monomial, coef in parse_dim(d).items():
            if not monomial:
                constant = coef
                continue
            term = self._symbol_size(monomial[0], sizes)
            for symbol in monomial[1:]:
                term = self.helper("Mul", [term, self._symbol_size(symbol, sizes)], one)
            if coef != 1:
                term = self.helper("Mul", [term, self.ints([coef])], one)
            total = term if total is None else self.helper("Add", [total, term], one)
        if total is None:
            return self.ints([constant])
        if constant:
            total = self.helper("Add", [total, self.ints([constant])], one)
        return total

    def _symbol_size(self, symbol: str, sizes: dict[str, str]) -> str:
        if symbol not in sizes:
            tape = self.b.tape
            if symbol == BATCH:
                source, axis = next(iter(tape.inputs.values())), 0
            else:
                ref, axis = tape.symbols[symbol]
                if ref[0] == "o":  # a count of the data's selection: that record's output
                    source = tape.recs[ref[1]].outs[ref[2]]
                else:
                    source = tape.inputs[ref[1]] if ref[0] == "i" else tape.targets[ref[1]]
            name = self.b.name_of(source)
            sizes[symbol] = self.helper(
                "Shape", [name], TensorType("int64", (1,)), start=axis, end=axis + 1
            )
        return sizes[symbol]


def _np_dtype(dtype: str) -> np.dtype:
    if dtype == "bfloat16":
        # numpy has none; autocast's bfloat16 ops bring constants (a dropout rate)
        try:
            import ml_dtypes
        except ImportError:
            raise NotSupported("bfloat16 constants need the ml_dtypes package") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def _const_data(
    arr: np.ndarray, digest: str, store: dict[str, np.ndarray], exact: np.ndarray
) -> ConstData:
    if arr.size <= INLINE_CONSTANT_LIMIT:
        return ConstData(data=exact.tolist())  # a plain number for a 0-d array
    store[digest] = arr
    return ConstData(digest=digest)
