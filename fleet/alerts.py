"""Raising an alert: a row first, so nothing a person should know is lost if delivery fails later."""

from django.utils import timezone

from fleet.models import Alert, Instance


def raise_alert(kind: str, message: str, *, instance: Instance | None = None, now=None) -> Alert:
    return Alert.objects.create(kind=kind, message=message, instance=instance, created_at=now or timezone.now())
