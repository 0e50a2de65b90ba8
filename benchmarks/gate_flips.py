"""Which gates float32 rounding flipped: a log's program run forward on its
sample (and on draws nudged by one ulp, as ``tracelog.check(..., draw=k)``
runs them) in float32 and in float64, and every gate it passes compared
element by element: the gates the check itself matches (the target's
``_gate_table`` and the check's ``_kinks``): a ReLU's input, a clamp's or
clip's against each bound, a ``maximum``/``minimum``'s two operands. A flip is an element on one side of
its kink in float32 and on the other in float64; the gradient then flows in
one run and is blocked in the other, whatever each run's accuracy.

    python benchmarks/gate_flips.py LOG_DIR --target jax --draws 2

Each draw prints its largest float32 accuracy ratios (the check's rows) and
the gate calls with flips, each by the program function and line that made
it and the ``prefix`` it ran under (the module it was written from), with the
float64 value nearest its kink among the flipped elements. When this was
written, Keras ResNet50 (batch 8) to JAX read 3.02 on
``grad conv4_block2_1_conv/kernel`` on the recorded draw with one flip in
``conv4_block2_1_``'s ReLU (an input of 1.1e-5 in float64) that the PyTorch
program (1.35) did not have; on draw 2 both programs flipped it (2.75, 2.77).
"""

from __future__ import annotations

import argparse
import linecache
import runpy
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import tracelog
from tracelog.emit import harness


@dataclass
class Gate:
    """One gate call: where it ran, and its sides (a difference whose sign is
    the gate's decision) as float64 arrays, one per kink."""

    where: str
    sides: list[np.ndarray]


def _caller() -> str:
    """The program function and line that called the gate (two frames up:
    past the wrapper), with the `prefix` it ran under where it has one."""
    frame = sys._getframe(2)
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    prefix = frame.f_locals.get("prefix")
    under = f"(prefix={prefix!r}) " if isinstance(prefix, str) else ""
    return f"{frame.f_code.co_name} {under}line {frame.f_lineno}: {line}"


def _module_gates(
    ns: dict[str, Any], table: dict[str, Any], module: Any
) -> Iterator[tuple[Any, str, str]]:
    """(module, attribute, kind) for each gate a target's _gate_table names,
    its nested tables walked down to the module that holds the function."""
    for name, entry in table.items():
        found = getattr(module, name) if module is not None else ns.get(name)
        if found is None:  # a module this program does not import
            continue
        if isinstance(entry, dict):
            yield from _module_gates(ns, entry, found)
        else:
            yield module, name, entry


@contextmanager
def gates_seen(ns: dict[str, Any], seen: list[tuple[str, list[tuple[Any, Any]]]]) -> Iterator[None]:
    """The program's gate functions (its target's _gate_table, the parity
    check's gates) wrapped in their modules: each call appends where it ran
    and its (value, kink) pairs (the check's _kinks)."""
    saved = []
    for module, attr, kind in _module_gates(ns, ns["_gate_table"](), None):
        original = getattr(module, attr)
        saved.append((module, attr, original))

        def wrapper(*args: Any, _run: Any = original, _kind: str = kind, **kwargs: Any) -> Any:
            seen.append((_caller(), ns["_kinks"](_kind, args, kwargs)))
            return _run(*args, **kwargs)

        setattr(module, attr, wrapper)
    try:
        yield
    finally:
        for module, attr, original in reversed(saved):
            setattr(module, attr, original)


def forward_gates(ns: dict[str, Any], log_dir: Path, target: str, draw: int) -> list[list[Gate]]:
    """The gates the program's sample forward passes, in float32 and float64."""

    def wide(x: Any) -> np.ndarray:  # the program's own conversion (bfloat16 widened)
        return np.asarray(ns["_numpy"](x), dtype=np.float64)

    runs = []
    for float64 in (False, True):
        params = ns["_module_params"](ns["sample_params"](str(log_dir), float64, draw))
        sample = ns["_load"](str(log_dir / "sample.safetensors"), narrow=not float64)
        sample = ns["_nudged"](sample, draw)
        seen: list[tuple[str, list[tuple[Any, Any]]]] = []
        with gates_seen(ns, seen):
            if float64:
                with ns["_in_float64"]():
                    ns["sample_step"](params, ns["_promoted"](sample))
            else:
                ns["sample_step"](params, sample)
        runs.append([Gate(where, [wide(v) - wide(k) for v, k in kinks]) for where, kinks in seen])
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log_dir", type=Path)
    parser.add_argument("--target", default="torch", choices=["jax", "tensorflow", "torch"])
    parser.add_argument("--draws", type=int, default=2, help="nudged draws beside the recorded")
    parser.add_argument("--top", type=int, default=3, help="largest ratios printed per draw")
    args = parser.parse_args()
    if args.target == "jax":
        import jax

        jax.config.update("jax_enable_x64", True)  # as the check's float64 run has it
    program = args.log_dir / f"program_{args.target}.py"
    if not program.exists():
        tracelog.emit(args.log_dir, target=args.target)
    ns = runpy.run_path(str(program), run_name="gate_flips")
    harness.attach(ns, args.target)
    for draw in range(args.draws + 1):
        try:
            report = tracelog.check(args.log_dir, args.target, draw=draw)
        except ValueError as e:  # no reference, or bfloat16 values a draw cannot nudge
            print(f"gate_flips: {e}", file=sys.stderr)
            return 2
        rows = [c for c in report.comparisons if c.ratio is not None and "[float64]" not in c.name]
        rows.sort(key=lambda c: -(c.ratio or 0.0))
        print(f"draw {draw}: largest float32 ratios")
        for c in rows[: args.top]:
            print(f"  {c.ratio:6.2f}  {c.name}")
        f32, f64 = forward_gates(ns, args.log_dir, args.target, draw)
        if len(f32) != len(f64):
            print(f"  the float32 and float64 runs passed {len(f32)} and {len(f64)} gates")
            return 1
        total = 0
        for narrow, wide in zip(f32, f64, strict=True):
            for a, b in zip(narrow.sides, wide.sides, strict=True):
                flipped = (a > 0) != (b > 0)
                n = int(flipped.sum())
                if n:
                    total += n
                    nearest = float(np.abs(b[flipped]).min())
                    print(f"  {n} flipped (float64 {nearest:.1e} from the kink)  {narrow.where}")
        print(f"  {total} flipped gate elements over {len(f32)} gate calls\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
