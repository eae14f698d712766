"""The interface every marketplace client implements; code past the client sees only records and errors."""

from typing import Protocol

from .records import ChargeRecord, InstanceRecord, RentRequest


class OfferSearch(list):
    """Offers that parsed, plus a note for each listing that did not (one bad offer must not hide the others)."""

    def __init__(self, offers=(), skipped=()):
        super().__init__(offers)
        self.skipped: list[str] = list(skipped)


class Provider(Protocol):
    name: str

    def search_offers(self, filters: dict | None = None, *, bid: bool = False, limit: int = 1000) -> OfferSearch: ...

    def rent(self, request: RentRequest) -> str: ...

    def list_instances(self) -> list[InstanceRecord]: ...

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
