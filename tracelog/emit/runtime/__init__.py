"""Code that emitted programs carry: real, linted, type-checked and tested
modules whose functions ``tracelog.emit.inline`` copies into each program.

- ``parity``: loading weights and the recorded sample, the parity check and
  the program's ``main``; the same for every target.
- one module per target (``torch_program``, ...): the target's imports, its
  parameter objects (``_as_param``), its autodiff (``_value_and_grads``,
  ``_runs``), and helpers that op spellings call, inlined only when used.

A program needs only its framework, numpy and safetensors: nothing here may
import tracelog at run time (``TYPE_CHECKING`` imports are stripped).
"""
