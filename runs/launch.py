"""Launching and cancelling runs: validate what the user gave, write the run, let the supervisor take it from there."""

from decimal import Decimal
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from runs import datasets, events, storage, tokens
from runs.models import Phase, Run
import training
from training.recipe import RecipeError, validate


class LaunchError(ValueError):
    pass


def launch(*, name: str, recipe: dict, bucket: str, budget_usd: Decimal, max_restarts: int, profile=None,
           user=None, uploads=None, now=None) -> Run:
    """Checks everything, the phases' data last (runs.datasets: uploads by file name, stored data sets, s3://
    objects), stores that data in the bucket and writes the run; nothing is rented before all of it passed."""
    now = now or timezone.now()
    try:
        checked = validate(recipe, base_dir="/", data_on_disk=False)
    except RecipeError as exc:
        raise LaunchError(f"The recipe is not usable: {exc}") from None
    try:
        storage.validate_bucket(bucket)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    if budget_usd <= 0:
        raise LaunchError("The budget must be more than $0.")
    try:
        data = datasets.resolve(checked, bucket, uploads or {}, user=user, now=now)
    except datasets.DataError as exc:
        raise LaunchError(str(exc)) from None
    with transaction.atomic():
        run = Run.objects.create(name=name, recipe=recipe, profile=profile, bucket=bucket, budget_usd=budget_usd,
                                 max_restarts=max_restarts, token_nonce=tokens.new_nonce(), created_by=user,
                                 created_at=now)
        Phase.objects.bulk_create([Phase(run=run, index=i, name=p["name"], kind=p["kind"], steps=p["steps"],
                                         dataset=data[i]) for i, p in enumerate(checked["phases"])])
        run.events.create(at=now, kind="launched", message=f"Launched by {user.get_username() if user else 'the product'}"
                          f" with a ${budget_usd} budget and at most {max_restarts} restarts.")
    return run


def cancel(run: Run, *, user=None, now=None) -> Run:
    who = user.get_username() if user else "the product"
    events.record(run, "cancelled", f"Cancelled by {who}.", now=now)  # refreshes the run
    return run


def example_recipe() -> dict:
    """The tiny five-phase example (training/examples/tiny.yaml) as a launch form starts with it: each phase's data
    the product's example file (example:cpt.jsonl, checked and stored like an upload), checkpoint and metrics left to
    the box's agent. It trains on the CPU of a simulated box in a minute."""
    import yaml

    examples = Path(training.__file__).resolve().parent / "examples"
    recipe = yaml.safe_load((examples / "tiny.yaml").read_text())
    for phase in recipe["phases"]:
        phase["data"] = datasets.EXAMPLE_PREFIX + phase["data"]
    recipe.pop("metrics", None)
    recipe["checkpoint"] = {"every": 2, "keep": 3}
    return recipe
