"""The aten table, on the framework-neutral Builder."""

from __future__ import annotations

from tracelog.adapters.builder import Builder, Converter, Ctx, NotSupported
from tracelog.registry import Table

ATEN: Table[Converter] = Table("aten")

__all__ = ["ATEN", "Builder", "Converter", "Ctx", "NotSupported"]
