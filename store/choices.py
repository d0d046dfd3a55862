"""One rule for an option that names one of an enum's members: ``choice``.

Every option with a fixed set of values is a ``StrEnum`` parsed once, where it comes in (the
Loader's settings, a public configuration record, the preprocess CLI), so code below compares
members and a misspelt value fails at once, naming the option and the values it takes.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from tilefeed.store.errors import ConfigError

E = TypeVar("E", bound=StrEnum)


def choice(kind: type[E], value: object, name: str) -> E:
    """``value`` as a member of ``kind``: a member as it is, a string by its value.

    Parameters
    ----------
    kind : type of StrEnum
        The enum the option takes.
    value : object
        What the caller gave.
    name : str
        The option's name, for the error.

    Returns
    -------
    StrEnum
        The member ``value`` names.

    Raises
    ------
    ConfigError
        ``value`` names no member: the message lists the values ``kind`` takes.
    """
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        for member in kind:
            if member.value == value:
                return member
    raise ConfigError(f"{name} must be one of {', '.join(m.value for m in kind)}, got {value!r}")
