"""Strict readers of environment variables: a bad value stops the process at start, naming the variable."""

import os
from decimal import Decimal, InvalidOperation

from django.core.exceptions import ImproperlyConfigured

_UNSET = object()
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _raw(name: str, default):
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        if default is _UNSET:
            raise ImproperlyConfigured(f"The environment variable {name} is required.")
        return None
    return value.strip()


def env_str(name: str, default: str | object = _UNSET) -> str:
    value = _raw(name, default)
    return default if value is None else value


def env_bool(name: str, default: bool | object = _UNSET) -> bool:
    value = _raw(name, default)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use one of 1/0, true/false, yes/no, on/off).")


def _number(name, default, minimum, cast, noun):
    value = _raw(name, default)
    if value is None:
        return default
    try:
        number = cast(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not {noun}.") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} is below the minimum {minimum}.")
    return number


def env_int(name: str, default: int | object = _UNSET, *, minimum: int | None = None) -> int:
    return _number(name, default, minimum, int, "an integer")


def env_float(name: str, default: float | object = _UNSET, *, minimum: float | None = None) -> float:
    return _number(name, default, minimum, float, "a number")


def env_decimal(name: str, default: Decimal | object = _UNSET) -> Decimal:
    value = _raw(name, default)
    if value is None:
        return default
    try:
        number = Decimal(value)
    except InvalidOperation:
        raise ImproperlyConfigured(f"{name}={value!r} is not a decimal number.") from None
    if not number.is_finite():
        raise ImproperlyConfigured(f"{name}={value!r} is not a finite number.")
    return number


def env_list(name: str, default: list[str] | object = _UNSET) -> list[str]:
    value = _raw(name, default)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]
