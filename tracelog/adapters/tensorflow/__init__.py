"""The TensorFlow/Keras adapter: an op-callback recorder, the TF-op table and
the Keras callback (``tracelog.keras``, imported on demand: it imports keras)."""

from . import (
    rules_ops,  # noqa: F401  (registers the keras.ops ops: TopKV2, Cumsum, OneHot, ...)
    rules_recurrent,  # noqa: F401  (registers keras.LSTM, keras.GRU, keras.SimpleRNN)
)
from .listener import TFListener
from .rules import TF_OPS

__all__ = ["TF_OPS", "TFListener"]
