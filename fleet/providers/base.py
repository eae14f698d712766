"""The interface every marketplace client implements; code past the client sees only records and errors."""

import logging
from typing import Protocol

from .errors import MalformedResponse
from .records import ChargeRecord, InstanceRecord, RentRequest

log = logging.getLogger(__name__)


class OfferSearch(list):
    """Offers that parsed, plus a note for each listing that did not (one bad offer must not hide the others)."""

    def __init__(self, offers=(), skipped=()):
        super().__init__(offers)
        self.skipped: list[str] = list(skipped)


class InstanceList(list):
    """A provider's list of our machines. `unreadable` counts the entries it listed whose id could not be read: with
    any, the list does not prove that a machine missing from it is gone."""

    def __init__(self, records=(), unreadable: int = 0):
        super().__init__(records)
        self.unreadable = unreadable


def instance_list(raw_entries: list, parse, provider: str) -> InstanceList:
    """Each listed machine through `parse`; one that cannot be read is logged and counted, and stops nothing."""
    records, unreadable = [], 0
    for raw in raw_entries:
        try:
            record = parse(raw)
        except MalformedResponse as exc:
            log.warning("%s listed a machine the sync cannot follow: %s", provider, exc)
            unreadable += 1
            continue
        if record.problems:
            log.warning("%s instance %s: %s", provider, record.instance_id, "; ".join(record.problems))
        records.append(record)
    return InstanceList(records, unreadable)


class Provider(Protocol):
    name: str

    def search_offers(self, filters: dict | None = None, *, bid: bool = False, limit: int = 1000) -> OfferSearch: ...

    def rent(self, request: RentRequest) -> str: ...

    def list_instances(self) -> InstanceList: ...

    def get_instance(self, instance_id: str) -> InstanceRecord: ...

    def destroy(self, instance_id: str) -> bool: ...

    def charges(self) -> list[ChargeRecord]: ...


class HttpProvider:
    """What every HTTP marketplace client shares: a `_http` RetryingClient, closed on leaving a `with` block, and a
    repr that shows where it talks to but never the key."""

    api_url: str

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.api_url!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
