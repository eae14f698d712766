"""What fleet asks of the work its boxes are for, which it cannot import (runs builds on fleet, never the reverse):
each app registers its answers in its AppConfig.ready (runs/apps.py), and fleet calls them through here."""

from collections.abc import Callable
from datetime import datetime

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Q, QuerySet

from fleet.models import Instance

AttachHandler = Callable[[Instance, datetime], None]
MoveHandler = Callable[[Instance, str, datetime], bool]
ReadGrant = Callable[[str, list[str], int], dict]
BoxesOf = Callable[[object], QuerySet]
AlertData = Callable[[object], dict | None]
AdaptersToServe = Callable[[object], list[dict]]

_boxes_of: list[BoxesOf] = []

_attach: list[AttachHandler] = []
_move: list[MoveHandler] = []
_read_grant: list[ReadGrant] = []
_alert_data: list[AlertData] = []
_adapters: list[AdaptersToServe] = []


def on_attach(handler: AttachHandler) -> AttachHandler:
    """`handler(instance, now)` runs in the transaction that attaches a machine to the row (a run moves onto it)."""
    return _register(_attach, handler)


def on_move(handler: MoveHandler) -> MoveHandler:
    """`handler(instance, reason, now)` for a box the reaper found hung: True when it moved the work itself (a run
    resumes on a box it rents); otherwise `actions.replace` rents a like box for the same work."""
    return _register(_move, handler)


def on_read_grant(grant: ReadGrant) -> ReadGrant:
    """`grant(folder_uri, names, expires_s)`: read access to exactly those files of an adapter, for a serving box."""
    if _read_grant and _read_grant[0] is not grant:
        raise ImproperlyConfigured(f"A read grant is registered already ({_read_grant[0].__qualname__}).")
    return _register(_read_grant, grant)


def on_boxes_of(handler: BoxesOf) -> BoxesOf:
    """`handler(user)`: the ids (a values queryset) of the boxes that did that user's work, such as their runs'."""
    return _register(_boxes_of, handler)


def on_alert_data(handler: AlertData) -> AlertData:
    """`handler(alert)`: what a webhook body carries beside the message for an alert of the app's (a run's
    evaluation numbers), or None when the alert is not its."""
    return _register(_alert_data, handler)


def alert_data(alert) -> dict:
    for handler in _alert_data:
        found = handler(alert)
        if found:
            return found
    return {}


def on_adapters_to_serve(handler: AdaptersToServe) -> AdaptersToServe:
    """`handler(user)`: trained adapters the user may serve, each {label, url, verdict, promoted}, best first (a run's
    promoted adapter before the rest), for the Inference page."""
    return _register(_adapters, handler)


def adapters_to_serve(user) -> list[dict]:
    return [adapter for handler in _adapters for adapter in handler(user)]


def _register(handlers: list, handler):
    if handler not in handlers:  # ready() may run again (a test's app registry): once is enough
        handlers.append(handler)
    return handler


def attached(instance: Instance, now: datetime) -> None:
    for handler in _attach:
        handler(instance, now)


def moved(instance: Instance, reason: str, now: datetime) -> bool:
    """Whether a handler took the move of the box's work over (the first that does ends the asking)."""
    return any(handler(instance, reason, now) for handler in _move)


def read_grant(folder_uri: str, names: list[str], expires_s: int) -> dict:
    if not _read_grant:
        raise ImproperlyConfigured("No app registered a read grant for adapters (runs does, in its ready()).")
    return _read_grant[0](folder_uri, names, expires_s)


def boxes_of(user) -> Q:
    """The boxes that did `user`'s work: those serving their inference models, and those each app's handler names."""
    found = Q(serving_model__created_by=user)
    for handler in _boxes_of:
        found |= Q(pk__in=handler(user))
    return found
