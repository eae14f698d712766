"""vast.ai's search query (`POST /bundles/`): parse it, then filter, order and cut a list of listings (docs/fleet.md,
"fleet/simulator/search.py")."""

import operator
from dataclasses import dataclass

DEFAULT_LIMIT = 64
MAX_LIMIT = 1000
QUERY_KEYS = {"order", "type", "limit", "allocated_storage", "disable_bundling", "extra_ids"}
# Names vast.ai's search takes for a listing's field (its CLI's offers_alias, and the columns its API renames).
FIELD_ALIASES = {
    "cuda_vers": "cuda_max_good", "dph": "dph_total", "dphtotal": "dph_total", "dlperf_usd": "dlperf_per_dphtotal",
    "flops_usd": "flops_per_dphtotal", "display_active": "gpu_display_active", "gpu_totalram": "gpu_total_ram",
    "ubuntu_version": "os_version", "driver_vers": "driver_version",
}
# Fields vast.ai works out from others: datacenter is hosting_type 1, geolocation a country code (see _matches).
VIRTUAL_FIELDS = {"datacenter"}
NOT_MODELLED = "is not modelled by the simulated marketplace"

OPS = {
    "eq": operator.eq,
    "neq": operator.ne,
    "gt": operator.gt,
    "gte": operator.ge,
    "lt": operator.lt,
    "lte": operator.le,
    "in": lambda value, options: value in options,
    "nin": lambda value, options: value not in options,
}
OP_ALIASES = {"notin": "nin", "not in": "nin", "noteq": "neq", "not eq": "neq", "ne": "neq"}
WILDCARDS = {"any", "*", "?"}
TRUE_WORDS, FALSE_WORDS = {"true", "1", "yes"}, {"false", "0", "no"}


class QueryError(ValueError):
    pass


@dataclass(frozen=True)
class Query:
    filters: tuple[tuple[str, str, object], ...]  # (field, op, value)
    order: tuple[tuple[str, bool], ...]  # (field, descending)
    is_bid: bool
    limit: int
    allocated_storage_gb: float


def parse_query(body: dict) -> Query:
    if not isinstance(body, dict):
        raise QueryError("the search body must be a JSON object")
    filters = parse_filters({field: condition for field, condition in body.items() if field not in QUERY_KEYS})
    order = []
    for item in body.get("order") or []:
        if not (isinstance(item, list) and len(item) in (1, 2) and isinstance(item[0], str)):
            raise QueryError('order is a list of ["field", "asc"|"desc"] pairs')
        direction = item[1] if len(item) == 2 else "asc"
        if direction not in ("asc", "desc"):
            raise QueryError(f"order direction {direction!r} is not asc or desc")
        order.append((item[0], direction == "desc"))

    kind = body.get("type", "on-demand")
    if kind not in ("on-demand", "bid", "interruptible", "reserved"):
        raise QueryError(f"type {kind!r} is not on-demand or bid")

    limit = body.get("limit", DEFAULT_LIMIT)
    if isinstance(limit, str) and limit.strip().isdigit():
        limit = int(limit)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise QueryError("limit must be a positive integer")

    storage = body.get("allocated_storage", 5.0)
    if isinstance(storage, str):
        try:
            storage = float(storage)
        except ValueError:
            pass
    if not isinstance(storage, (int, float)) or isinstance(storage, bool) or storage < 0:
        raise QueryError("allocated_storage must be a number of GB")

    return Query(filters, tuple(order), kind in ("bid", "interruptible"), min(limit, MAX_LIMIT), float(storage))


def parse_filters(conditions: dict) -> tuple[tuple[str, str, object], ...]:
    """`{field: {op: value}}` (a bare value means eq) as (field, op, value) triples, the operators checked."""
    if not isinstance(conditions, dict):
        raise QueryError("filters must be a JSON object of {field: {op: value}}")
    filters = []
    for field, condition in conditions.items():
        field = FIELD_ALIASES.get(field, field)
        if not isinstance(condition, dict):
            condition = {"eq": condition}  # vast.ai accepts a bare value as equality
        for op, value in condition.items():
            op = OP_ALIASES.get(op, op)
            if op not in OPS:
                raise QueryError(f"unknown operator {op!r} for {field!r}; use one of {', '.join(OPS)}")
            if op in ("in", "nin") and not isinstance(value, list):
                raise QueryError(f"{field!r} {op} needs a list")
            filters.append((field, op, value))
    return tuple(filters)


def matching(records: list[dict], filters) -> list[dict]:
    return [record for record in records if _matches(record, filters)]


def check_fields(filters, listing: dict) -> None:
    """Every filtered field is one the listings hold (or a virtual one): a field the simulation does not model is a
    400 that says so, never a filter that silently lets everything through."""
    for field, _op, _value in filters:
        if field not in listing and field not in VIRTUAL_FIELDS:
            raise QueryError(f"search field {field!r} {NOT_MODELLED}")


def select(listings: list[dict], query: Query) -> list[dict]:
    if listings:
        check_fields(query.filters, listings[0])
    # vast.ai turns allocated_storage into disk_space >= it: an offer without that much disk is not listed.
    roomy = [x for x in listings if x.get("disk_space", 0) >= query.allocated_storage_gb]
    return ordered(matching(roomy, query.filters), query.order)[: query.limit]


def ordered(records: list[dict], order) -> list[dict]:
    """Sorted by (field, descending) keys, records without the field last."""
    # Stable sorts from the last key to the first give a multi-key order with mixed directions.
    for field, descending in reversed(order):
        present = [x for x in records if x.get(field) is not None]
        missing = [x for x in records if x.get(field) is None]
        try:
            present.sort(key=lambda x: x[field], reverse=descending)
        except TypeError as exc:
            raise QueryError(f"cannot order by {field!r}: {exc}") from exc
        records = present + missing
    return records


def _matches(listing: dict, filters) -> bool:
    for field, op, value in filters:
        if _is_wildcard(value) or (field not in listing and field not in VIRTUAL_FIELDS):
            continue  # a search has checked its fields first (check_fields); other lists ignore what they lack
        actual = _actual(listing, field)
        if value is None and op in ("eq", "neq"):
            if (actual is None) != (op == "eq"):
                return False
            continue
        if actual is None:
            return False
        if field == "driver_version":
            actual = driver_number(actual)
        if field == "geolocation":
            value = [_country(v) for v in value] if isinstance(value, list) else _country(value)
        try:
            if op in ("in", "nin"):
                wanted = [_coerce(field, actual, option) for option in value]
            else:
                wanted = _coerce(field, actual, value)
            if not OPS[op](actual, wanted):
                return False
        except (TypeError, ValueError) as exc:
            raise QueryError(f"cannot compare {field!r} ({actual!r}) with {value!r}") from exc
    return True


def _actual(listing: dict, field: str):
    """The value a filter on `field` compares: geolocation by its two-letter country code ("Sweden, SE" -> "SE"),
    as vast.ai documents it; datacenter as hosting_type 1."""
    if field == "datacenter":
        return listing.get("hosting_type") == 1
    if field == "geolocation":
        return country_code(listing.get("geolocation"))
    return listing.get(field)


def country_code(geolocation) -> str | None:
    """The two-letter country code a listing's geolocation ends with ("US-CA, US" -> "US"); None when it has none."""
    if not isinstance(geolocation, str) or not geolocation.strip():
        return None
    return geolocation.rsplit(",", 1)[-1].strip().upper()


def _country(value):
    if not isinstance(value, str):
        raise QueryError(f"geolocation takes two-letter country codes, not {value!r}")
    code = value.strip().upper()
    if len(code) != 2 or not code.isalpha():
        raise QueryError(f"geolocation takes two-letter country codes (as vast.ai documents it), not {value!r}")
    return code


def driver_number(version) -> int:
    """A driver version as the vast.ai CLI sends it: "535.129.03" -> 535129003 (each part padded to 3 digits)."""
    if isinstance(version, (int, float)) and not isinstance(version, bool):
        return int(version)
    text = str(version).strip()
    if text.isdigit():
        return int(text)
    parts = text.split(".")
    if not 1 <= len(parts) <= 3 or not all(part.isdigit() for part in parts):
        raise ValueError(f"{version!r} is not a driver version")
    parts += ["0"] * (3 - len(parts))
    return int("".join(part.zfill(3) for part in parts))


def _is_wildcard(value) -> bool:
    return isinstance(value, str) and value.strip().lower() in WILDCARDS


def _coerce(field: str, actual, value):
    """The query value as the listing's field type: what vast.ai does with "0.98", "1", "true"."""
    if field == "driver_version":
        return driver_number(value)
    if isinstance(actual, bool):
        if isinstance(value, str):
            word = value.strip().lower()
            if word in TRUE_WORDS or word in FALSE_WORDS:
                return word in TRUE_WORDS
            raise ValueError(f"{value!r} is not a boolean")
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        return value
    if isinstance(actual, (int, float)):
        if isinstance(value, str):
            return float(value)
        if isinstance(value, bool):
            raise TypeError("a boolean is not a number")
        return value
    if isinstance(actual, str) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value
