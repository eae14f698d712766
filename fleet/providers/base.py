"""The interface every marketplace client implements; code past the client sees only records and errors."""

import logging
from typing import Protocol

from . import fields
from .errors import MalformedResponse
from .records import InstanceRecord, RentRequest
from .retrying import RetryingClient

log = logging.getLogger(__name__)


class OfferSearch(list):
    """Offers that parsed, plus a note for each listing that did not (one bad offer must not hide the others)."""

    def __init__(self, offers=(), skipped=()):
        super().__init__(offers)
        self.skipped: list[str] = list(skipped)


class InstanceList(list):
    """A provider's list of our machines. `unreadable` counts the entries it listed whose id could not be read: with
    any, the list does not prove that a machine missing from it is gone. `unreadable_labels` holds each such entry's
    label ("" where that could not be read either)."""

    def __init__(self, records=(), unreadable_labels=()):
        super().__init__(records)
        self.unreadable_labels = tuple(unreadable_labels)

    @property
    def unreadable(self) -> int:
        return len(self.unreadable_labels)

    def may_hide(self, label: str) -> bool:
        """Whether an entry it could not read may be the machine labelled `label`."""
        return any(not unread or unread == label for unread in self.unreadable_labels)


def instance_list(raw_entries: list, parse, provider: str, label_key: str = "label") -> InstanceList:
    """Each listed machine through `parse`; one that cannot be read is logged and counted, and stops nothing."""
    records, unreadable_labels = [], []
    for raw in raw_entries:
        try:
            record = parse(raw)
        except MalformedResponse as exc:
            log.warning("%s listed a machine the sync cannot follow: %s", provider, exc)
            unreadable_labels.append(fields.loose_text(raw.get(label_key), 200) if isinstance(raw, dict) else "")
            continue
        if record.problems:
            log.warning("%s instance %s: %s", provider, record.instance_id, "; ".join(record.problems))
        records.append(record)
    return InstanceList(records, unreadable_labels)


class ChargeReport(list):
    """A provider's charge lines that could be read, and the instances whose lines could not all be: their totals
    would come out short, so `unreadable` (instance id -> why) keeps them from being reconciled until they read.
    `skipped` says what was left out, a note each, those that name no instance too."""

    def __init__(self, lines=(), unreadable=None, skipped=()):
        super().__init__(lines)
        self.unreadable: dict[str, str] = dict(unreadable or {})
        self.skipped: list[str] = list(skipped)


class Provider(Protocol):
    name: str

    def search_offers(self, filters: dict | None = None, *, bid: bool = False, limit: int = 1000) -> OfferSearch: ...

    def rent(self, request: RentRequest) -> str: ...

    def list_instances(self) -> InstanceList: ...

    def get_instance(self, instance_id: str) -> InstanceRecord: ...

    def destroy(self, instance_id: str) -> bool: ...

    def charges(self) -> ChargeReport: ...


class HttpProvider:
    """What every HTTP marketplace client shares: a `_http` RetryingClient, closed on leaving a `with` block, and a
    repr that shows where it talks to but never the key."""

    api_url: str
    _http: RetryingClient

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.api_url!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
