"""A job's arguments against its handler's signature: bound, validated, converted.

At enqueue, the JSON arguments must fit the handler's parameters (after the context):
a missing or unknown argument is refused. Parameters annotated with a type pydantic
understands (``int``, ``datetime``, a pydantic model, ``list[Item]``...) are validated
then, and stored in their JSON form; at run time they are converted back, so the
handler gets a ``datetime`` or a model instance rather than a string or a dict.
Unannotated (or ``Any``) parameters take any JSON value as it is.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import pydantic

from tether.errors import InvalidJobError
from tether.job import JSON

# JSON values that validate to themselves need no dumping (the common case, and cheaper).
_PLAIN = (str, int, float, bool)


class Arguments:
    """The argument rules of one handler (its first parameter, the context, excluded)."""

    def __init__(self, task_name: str, fn: Callable[..., Any]) -> None:
        self._task = task_name
        self._fn = fn
        params = list(inspect.signature(fn).parameters.values())
        self.signature = inspect.Signature(params[1:])
        self._adapters: dict[str, pydantic.TypeAdapter[Any]] | None = None
        # Precomputed for check(), which every enqueue and every claimed job runs.
        by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        self._takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params[1:])
        self._names = frozenset(p.name for p in params[1:] if p.kind in by_name)
        self._required = tuple(
            p.name for p in params[1:] if p.kind in by_name and p.default is inspect.Parameter.empty
        )

    def adapters(self) -> dict[str, pydantic.TypeAdapter[Any]]:
        """A validator per annotated parameter, built at first use: by then every name
        the annotations mention (forward references included) is defined."""
        if self._adapters is None:
            try:
                hints = typing.get_type_hints(self._fn, include_extras=True)
            except Exception:  # annotations naming what cannot be resolved: take them as Any
                hints = {}
            found: dict[str, pydantic.TypeAdapter[Any]] = {}
            for name, param in self.signature.parameters.items():
                hint = hints.get(name, Any)
                if hint is Any or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                    continue
                try:
                    found[name] = pydantic.TypeAdapter(hint)
                except pydantic.PydanticUserError:
                    continue  # a type pydantic cannot check is left unchecked
            self._adapters = found
        return self._adapters

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Positional and keyword arguments as the name -> value mapping a job stores."""
        if not args:
            self.check(kwargs)
            return kwargs
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidJobError(f"arguments of {self._task!r}: {exc}") from exc
        out: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = self.signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                out.update(value)
            elif (
                kind is inspect.Parameter.VAR_POSITIONAL
                or kind is inspect.Parameter.POSITIONAL_ONLY
            ):
                raise InvalidJobError(
                    f"arguments of {self._task!r}: a job's arguments have names; "
                    f"the handler's {name!r} cannot receive one"
                )
            else:
                out[name] = value
        return out

    def check(self, named: dict[str, Any]) -> None:
        """Refuse unknown names and missing required ones, saying which."""
        unknown = [] if self._takes_any else [n for n in named if n not in self._names]
        missing = [n for n in self._required if n not in named]
        if not unknown and not missing:
            return
        problems = []
        if unknown:
            takes = ", ".join(n for n in self.signature.parameters if n in self._names) or "none"
            problems.append(
                f"unexpected keyword argument {', '.join(map(repr, unknown))} (it takes: {takes})"
            )
        if missing:
            problems.append(f"missing a required argument: {', '.join(map(repr, missing))}")
        raise InvalidJobError(f"arguments of {self._task!r}: {'; '.join(problems)}")

    def for_storage(self, args: dict[str, Any]) -> dict[str, JSON]:
        """Check ``args`` against the handler; return them in JSON form."""
        self.check(args)
        adapters = self.adapters()
        if not adapters:
            return args
        out = dict(args)
        for name, adapter in adapters.items():
            if name in args:
                given = args[name]
                value = self._validate(adapter, name, given)
                if type(value) is not type(given) or type(given) not in _PLAIN:
                    out[name] = adapter.dump_python(value, mode="json")
        return out

    def for_call(self, args: dict[str, JSON]) -> dict[str, Any]:
        """The stored ``args`` converted to what the handler's annotations ask for.
        Raises :class:`InvalidJobError` if they no longer fit (the handler changed)."""
        self.check(args)
        adapters = self.adapters()
        if not adapters:
            return args
        out = dict(args)
        for name, adapter in adapters.items():
            if name in args:
                out[name] = self._validate(adapter, name, args[name])
        return out

    def _validate(self, adapter: pydantic.TypeAdapter[Any], name: str, value: Any) -> Any:
        try:
            return adapter.validate_python(value)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, (name, *e['loc'])))}: {e['msg']}" for e in exc.errors()
            )
            raise InvalidJobError(f"arguments of {self._task!r}: {problems}") from exc
