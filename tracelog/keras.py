"""Keras integration, public name: ``from tracelog.keras import TracelogCallback``.

The callback lives in the TensorFlow adapter
(:mod:`tracelog.adapters.tensorflow.keras`); this module only names it. Importing
it imports keras; ``import tracelog`` alone does not (``tracelog.keras`` is
imported on first attribute access).
"""

from __future__ import annotations

from tracelog.adapters.tensorflow.keras import TracelogCallback

__all__ = ["TracelogCallback"]
