"""One rule for an option that names one of an enum's members: ``choice``.

Every option with a fixed set of values is a ``StrEnum`` parsed once, where it comes in (the
Loader's settings, a public configuration record, the preprocess CLI), so code below compares
members and a misspelt value fails at once, naming the option and the values it takes.
"""

from __future__ import annotations

from enum import StrEnum
from collections.abc import Iterable
from typing import TypeVar

from tilefeed.store.errors import ConfigError

E = TypeVar("E", bound=StrEnum)


def choice(kind: type[E], value: object, name: str, among: Iterable[E] | None = None) -> E:
    """``value`` as a member of ``kind``: a member as it is, a string by its value.

    Parameters
    ----------
    kind : type of StrEnum
        The enum the option takes.
    value : object
        What the caller gave.
    name : str
        The option's name, for the error.
    among : iterable of members of ``kind``, optional
        The members this option takes, where it takes only some (a script's flag that has no
        counterpart of the others); default all of them.

    Returns
    -------
    StrEnum
        The member ``value`` names.

    Raises
    ------
    ConfigError
        ``value`` names no member it takes: the message lists the values it takes.
    """
    members = tuple(kind) if among is None else tuple(among)
    if isinstance(value, kind) and value in members:
        return value
    if isinstance(value, str):
        for member in members:
            if member.value == value:
                return member
    raise ConfigError(f"{name} must be one of {', '.join(m.value for m in members)}, got {value!r}")
