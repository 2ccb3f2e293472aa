"""Registry: a named table of callables, the one mechanism for swappable parts.

Every swappable piece of the codebase (weight functions, advantage estimators, tasks,
aggregations, model families) is an entry in a `Registry`, registered in its defining
module with the `register` decorator. A registry knows the config key it serves
(`Registry("weight function", key="objective.weight")`); configs name entries by string,
and an unknown name is an `UnknownNameError` (a `ConfigError`) that names the key and lists
the known names, so a typo in a sweep fails at setup, not mid-run.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from jaxrl_frontier.core.errors import UnknownNameError

F = TypeVar("F", bound=Callable[..., Any])


class Registry:
    """Name -> callable table.

    >>> WEIGHTS = Registry("weight function", key="objective.weight")
    >>> @WEIGHTS.register("pg")
    ... def pg(stats, adv): ...
    >>> WEIGHTS.get("pg") is pg
    True
    """

    def __init__(self, kind: str, key: str | None = None, default_part: type | None = None):
        self.kind, self.key = kind, key  # key: the config key whose values name entries
        # the class whose `capabilities` an entry registered without `part` has (None: all)
        self.default_part = default_part
        self._entries: dict[str, Callable[..., Any]] = {}
        self._parts: dict[str, type] = {}  # name -> the class the entry builds

    def register(self, name: str, part: type | None = None) -> Callable[[F], F]:
        """Decorator registering `fn` under `name`; the function is returned unchanged.
        `part`: the class `fn` builds, whose `capabilities` (`core.capabilities`) declare what
        it supports, read by `capabilities(name)` without building it (None: every feature)."""
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"{self.kind} registry: a name must be a non-empty string, got {name!r}"
            )

        def decorator(fn: F) -> F:
            if name in self._entries:
                raise ValueError(
                    f"{self.kind} registry: duplicate name {name!r} "
                    f"(already registered to {self._entries[name].__qualname__})"
                )
            self._entries[name] = fn
            if part is not None:
                self._parts[name] = part
            return fn

        return decorator

    def unregister(self, name: str) -> None:
        """Remove entry `name` (absent: nothing happens): a test or a notebook that registered
        an entry of its own takes it back, so the process-wide registry is as it found it."""
        self._entries.pop(name, None)
        self._parts.pop(name, None)

    def get(self, name: str) -> Callable[..., Any]:
        """The callable registered under `name`; an `UnknownNameError` naming the registry's
        config key and listing the known names if absent."""
        try:
            return self._entries[name]
        except KeyError:
            close = difflib.get_close_matches(str(name), self._entries, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            where = f"config key {self.key!r}: " if self.key else ""
            raise UnknownNameError(
                f"{where}unknown {self.kind} {name!r}. "
                f"Known {self.kind}s: {', '.join(self.names())}.{hint}"
            ) from None

    def part(self, name: str) -> type | None:
        """The class entry `name` builds, as registered (`part=`), else the registry's
        `default_part` (None: not declared): its class-level declarations are read without
        building it. An `UnknownNameError` for an unknown name."""
        self.get(name)
        return self._parts.get(name, self.default_part)

    def capabilities(self, name: str):
        """The `Capabilities` the class of entry `name` declares (registered without `part`:
        the registry's `default_part`'s, or every feature); an `UnknownNameError` for an
        unknown name."""
        from jaxrl_frontier.core.capabilities import ALL

        part = self.part(name)
        return ALL if part is None else part.capabilities

    def names(self) -> list[str]:
        """Sorted registered names."""
        return sorted(self._entries)

    def doc(self, name: str) -> str:
        """The docstring of an entry (formula, config keys, paper)."""
        return self.get(name).__doc__ or ""

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, key={self.key!r}, names={self.names()})"


def import_user_module(module: str, *, key: str) -> None:
    """Import `module` (a dotted name on sys.path, or a path to a .py file) so the entries it
    registers can be named in the config; `key` is the config key that gave it (for errors).
    Importing twice is a no-op: the module is cached in sys.modules under its name, or for a
    file under a name derived from its absolute path."""
    if not module:
        return
    if module.endswith(".py") or os.sep in module:
        path = os.path.abspath(module)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"config key {key!r}: no such file {path}")
        name = "jaxrl_user_" + "".join(c if c.isalnum() else "_" for c in path)
        if name in sys.modules:
            return
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]  # a failed import is retried, not half-registered
            raise
        return
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            f"config key {key!r} = {module!r}: {e} (give a module on sys.path or a .py file)"
        ) from None
