"""Reading one field of a marketplace's answer strictly: the value, or a BadField that names the field; `column_problem`
says whether a value fits its column (docs/fleet.md, "fleet/providers/fields.py")."""

import math
import unicodedata
from dataclasses import dataclass
from decimal import Decimal

SHOWN_CHARS = 40  # how much of a bad value a reason quotes, so one huge value cannot make a huge reason
MAX_ID = 2**63 - 1  # the largest id a marketplace hands out that a 64-bit column holds
MAX_INT_DIGITS = 100  # longer integers in an answer are no id, count or price (see json_int)
REQUIRED = object()  # `default` for a field the listing must have

# Characters no text column can hold (PostgreSQL refuses NUL; a lone surrogate cannot be encoded) and control
# characters, which no name, id or place a marketplace lists contains.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cs"})


class BadField(ValueError):
    """One field of a listing is missing or holds something it cannot; the message names the field."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field} {problem}")
        self.field = field


def shown(value) -> str:
    """The value as a reason quotes it: its repr, cut to SHOWN_CHARS characters."""
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        return f"{value[:SHOWN_CHARS]!r}... ({len(value)} characters)"
    try:
        text = repr(value)
    except ValueError:  # an int of more digits than Python turns into text
        return f"a {type(value).__name__} too long to show"
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


class LongNumber:
    """An integer in a JSON answer with more digits than any id or count has: no reader takes it."""

    __slots__ = ("digits",)

    def __init__(self, digits: int):
        self.digits = digits

    def __repr__(self) -> str:
        return f"a {self.digits}-digit number"


def json_int(digits: str) -> int | LongNumber:
    """json.loads' parse_int: a LongNumber for the field's reader to refuse, instead of an int so long that
    Python refuses to convert it and fails the whole answer's decoding."""
    return int(digits) if len(digits) <= MAX_INT_DIGITS else LongNumber(len(digits.lstrip("-")))


def label(value) -> str:
    """A listing's id as a reason names it: plain when it is short, clean text or a number, quoted otherwise."""
    if isinstance(value, str) and len(value) <= SHOWN_CHARS and value.strip() and text_problem(value) is None:
        return value
    return shown(value)


def _is(value, expected: str) -> str:
    kind = " (a string)" if isinstance(value, str) else ""
    return f"is {shown(value)}{kind}, not {expected}"


def _get(raw: dict, key: str, default):
    """(value, left out): the field's value, or `default` when the listing leaves it out or null; BadField if it
    must be there."""
    value = raw.get(key)
    if value is None:
        if default is REQUIRED:
            raise BadField(key, "is missing" if key not in raw else "is null")
        return default, True
    return value, False


def _real(key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadField(key, _is(value, "a number"))
    try:
        result = float(value)
    except OverflowError:  # an int too large for a float
        raise BadField(key, _is(value, "a finite number")) from None
    if not math.isfinite(result):
        raise BadField(key, _is(value, "a finite number"))
    return result


def _bounded(key: str, value, result, low, high, expected: str):
    if (low is not None and result < low) or (high is not None and result > high):
        raise BadField(key, _is(value, expected))
    return result


def _range_words(low, high) -> str:
    def n(bound) -> str:
        return str(bound) if isinstance(bound, int) else f"{bound:g}"

    if low is None:
        return "" if high is None else f"<= {n(high)}"
    return f">= {n(low)}" if high is None else f"between {n(low)} and {n(high)}"


def number(raw: dict, key: str, *, low: float | None = 0.0, high: float | None = None, default=REQUIRED):
    """A finite JSON number within [low, high] as a float; `default` (None allowed) when left out."""
    value, missing = _get(raw, key, default)
    if missing:
        return value
    result = _real(key, value)
    return _bounded(key, value, result, low, high, f"a number {_range_words(low, high)}".rstrip())


def whole(raw: dict, key: str, *, low: int = 0, high: int | None = None, default=REQUIRED):
    """A whole JSON number within [low, high] as an int (12 or 12.0, never 1.5); `default` when left out."""
    value, missing = _get(raw, key, default)
    if missing:
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise BadField(key, _is(value, "a whole number"))
        value = int(value)
    elif isinstance(value, bool) or not isinstance(value, int):
        raise BadField(key, _is(value, "a whole number"))
    return _bounded(key, raw.get(key), value, low, high, f"a whole number {_range_words(low, high)}".rstrip())


def money(raw: dict, key: str, *, default=REQUIRED):
    """A finite amount >= 0 as a Decimal, through the number's shortest text (1.2 stays exactly 1.2)."""
    value, missing = _get(raw, key, default)
    if missing:
        return value if value is None or isinstance(value, Decimal) else Decimal(str(value))
    _real(key, value)
    amount = Decimal(str(value))
    if amount < 0:
        raise BadField(key, _is(value, "an amount >= 0"))
    return amount


def flag(raw: dict, key: str, *, default=REQUIRED) -> bool:
    """A JSON true or false; "false", 0 or "no" are refused, not guessed at."""
    value, missing = _get(raw, key, default)
    if missing:
        return value
    if not isinstance(value, bool):
        raise BadField(key, _is(value, "true or false"))
    return value


def text(raw: dict, key: str, *, default=REQUIRED, blank: bool = True) -> str:
    """A JSON string without control characters, stripped; blank=False refuses an empty one."""
    value, missing = _get(raw, key, default)
    if missing:
        return value
    if not isinstance(value, str):
        raise BadField(key, _is(value, "a string"))
    problem = text_problem(value)
    if problem:
        raise BadField(key, problem)
    value = value.strip()
    if not value and not blank:
        raise BadField(key, "is blank")
    return value


def text_problem(value: str) -> str | None:
    """Why a string cannot be stored as a name or an id, or None."""
    for position, char in enumerate(value):
        if unicodedata.category(char) in _REFUSED_CATEGORIES:
            return f"holds the character {char!r} at position {position}"
    return None


def identifier(raw: dict, key: str) -> str:
    """A whole-number id (vast.ai's machine and host ids) as text; "" when the listing has none."""
    number_ = whole(raw, key, high=MAX_ID, default=None)
    return "" if number_ is None else str(number_)


def soft(raw: dict, problems: list[str], reader, key: str, fallback, **options):
    """The field through `reader`, or `fallback` with the reason added to `problems`: for a record that must be
    kept whatever one field holds (a machine we pay for is tracked even if its listing has an odd price)."""
    try:
        return reader(raw, key, **options)
    except BadField as exc:
        problems.append(str(exc))
        return fallback


def loose_text(value, limit: int = 2000) -> str:
    """Text for display from whatever a marketplace sent: non-strings as "", the characters no column can hold (and
    other control characters but newlines and tabs) as spaces, cut to `limit` characters."""
    if not isinstance(value, str):
        return ""
    return "".join(c if c in "\n\t" or unicodedata.category(c) not in _REFUSED_CATEGORIES else " "
                   for c in value[:limit]).strip()


def one_of(raw: dict, keys: tuple[str, ...], reader, **options):
    """The first of `keys` the listing gives (not null), read by `reader`; the last key's default otherwise."""
    for key in keys[:-1]:
        if raw.get(key) is not None:
            return reader(raw, key, **options)
    return reader(raw, keys[-1], **options)


# -- a record's values against database columns -----------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """What a database column holds: `kind` is text, whole, real, decimal or flag, each with its limits."""

    kind: str
    null: bool = False
    max_length: int | None = None  # text
    low: int | None = None  # whole
    high: int | None = None
    max_digits: int | None = None  # decimal
    decimal_places: int | None = None


def column_problem(value, column: Column) -> str | None:
    """Why the value cannot be stored in the column (the words after the field's name), or None."""
    if value is None:
        return None if column.null else "is missing"
    check = _COLUMN_CHECKS[column.kind]
    return check(value, column)


def _text_column(value, column: Column) -> str | None:
    if not isinstance(value, str):
        return _is(value, "text")
    if column.max_length is not None and len(value) > column.max_length:
        return f"is {len(value)} characters long, more than the {column.max_length} stored"
    return text_problem(value)


def _whole_column(value, column: Column) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return _is(value, "a whole number")
    if (column.low is not None and value < column.low) or (column.high is not None and value > column.high):
        return _is(value, f"a whole number between {column.low} and {column.high}")
    return None


def _real_column(value, column: Column) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return _is(value, "a finite number")
    return None


def _decimal_column(value, column: Column) -> str | None:
    if not isinstance(value, Decimal) or not value.is_finite():
        return _is(value, "a finite amount")
    if column.max_digits is None or column.decimal_places is None:
        return None  # no limits, as for the other kinds
    # Stored rounded to decimal_places (half away from zero), so anything that rounds up to the limit overflows.
    limit = Decimal(10) ** (column.max_digits - column.decimal_places)
    if abs(value) >= limit - Decimal("0.5").scaleb(-column.decimal_places):
        return _is(value, f"an amount below {limit}")
    return None


def _flag_column(value, column: Column) -> str | None:
    return None if isinstance(value, bool) else _is(value, "true or false")


_COLUMN_CHECKS = {"text": _text_column, "whole": _whole_column, "real": _real_column, "decimal": _decimal_column,
                  "flag": _flag_column}
