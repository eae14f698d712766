"""vast.ai's search query (`POST /bundles/`): parse it, then filter, order and cut a list of listings.

Unknown fields in a filter are ignored, as vast.ai's own default query names fields the simulation does not model
(and a client's typo therefore filters nothing: the client's tests must catch it). An unknown operator, a
non-list for in/nin, or a value that cannot be compared with the field is a 400 (`invalid_args`).
"""

import operator
from dataclasses import dataclass

DEFAULT_LIMIT = 64
MAX_LIMIT = 1000
QUERY_KEYS = {"order", "type", "limit", "allocated_storage", "disable_bundling", "extra_ids"}

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
    filters = []
    for field, condition in body.items():
        if field in QUERY_KEYS:
            continue
        if not isinstance(condition, dict):
            condition = {"eq": condition}  # vast.ai accepts a bare value as equality
        for op, value in condition.items():
            if op not in OPS:
                raise QueryError(f"unknown operator {op!r} for {field!r}; use one of {', '.join(OPS)}")
            if op in ("in", "nin") and not isinstance(value, list):
                raise QueryError(f"{field!r} {op} needs a list")
            filters.append((field, op, value))

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
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise QueryError("limit must be a positive integer")

    storage = body.get("allocated_storage", 5.0)
    if not isinstance(storage, (int, float)) or isinstance(storage, bool) or storage < 0:
        raise QueryError("allocated_storage must be a number of GB")

    return Query(tuple(filters), tuple(order), kind in ("bid", "interruptible"), min(limit, MAX_LIMIT), float(storage))


def select(listings: list[dict], query: Query) -> list[dict]:
    matching = [listing for listing in listings if _matches(listing, query.filters)]
    # Stable sorts from the last key to the first give a multi-key order with mixed directions.
    for field, descending in reversed(query.order):
        present = [x for x in matching if x.get(field) is not None]
        missing = [x for x in matching if x.get(field) is None]
        try:
            present.sort(key=lambda x: x[field], reverse=descending)
        except TypeError as exc:
            raise QueryError(f"cannot order by {field!r}: {exc}") from exc
        matching = present + missing
    return matching[: query.limit]


def _matches(listing: dict, filters) -> bool:
    for field, op, value in filters:
        if field not in listing:
            continue
        actual = listing[field]
        if actual is None:
            return False
        try:
            if not OPS[op](actual, value):
                return False
        except TypeError as exc:
            raise QueryError(f"cannot compare {field!r} ({actual!r}) with {value!r}") from exc
    return True
