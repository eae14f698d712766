"""Paged answers as vast.ai's v1 routes give them: an opaque `next_token` that the client sends back as
`after_token` with the same filters. vast.ai does not document the token; here it is the offset, base64-encoded, and
a token that does not decode is a 400 rather than a silent first page.
"""

import base64
import binascii
import json

from .search import QueryError


def paginate(rows: list, limit, after_token) -> tuple[list, str | None]:
    limit = _limit(limit)
    offset = _offset(after_token)
    page = rows[offset: offset + limit]
    more = offset + limit < len(rows)
    return page, _token(offset + limit) if more else None


def json_arg(value, name: str, default):
    """A query argument that carries JSON (the official client sends dicts and lists that way), or the default."""
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as exc:
        raise QueryError(f"{name} is not valid JSON") from exc


def _limit(value) -> int:
    try:
        limit = int(value)
    except (TypeError, ValueError) as exc:
        raise QueryError("limit must be a positive integer") from exc
    if limit < 1:
        raise QueryError("limit must be a positive integer")
    return min(limit, 1000)


def _token(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"offset": offset}).encode()).decode()


def _offset(token) -> int:
    if not token:
        return 0
    try:
        offset = json.loads(base64.urlsafe_b64decode(str(token).encode()))["offset"]
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise QueryError("after_token is not a token this API gave out") from exc
    if not isinstance(offset, int) or offset < 0:
        raise QueryError("after_token is not a token this API gave out")
    return offset
