"""Named plug-ins, one helper for every plug-in point: environments (`env.name`), sinks (`sinks`),
loss terms (`trainer.loss`), reward signals (`reward.weights`), record rules and teachers (`teacher`, opd.teachers).

A `Registry` holds one point's entries by name, each with the metadata it declares where it is
registered (a loss term that needs teacher rows, a record rule's layer). A name registered twice is
refused when the second registers (`DuplicateName`: two plug-ins must not silently replace each
other); a name looked up that is not there is a ConfigError naming the config key the name came
from, the nearest name and every name there is.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar

from opd.config import ConfigError

T = TypeVar("T")


class DuplicateName(ValueError):
    """A plug-in registered under a name its registry already holds."""


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered plug-in: its name, the object and what it declared about itself."""

    name: str
    value: T
    meta: Mapping[str, Any] = field(default_factory=dict)


class Registry(Generic[T]):
    """The plug-ins of one point, in the order they were registered.

    `what` names one entry in messages ("loss term"); `key` is the config key whose values name
    entries (None where no config names them)."""

    def __init__(self, what: str, key: str | None = None) -> None:
        self.what, self.key = what, key
        self._entries: dict[str, Entry[T]] = {}

    def add(self, name: str, value: T, **meta: Any) -> T:
        """Register `value` as `name` with its metadata; a DuplicateName when `name` is taken."""
        if name in self._entries:
            raise DuplicateName(f"{self.what} {name!r} is registered twice: {_origin(self._entries[name].value)} and {_origin(value)}")
        self._entries[name] = Entry(name, value, MappingProxyType(dict(meta)))
        return value

    def register(self, name: str | None = None, **meta: Any) -> Callable[[T], T]:
        """A decorator: `@REGISTRY.register("name", key=value)` (the function's own name when none)."""

        def add(value: T) -> T:
            return self.add(name if name is not None else getattr(value, "__name__"), value, **meta)

        return add

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, name: str) -> T:
        return self._entries[name].value

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def entries(self) -> list[Entry[T]]:
        return list(self._entries.values())

    def values(self) -> list[T]:
        return [entry.value for entry in self._entries.values()]

    def items(self) -> Iterator[tuple[str, T]]:
        return ((name, entry.value) for name, entry in self._entries.items())

    def copy(self) -> Registry[T]:
        """A registry of the same point holding the same entries (adding to it leaves this one as it is)."""
        other: Registry[T] = Registry(self.what, self.key)
        other._entries = dict(self._entries)
        return other

    def entry(self, name: str, key: str | None = None) -> Entry[T]:
        """The entry `name`; a ConfigError naming `key` (default: the registry's) when there is none."""
        if name in self._entries:
            return self._entries[name]
        raise ConfigError(self.unknown(name, key), key or self.key)

    def get(self, name: str, key: str | None = None) -> T:
        """The plug-in `name`; a ConfigError naming `key` (default: the registry's) when there is none."""
        return self.entry(name, key).value

    def meta(self, name: str, item: str, default: Any = None) -> Any:
        """What the entry `name` declared as `item` (`default` when it declared nothing)."""
        return self.entry(name).meta.get(item, default)

    def where(self, **meta: Any) -> list[Entry[T]]:
        """The entries that declared every `meta` item with that value, in order."""
        return [entry for entry in self._entries.values() if all(entry.meta.get(k) == v for k, v in meta.items())]

    def nearest(self, name: str) -> str | None:
        """The registered name closest to a mistyped `name` (None when nothing is close)."""
        close = difflib.get_close_matches(str(name), self.names, n=1, cutoff=0.6)
        return close[0] if close else None

    def unknown(self, name: str, key: str | None = None, more: str = "") -> str:
        """The one line for a name that is not registered: `key: no <what> named 'x'; did you mean
        y? (<what>s: a, b, c)`, `more` added inside the parentheses."""
        close = self.nearest(name)
        hint = f"; did you mean {close}?" if close else ""
        prefix = f"{key or self.key}: " if (key or self.key) else ""
        return f"{prefix}no {self.what} named {name!r}{hint} ({self.what}s: {', '.join(self.names) or 'none'}{more})"


def _origin(value: Any) -> str:
    """Where a plug-in comes from: a class's or function's `module.name`; an instance (a tool, a
    record rule) by its type and the function it holds (`Tool of opd.tools.math_tools._calculator`)."""
    module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if module and name:
        return f"{module}.{name}"
    held = next((v for v in getattr(value, "__dict__", {}).values() if inspect.isfunction(v)), None)
    return f"{type(value).__name__} of {_origin(held)}" if held is not None else repr(value)
