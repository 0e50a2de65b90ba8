"""The ``tracelog`` command line: show, verify, emit and check log directories."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracelog import __version__
from tracelog.emit.common import LINE_LENGTH
from tracelog.errors import TracelogError
from tracelog.log import TraceLog
from tracelog.progress import progress, stderr_is_tty


def _epochs(epochs: list[int]) -> str:
    if not epochs:
        return "-"
    if epochs == list(range(epochs[0], epochs[-1] + 1)):
        return str(epochs[0]) if len(epochs) == 1 else f"{epochs[0]}-{epochs[-1]}"
    return ",".join(str(e) for e in epochs)


def _pos(p: tuple[int, int] | None) -> str:
    return "-" if p is None else f"{p[0]}:{p[1]}"


def _ops(hist: dict[str, int]) -> str:
    return ", ".join(op if n == 1 else f"{op} x{n}" for op, n in hist.items())


def interrupted_line(log: TraceLog) -> str | None:
    """The first line ``show`` prints for a log whose run did not close."""
    if not log.interrupted:
        return None
    at = log.run.get("checkpoint") or "an unknown time"
    return f"interrupted: the run did not close; counts as of the last checkpoint at {at}"


def _distributed(log: TraceLog) -> str:
    d = log.distributed
    if not d:
        return ""
    return f"; rank {d.get('rank', '?')} of {d.get('world_size', '?')} ({d.get('backend', '?')})"


def show_text(log: TraceLog, where: str) -> str:
    fw = log.framework
    first = interrupted_line(log)
    lines = [first] if first else []
    lines += [
        f"{where}: {fw.get('name', '?')} {fw.get('version', '')} on {fw.get('device', '?')}, "
        f"model {log.model.get('class', '?')}; {log.recorded} batches recorded, "
        f"{log.unrecorded} unrecorded"
        + ("" if log.optimizer_steps is None else f"; {log.optimizer_steps} optimizer steps")
        + _distributed(log)
    ]
    header = (
        "#",
        "kind",
        "phase",
        "hash",
        "nodes",
        "batches",
        "exact",
        "guarded",
        "epochs",
        "first",
        "last",
        "ops",
    )
    rows = [header]
    for i, e in enumerate(log.entries_sorted(), 1):
        g = log.graphs[e.hash]
        rows.append(
            (
                str(i),
                e.kind,
                e.phase,
                e.hash[:12],
                str(len(g.nodes)),
                str(e.usage.batches),
                str(e.usage.batches - e.usage.guarded),
                str(e.usage.guarded),
                _epochs(e.usage.epochs),
                _pos(e.usage.first),
                _pos(e.usage.last),
                _ops(g.op_histogram()),
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(header) - 1)]
    for r in rows:
        cells = [r[c].ljust(widths[c]) for c in range(len(widths))] + [r[-1]]
        lines.append("  ".join(cells).rstrip())
    lines.append(
        "(exact: recorded op by op; guarded: counted by the guarded fast path; first/last are "
        "epoch:batch; batch counts restart each epoch and phase)"
    )
    lines += recording_lines(log.recording)
    for f in log.failures:
        lines.append(
            f"unrecorded: {f['phase']} epoch {f['epoch']} batch {f['batch']}: {f['error']}"
        )
    if log.unrecorded > len(log.failures):
        lines.append(f"... and {log.unrecorded - len(log.failures)} more unrecorded batches")
    return "\n".join(lines)


def recording_lines(recording: dict[str, Any] | None) -> list[str]:
    """What the guarded fast path noticed: data-dependent branches, a switch to exact mode."""
    if not recording:
        return []
    lines = []
    n = int(recording.get("branches", 0))
    if n:
        first = (recording.get("branch_batches") or [{}])[0]
        lines.append(
            f"guards: {n} guarded batch{'es' if n != 1 else ''} made other module or function "
            f"calls than the recorded ones (a data-dependent branch; first: {first.get('phase')} "
            f"epoch {first.get('epoch')} batch {first.get('batch')}); each was counted for the "
            "graphs of its own path, once an exact recording showed them"
        )
    switched = recording.get("switched_to_exact")
    if switched:
        lines.append(
            f"guards: switched to exact mode at {switched.get('phase')} epoch "
            f"{switched.get('epoch')} batch {switched.get('batch')}: {switched.get('why')} "
            f"({switched.get('guarded_before')} batches were counted under guards before)"
        )
    return lines


def show_json(log: TraceLog) -> str:
    entries = []
    for e in log.entries_sorted():
        g = log.graphs[e.hash]
        entries.append(
            {
                "hash": e.hash,
                "kind": e.kind,
                "phase": e.phase,
                "nodes": len(g.nodes),
                "ops": g.op_histogram(),
                **e.usage.to_json(),
                **e.usage.counts_json(),
            }
        )
    return json.dumps(
        {
            "state": log.run.get("state"),
            "checkpoint": log.run.get("checkpoint"),
            "framework": log.framework,
            "recorded": log.recorded,
            "unrecorded": log.unrecorded,
            "optimizer_steps": log.optimizer_steps,
            "distributed": log.distributed,
            "recording": log.recording,
            "entries": entries,
        },
        indent=1,
    )


def _working(args: argparse.Namespace, text: str) -> Any:
    """A progress line on stderr for work longer than a second: never on
    stdout, never when stderr is not a terminal or with --quiet."""
    return progress(text, not args.quiet and stderr_is_tty())


def show_and_check(log_dir: str | os.PathLike[str], targets: Sequence[str]) -> int:
    """What the examples end with: the log as `tracelog show` prints it, then
    `tracelog check` on each target; 0 when every check passes, else 1."""
    from tracelog.parity import check

    print(show_text(TraceLog.load(log_dir), str(log_dir)))
    ok = True
    for target in targets:
        report = check(log_dir, target)
        print(report.table())
        ok = ok and report.ok
    return 0 if ok else 1


def _cmd_show(args: argparse.Namespace) -> int:
    with _working(args, f"reading {args.log_dir}"):
        log = TraceLog.load(args.log_dir)
    print(show_json(log) if args.json else show_text(log, args.log_dir))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from tracelog.verify import verify

    with _working(args, f"replaying {args.log_dir} on {args.runtime}"):
        report = verify(args.log_dir, runtime=args.runtime, atol=args.atol, rtol=args.rtol)
    print(report.table())
    return 0 if report.ok else 1


def _line_length(text: str) -> int:
    """--line-length: a positive int (black takes any; 1 is legal, if odd)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _cmd_emit(args: argparse.Namespace) -> int:
    from tracelog.emit import PROGRAM_TARGETS, emit

    if args.standalone and args.target not in PROGRAM_TARGETS:
        raise TracelogError(
            f"--standalone is for programs ({', '.join(PROGRAM_TARGETS)}); "
            f"{args.target} writes a model file, which carries no check"
        )
    if args.out:
        parent = Path(args.out).parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TracelogError(
                f"cannot create {parent} for --out: {e.strerror or e} ({e.filename or parent})"
            ) from None
    with _working(args, f"emitting {args.target} from {args.log_dir}"):
        path = emit(
            args.log_dir,
            args.target,
            args.out,
            line_length=args.line_length,
            standalone=args.standalone,
        )
    print(path)
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from tracelog.parity import check

    with _working(args, f"checking {args.target} on {args.log_dir}"):
        report = check(
            args.log_dir, args.target, atol=args.atol, rtol=args.rtol, grad_atol=args.grad_atol
        )
    print(report.table())
    return 0 if report.ok else 1


def _cmd_diff(args: argparse.Namespace) -> int:
    from tracelog.diff import diff, dumps

    with _working(args, f"comparing {args.old} and {args.new}"):
        result = diff(args.old, args.new, counts=args.counts)
    print(dumps(result, args.format))
    return 0 if result.equal else 1


def _cmd_compare(args: argparse.Namespace) -> int:
    from tracelog.compare import compare, dumps, read_mapping

    mapping = read_mapping(args.mapping) if args.mapping else None
    with _working(args, f"comparing {args.log_a} and {args.log_b}"):
        result = compare(args.log_a, args.log_b, mapping=mapping)
    print(dumps(result, args.format))
    return 0 if result.equal else 1


_EXAMPLES = {
    "show": """examples:
  tracelog show runs/digits           # one row per unique graph: batches, epochs, ops
  tracelog show runs/digits --json    # the same, for a tool
""",
    "verify": """examples:
  tracelog verify runs/digits                          # the IR on onnx.reference
  tracelog verify runs/digits --runtime onnxruntime    # on onnxruntime
""",
    "emit": """examples:
  tracelog emit runs/digits --target tensorflow   # -> runs/digits/program_tensorflow.py
  tracelog emit runs/digits --target onnx         # -> runs/digits/model.onnx
  tracelog emit runs/digits --target jax --out programs/digits_jax.py
""",
    "check": """examples:
  tracelog check runs/digits --target tensorflow  # translation and float32 rows; exit 1 on mismatch
  tracelog check runs/ddp --target jax --quiet     # no progress line (also off when piped)
""",
    "diff": """examples:
  tracelog diff runs/main runs/pr                     # what changed in the model
  tracelog diff runs/main runs/pr --format markdown   # for a pull-request comment
  tracelog diff runs/main runs/pr --format json --counts
""",
    "compare": """examples:
  tracelog compare runs/torch_cnn runs/keras_cnn      # first structural difference, or parity
  tracelog compare runs/torch_cnn runs/keras_cnn --mapping names.json --format markdown
names.json maps A's parameters to B's where the structural match is not wanted:
  {"fc.weight": "sequential/dense/kernel"}
""",
}


def _add(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
    """A subcommand, its --help ending with examples."""
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help,
        description=help,
        epilog=_EXAMPLES[name],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line on stderr")
    return p


def _log_and_target(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
    """A subcommand on a log directory for one registered target."""
    from tracelog.emit import TARGETS

    p = _add(sub, name, help)
    p.add_argument("log_dir")
    p.add_argument("--target", choices=TARGETS, required=True)
    return p


def _tolerances(p: argparse.ArgumentParser) -> None:
    p.add_argument("--atol", type=float, default=1e-5)
    p.add_argument("--rtol", type=float, default=1e-4)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tracelog",
        description="Inspect and check logs written by a tracelog listener.",
        epilog="Each command's --help ends with examples. Progress goes to stderr, on a "
        "terminal only, for work longer than a second (--quiet: none).",
    )
    parser.add_argument("--version", action="version", version=f"tracelog {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = _add(sub, "show", "one row per unique graph, with its usage counts")
    p.add_argument("log_dir")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_show)
    p = _add(
        sub,
        "verify",
        "replay the recorded batch through the IR on an ONNX runtime; exit 1 on mismatch",
    )
    p.add_argument("log_dir")
    p.add_argument("--runtime", choices=("reference", "onnxruntime"), default="reference")
    _tolerances(p)
    p.set_defaults(func=_cmd_verify)
    p = _log_and_target(
        sub, "emit", "write a program for another framework (exit 2 listing unsupported ops)"
    )
    p.add_argument(
        "--out", help="file to write (default: LOG_DIR/program_<target>.py, or LOG_DIR/model.onnx)"
    )
    p.add_argument(
        "--line-length",
        type=_line_length,
        default=LINE_LENGTH,
        help=f"black's line length for the program (default: {LINE_LENGTH}, black's own)",
    )
    p.add_argument(
        "--standalone",
        action="store_true",
        help="carry the parity check in the program, so that running it as a script "
        "needs no tracelog (by default it runs tracelog's; the model part never needs it)",
    )
    p.set_defaults(func=_cmd_emit)
    p = _log_and_target(
        sub, "check", "emit, run the program on the recorded batch, compare; exit 1 on mismatch"
    )
    _tolerances(p)
    p.add_argument("--grad-atol", type=float, default=1e-4)
    p.set_defaults(func=_cmd_check)
    p = _add(
        sub,
        "diff",
        "semantic diff of two logs: modules, ops, shapes, parameters; exit 1 when they differ",
    )
    p.add_argument("old", help="the log to compare against (the main branch's, say)")
    p.add_argument("new")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    p.add_argument(
        "--counts", action="store_true", help="usage counts differing make a difference too"
    )
    p.set_defaults(func=_cmd_diff)
    p = _add(
        sub,
        "compare",
        "two implementations of one model (PyTorch and Keras, say): the first structural "
        "difference, or parity of predictions, loss and gradients with B's weights mapped "
        "from A's; exit 1 when they differ",
    )
    p.add_argument("log_a", help="the reference implementation's log")
    p.add_argument("log_b", help="the second implementation's log")
    p.add_argument(
        "--mapping",
        help="JSON file {A parameter: B parameter} overriding the structural match",
    )
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    p.set_defaults(func=_cmd_compare)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        return _closed_pipe()
    except (TracelogError, ImportError) as e:
        print(f"tracelog: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file the command writes or reads: one line, no traceback
        print(
            f"tracelog: error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr
        )
        return 2


def _closed_pipe() -> int:
    """The reader went away (``tracelog show | head -1``): end quietly, with
    the conventional status of a process killed by SIGPIPE."""
    try:  # what is still buffered cannot be written: send it nowhere at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass
    return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
