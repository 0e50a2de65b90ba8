"""A table from op key to rule, with a duplicate check and an explicit list of
keys that are known and not yet supported. Adapters (source op -> IR) and
emitters (IR op -> target code) share it, so every table reads the same way."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

F = TypeVar("F")  # a rule: a function, a template, or a schema


class Table(Generic[F]):
    def __init__(self, name: str) -> None:
        self.name = name
        self._rules: dict[str, F] = {}
        self._not_yet: dict[str, str] = {}

    def register(self, *keys: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            for key in keys:
                self.add(key, fn)
            return fn

        return deco

    def add(self, key: str, fn: F) -> None:
        if key in self._rules:
            raise ValueError(f"{self.name}: {key} is registered twice")
        if key in self._not_yet:
            raise ValueError(f"{self.name}: {key} is both registered and listed as not yet")
        self._rules[key] = fn

    def not_yet(self, *keys: str, reason: str = "not yet implemented") -> None:
        for key in keys:
            if key in self._rules:
                raise ValueError(f"{self.name}: {key} is both registered and listed as not yet")
            self._not_yet[key] = reason

    def get(self, key: str) -> F | None:
        return self._rules.get(key)

    def __getitem__(self, key: str) -> F:
        try:
            return self._rules[key]
        except KeyError:
            reason = self._not_yet.get(key, "no rule")
            raise NotImplementedError(f"{self.name}: {key}: {reason}") from None

    def __contains__(self, key: object) -> bool:
        return key in self._rules

    def keys(self) -> list[str]:
        return sorted(self._rules)

    def not_yet_keys(self) -> dict[str, str]:
        return dict(sorted(self._not_yet.items()))

    def reason(self, key: str) -> str | None:
        return self._not_yet.get(key)

    def update_from(self, keys: Iterable[str], fn: F) -> None:
        for key in keys:
            self.add(key, fn)
