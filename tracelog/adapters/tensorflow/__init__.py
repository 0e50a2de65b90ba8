"""The TensorFlow/Keras adapter: an op-callback recorder and the TF-op table."""

from .listener import TFListener
from .ops import TF_OPS

__all__ = ["TF_OPS", "TFListener"]
