"""The PyTorch adapter: a dispatch-mode recorder and the aten -> IR table."""

from .builder import ATEN
from .listener import TorchListener

__all__ = ["ATEN", "TorchListener"]
