"""Code that emitted programs carry: real, linted, type-checked and tested
modules whose functions ``tracelog.emit.inline`` copies into each program.

- ``weights``: reading ``weights.safetensors`` (``load_params``); every
  program carries it.
- ``parity``: loading the recorded sample, the parity check and its
  ``main``; the same for every target. A standalone program carries it;
  any other runs it from tracelog (``tracelog.emit.harness``).
- one module per target (``torch_program``, ...): the target's imports, its
  parameter objects (``_as_param``) and module tree, its autodiff for the
  check (``CHECK``: ``_value_and_grads``, ``_runs``), and helpers that op
  spellings call, inlined only when used.

A program needs only its framework, numpy and safetensors: nothing here may
import tracelog at run time (``TYPE_CHECKING`` imports are stripped).
"""
