"""Record: what a namedtuple gives its readers (fields by name, defaults, ==, repr,
_replace), without `collections`.

Every CLI call imports the modules that declare these records (paths, the listing's
columns), and collections takes 2.9 ms to import (python -X importtime; `python -c pass`
takes 12), which namedtuple or typing.NamedTuple (typing: 12 ms) would add to each command.
A subclass names its fields in __slots__ and its defaults in _defaults.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing: 12 ms at every fast command (tests/test_lean_imports.py)
if TYPE_CHECKING:
    from typing import Any, ClassVar


class Record:
    __slots__: tuple[str, ...] = ()
    _defaults: ClassVar[dict[str, Any]] = {}  # field -> its value when not given

    def __init__(self, *args: Any, **kwargs: Any):
        fields = self.__slots__
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__} takes at most {len(fields)} values")
        given = {**self._defaults, **dict(zip(fields, args)), **kwargs}
        unknown = given.keys() - set(fields)
        missing = [name for name in fields if name not in given]
        if unknown or missing:
            raise TypeError(f"{type(self).__name__}: missing {missing}, unknown {sorted(unknown)}")
        for name in fields:
            setattr(self, name, given[name])

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def _replace(self, **changes: Any) -> Any:
        return type(self)(**{**dict(zip(self.__slots__, self._values())), **changes})

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}("
            + ", ".join(f"{name}={value!r}" for name, value in zip(self.__slots__, self._values()))
            + ")"
        )
