"""The one way that services, views and the admin ask for background work.

They name the task and its arguments; Celery's app sends it by that name. So nothing outside the task layer
imports `fleet.tasks` (which imports the services), and no import runs in a circle. The task layer registers each
task under the name given here, so a name is written once.
"""

from celery import current_app

REFRESH_OFFERS = "fleet.tasks.refresh_offers"
RANK_PROFILES = "fleet.tasks.rank_profiles"
RENT_INSTANCE = "fleet.tasks.rent_instance"
DESTROY_INSTANCE = "fleet.tasks.destroy_instance"
MOVE_INSTANCE = "fleet.tasks.move_instance"
DELIVER_WEBHOOK = "fleet.tasks.deliver_webhook"
MAINTAIN_INFERENCE_FLEET = "fleet.tasks.maintain_inference_fleet"


def refresh_offers(provider: str = "vast") -> None:
    _send(REFRESH_OFFERS, provider)


def rank_profiles() -> None:
    _send(RANK_PROFILES)


def rent_instance(instance_id: int) -> None:
    _send(RENT_INSTANCE, instance_id)


def destroy_instance(instance_id: int, reason: str, force: bool = False) -> None:
    _send(DESTROY_INSTANCE, instance_id, reason, force)


def move_instance(instance_id: int, reason: str) -> None:
    _send(MOVE_INSTANCE, instance_id, reason)


def deliver_webhook(delivery_id: int, countdown_s: float | None = None) -> None:
    _send(DELIVER_WEBHOOK, delivery_id, countdown_s=countdown_s)


def maintain_inference_fleet() -> None:
    _send(MAINTAIN_INFERENCE_FLEET)


def _send(name: str, *args, countdown_s: float | None = None) -> None:
    current_app.send_task(name, args=args, countdown=countdown_s)
