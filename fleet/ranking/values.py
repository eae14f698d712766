"""Reading the numbers a user typed into a recipe or a filter, with an error that names the field."""

import math


def number(name, value, *, non_negative: bool = False) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")  # noqa: TRY004 - the form's error, as for "abc"
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(result) or (non_negative and result < 0):
        raise ValueError(f"{name} must be a finite number{' >= 0' if non_negative else ''}, got {value!r}")
    return result


def whole(name, value) -> int:
    try:
        result = number(name, value)
    except ValueError:
        result = None
    if result is None or result != int(result):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return int(result)
