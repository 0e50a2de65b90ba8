"""The PyTorch adapter: a dispatch-mode recorder and the aten -> IR table."""

from .listener import TorchListener
from .rules import ATEN

__all__ = ["ATEN", "TorchListener"]
