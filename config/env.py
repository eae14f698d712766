"""Strict readers of environment variables: a bad value stops the process at start, naming the variable."""

import enum
import os
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import TypeVar

from django.core.exceptions import ImproperlyConfigured


class _Unset(enum.Enum):
    UNSET = enum.auto()


_UNSET = _Unset.UNSET
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
T = TypeVar("T")
Number = TypeVar("Number", int, float)


def _raw(name: str) -> str | None:
    """The variable's value stripped; None when it is unset or blank."""
    return os.environ.get(name, "").strip() or None


def _default(name: str, default: T | _Unset) -> T:
    if isinstance(default, _Unset):
        raise ImproperlyConfigured(f"The environment variable {name} is required.")
    return default


def env_str(name: str, default: str | _Unset = _UNSET) -> str:
    value = _raw(name)
    return _default(name, default) if value is None else value


def env_bool(name: str, default: bool | _Unset = _UNSET) -> bool:
    value = _raw(name)
    if value is None:
        return _default(name, default)
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use one of 1/0, true/false, yes/no, on/off).")


def _number(name: str, default: Number | _Unset, minimum: Number | None, cast: Callable[[str], Number],
            noun: str, maximum: Number | None = None) -> Number:
    value = _raw(name)
    if value is None:
        return _default(name, default)
    try:
        number = cast(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not {noun}.") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} is below the minimum {minimum}.")
    if maximum is not None and number > maximum:
        raise ImproperlyConfigured(f"{name}={number} is above the maximum {maximum}.")
    return number


def env_int(name: str, default: int | _Unset = _UNSET, *, minimum: int | None = None,
            maximum: int | None = None) -> int:
    return _number(name, default, minimum, int, "an integer", maximum)


def env_float(name: str, default: float | _Unset = _UNSET, *, minimum: float | None = None) -> float:
    return _number(name, default, minimum, float, "a number")


def env_decimal(name: str, default: Decimal | _Unset = _UNSET) -> Decimal:
    value = _raw(name)
    if value is None:
        return _default(name, default)
    try:
        number = Decimal(value)
    except InvalidOperation:
        raise ImproperlyConfigured(f"{name}={value!r} is not a decimal number.") from None
    if not number.is_finite():
        raise ImproperlyConfigured(f"{name}={value!r} is not a finite number.")
    return number


def env_list(name: str, default: list[str] | _Unset = _UNSET) -> list[str]:
    value = _raw(name)
    if value is None:
        return list(_default(name, default))
    return [item.strip() for item in value.split(",") if item.strip()]
