"""The one way that services, views and the admin ask for background work, by task name; an unreachable broker raises
`QueueUnavailable` (docs/fleet.md, "fleet/enqueue.py")."""

import logging

from celery import current_app
from kombu.exceptions import OperationalError

log = logging.getLogger(__name__)

REFRESH_OFFERS = "fleet.tasks.refresh_offers"
RANK_PROFILES = "fleet.tasks.rank_profiles"
RENT_INSTANCE = "fleet.tasks.rent_instance"
DESTROY_INSTANCE = "fleet.tasks.destroy_instance"
MOVE_INSTANCE = "fleet.tasks.move_instance"
DELIVER_WEBHOOK = "fleet.tasks.deliver_webhook"
MAINTAIN_INFERENCE_FLEET = "fleet.tasks.maintain_inference_fleet"
SEAL_CHECKPOINT = "runs.tasks.seal_checkpoint"
RECORD_MODEL_MANIFEST = "runs.tasks.record_model_manifest"


class QueueUnavailable(Exception):
    """The task was not queued: the broker could not be reached."""


def refresh_offers(provider: str = "vast") -> None:
    _send(REFRESH_OFFERS, provider)


def rank_profiles() -> None:
    _send(RANK_PROFILES)


def rent_instance(instance_id: int) -> None:
    _send(RENT_INSTANCE, instance_id)


def destroy_instance(instance_id: int, reason: str) -> None:
    _send(DESTROY_INSTANCE, instance_id, reason)


def move_instance(instance_id: int, reason: str) -> None:
    _send(MOVE_INSTANCE, instance_id, reason)


def deliver_webhook(delivery_id: int, countdown_s: float | None = None) -> None:
    _send(DELIVER_WEBHOOK, delivery_id, countdown_s=countdown_s)


def maintain_inference_fleet() -> None:
    _send(MAINTAIN_INFERENCE_FLEET)


def seal_checkpoint(checkpoint_id: int) -> None:
    _send(SEAL_CHECKPOINT, checkpoint_id)


def record_model_manifest(uri: str) -> None:
    _send(RECORD_MODEL_MANIFEST, uri)


def _send(name: str, *args, countdown_s: float | None = None) -> None:
    try:
        current_app.send_task(name, args=args, countdown=countdown_s)
    except OperationalError as exc:
        log.warning("could not queue %s%r: the broker is unreachable (%s)", name, args, exc)
        raise QueueUnavailable(f"{name} was not queued: the task queue is unreachable ({type(exc).__name__}).") from exc
