"""Launching and cancelling runs: validate what the user gave, write the run, let the supervisor take it from there."""

from decimal import Decimal
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from fleet import volumes
from fleet.instances import disk
from fleet.providers.errors import ProviderError
from fleet.providers.registry import configured_providers
from runs import datasets, events, model_manifests, sharing, storage, tokens
from runs.box_request import BoxRequest
from runs.models import Phase, Run
import training
from training import model_source
from training.recipe import RecipeError, RunRecipe, validate


class LaunchError(ValueError):
    """What keeps a run from launching; `field` names the launch form's field it is about, if one."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def launch(*, name: str, recipe: dict, bucket: str, budget_usd: Decimal, max_restarts: int, profile=None,
           user=None, uploads=None, disk_gb: int | None = None, volume: dict | None = None, now=None) -> Run:
    """Checks everything, the model where it lives and the disk it needs (at least that, `disk_gb` if more), the
    `volume` it names ({provider, id, mount_path}), the phases' data last (runs.datasets), stores that data in the
    bucket and writes the run; nothing is rented before all of it passed."""
    now = now or timezone.now()
    try:
        checked = validate(recipe, base_dir="/", data_on_disk=False)
    except RecipeError as exc:
        raise LaunchError(f"The recipe is not usable: {exc}", "recipe") from None
    try:
        storage.validate_bucket(bucket)
    except ValueError as exc:
        raise LaunchError(str(exc), "bucket") from None
    if budget_usd <= 0:
        raise LaunchError("The budget must be more than $0.", "budget_usd")
    if sharing.model_in_product_storage(checked["model"], bucket):  # refused before anything there is listed
        raise LaunchError(f"model.path {checked['model']['path']}: lies in the product's own storage (runs' "
                          "checkpoints and stored data sets), which no model is read from", "recipe")
    refuse_local_tokenizer(checked["model"])
    need = disk_need(checked, profile, listed_weights_gb=model_size_gb(checked["model"]))
    try:
        disk_gb = disk.chosen_disk_gb(need, disk_gb)
    except ValueError as exc:
        raise LaunchError(str(exc), "disk_gb") from None
    kept_volume = checked_volume(volume, checked["model"], need.weights_gb) if volume else {}
    try:
        data, held_out = datasets.resolve_with_held_out(checked, bucket, uploads or {}, user=user, now=now)
    except datasets.DataError as exc:  # said beside the Data files field, where the files are chosen
        raise LaunchError(str(exc), "data_files") from None
    with transaction.atomic():
        run = Run.objects.create(name=name, recipe=recipe, profile=profile, bucket=bucket, budget_usd=budget_usd,
                                 max_restarts=max_restarts, disk_gb=disk_gb, token_nonce=tokens.new_nonce(),
                                 created_by=user, created_at=now, volume=kept_volume)
        Phase.objects.bulk_create([Phase(run=run, index=i, name=p["name"], kind=p["kind"], steps=p["steps"],
                                         dataset=data[i], eval_dataset=held_out.get(i))
                                   for i, p in enumerate(checked["phases"])])
        who = user.get_username() if user else "the product"
        run.events.create(at=now, kind="launched", message=f"Launched by {who}"
                          f" with a ${budget_usd} budget and at most {max_restarts} restarts. Its boxes are rented "
                          f"with {disk_gb} GB of disk; the model needs {need}.")
        if kept_volume:
            run.events.create(at=now, kind="volume", message=volume_words(kept_volume, checked["model"]["path"]))
    return run


def checked_volume(volume: dict, model: dict, need_gb: float) -> dict:
    """The volume a run names ({provider, id, mount_path}) as the run keeps it (fleet.volumes.pinned), once the
    provider lists it usable and big enough for the model; LaunchError by the volume's field otherwise."""
    if "config" in model:
        raise LaunchError("The model is built from its config on the box: there is no download for a volume to keep.",
                          "volume_id")
    provider, volume_id = volume.get("provider") or "", str(volume.get("id") or "").strip()
    mount_path = (volume.get("mount_path") or volumes.DEFAULT_MOUNT_PATH).rstrip("/") or "/"
    if provider not in configured_providers():
        raise LaunchError(f"A volume at {provider or 'no provider'} cannot be used: this deployment has no key for it.",
                          "volume_provider")
    problem = volumes.mount_path_problem(mount_path)
    if problem:
        raise LaunchError(f"Mount path: {problem}.", "volume_mount_path")
    try:
        found = volumes.find(provider, volume_id)
    except volumes.VolumeRefused as exc:
        raise LaunchError(f"The volume cannot be used: {exc}.", "volume_id") from None
    except ProviderError as exc:
        raise LaunchError(f"The volume could not be looked up at {provider}: {exc} Nothing was launched: try again.",
                          "volume_id") from None
    problem = volumes.volume_problem(found, need_gb)
    if problem:
        raise LaunchError(f"The volume cannot be used: {problem}.", "volume_id")
    model_manifests.wanted(model)  # the model's manifest, which a box checks the volume's copy against
    return volumes.pinned(found, mount_path)


def volume_words(volume: dict, model_path: str) -> str:
    """What the launch event says of the run's volume: where its boxes may be rented, how the model is checked, and
    what keeping the volume costs."""
    monthly = volumes.storage_usd_per_month(volume)
    checked = ("each box uses the weights already there only when every file matches the size and sha256 the "
               "dashboard recorded for the model, and downloads what does not" if model_source.kind_of(model_path)
               == "s3" else "a hub model is downloaded into it by each box (the dashboard records no manifest of a "
               "hub model to check the volume's copy against)")
    return (f"Its boxes mount {volume['provider']} volume {volume['id']} ({volume['name'] or 'no name'}, "
            f"{volume['size_gb']:g} GB) at {volume['mount_path']} and are rented on {volumes.where(volume)}; "
            f"{checked}. Keeping the volume costs "
            + (f"${monthly} a month" if monthly is not None else "what its provider bills for its storage")
            + ", whether or not a box mounts it.")


def model_size_gb(model: dict) -> float | None:
    """The size of a checked recipe's model where the dashboard can see it (an s3:// prefix's files); None for a hub
    id or a config. LaunchError by the recipe when a box could not use the model (docs/runs.md, "runs/launch.py")."""
    if "config" in model:
        return None
    path = model["path"]
    kind = model_source.kind_of(path)
    if kind == "folder":
        raise LaunchError(f"model.path {path}: a folder on the dashboard's machine is not read by a box (a box is "
                          "another machine): name a hub id (owner/name) or an s3://bucket/prefix", "recipe")
    if kind == "hub":
        return None
    if not settings.S3_ACCESS_KEY:
        raise LaunchError(f"model.path {path}: an s3:// model needs S3_ACCESS_KEY and S3_SECRET_KEY in the "
                          "dashboard's environment (its boxes get presigned GETs signed with them)", "recipe")
    try:
        files = storage.model_files(path)  # sized by its listing: nothing signed until a box asks
    except storage.ModelUnreadable as exc:
        raise LaunchError(f"model.path: {exc}", "recipe") from None
    except storage.StoreUnavailable as exc:
        raise LaunchError(f"model.path: {exc}. Nothing was launched: try again in a minute.", "recipe") from None
    if "config.json" not in files:
        raise LaunchError(f"model.path {path}: no config.json under it (found {', '.join(list(files)[:5])}"
                          f"{', ...' if len(files) > 5 else ''}): name the folder that holds the model's files",
                          "recipe")
    return sum(files.values()) / 1e9


def refuse_local_tokenizer(model: dict) -> None:
    """LaunchError by the recipe when model.tokenizer is not a hub id: a folder here is read by no box, and the
    dashboard would load it from its own disk as it checks the data (docs/runs.md, "runs/launch.py")."""
    tokenizer = model.get("tokenizer")
    if tokenizer is not None and model_source.kind_of(tokenizer) != "hub":
        raise LaunchError(f"model.tokenizer {tokenizer}: a folder on the dashboard's machine is not read by a box (a "
                          "box is another machine): name a hub id (owner/name), or leave it out for model.path's own",
                          "recipe")


def disk_need(recipe: dict, profile=None, *, listed_weights_gb: float | None = None) -> disk.DiskNeed:
    """The disk a box needs for a recipe's model (a checked one, or a launch form's as it stands), as the run's
    BoxRequest on `profile` works it out."""
    return BoxRequest.build(RunRecipe.from_stored(recipe), profile).disk_need(listed_weights_gb)


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


DEMO_STEP_SECONDS = 2.0  # the example's CPT pace: 48 steps in about a minute and a half


def demo_recipe() -> dict:
    """What the launch page starts with: the example with a CPT phase paced to last a minute or two on a simulated box
    (its tiny model trains a step in milliseconds), so that the README's "kill the box" step lands mid-phase and the
    recovery can be watched; then its adapter is evaluated against the base model."""
    recipe = example_recipe()
    recipe["phases"][0].update(steps=48, min_step_seconds=DEMO_STEP_SECONDS)
    recipe["checkpoint"] = {"every": 6, "keep": 3}
    # It ends with a small evaluation: the trained adapter against the base model on the example's eval file (on a
    # tiny random model the scores are noise; the page shows how an evaluation reads).
    recipe["phases"].append({"kind": "eval", "data": datasets.EXAMPLE_PREFIX + "eval.jsonl", "scorer": "exact",
                              "max_new_tokens": 8, "time_limit_s": 600})
    recipe["promote"] = {"metric": "difference", "min_gain": 0.0}
    return recipe
