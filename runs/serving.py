"""Serving a finished run's adapter: which of its checkpoints hold one that vLLM loads (each phase's final
checkpoint carries `vllm/` next to `adapter/`), what the serve form starts with, and the inference model that serves
it. What its boxes do with it is fleet/inference/adapters.py; how they may read it is `adapter_grant`."""

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from django.db import IntegrityError, transaction
from django.urls import reverse

from fleet import enqueue
from fleet.inference.adapters import MAX_SERVED_RANK, vllm_files
from fleet.models import InferenceModel
from fleet.ranking.workload import PRESETS
from runs import sharing, storage
from runs.models import Checkpoint, Evaluation, Run
from training.recipe import RunRecipe

log = logging.getLogger(__name__)

PERMISSION = "fleet.add_inferencemodel"
KV_CACHE_SHARE = 0.2  # VRAM beyond the BF16 weights that vLLM's KV cache gets, at the least
# A run whose evaluation failed is trained all the same: its banked adapters are served.
SERVABLE_STATES = (Run.State.FINISHED, Run.State.EVAL_FAILED)
SMALL_MODEL_VRAM_GB = 1.0  # a config-built model (random weights): a few MB, served on the simulated marketplace only


@dataclass(frozen=True)
class Servable:
    checkpoint: Checkpoint
    phase_name: str
    files: dict[str, dict]  # {name in the vllm folder: {size, sha256}}, from the checkpoint's manifest

    @property
    def label(self) -> str:
        return f"{self.phase_name} (phase {self.checkpoint.phase + 1}), step {self.checkpoint.step}"


def servable(run: Run) -> list[Servable]:
    """The run's adapters vLLM can load, the last phase's first: each phase's final checkpoint, sealed, never
    refused by a box, whose manifest holds the vLLM export, at a rank vLLM serves."""
    if run.state not in SERVABLE_STATES or lora_rank(run) > MAX_SERVED_RANK:
        return []
    phases = {phase.index: phase for phase in run.phases.all()}
    found = []
    sealed = run.checkpoints.filter(complete=True, rejected_reason="").exclude(sealed_at=None)
    for checkpoint in sealed.order_by("-phase", "-step"):
        phase = phases.get(checkpoint.phase)
        files = vllm_files(checkpoint.manifest or {})
        if phase is not None and checkpoint.step == phase.steps and files:
            found.append(Servable(checkpoint, phase.name, files))
    return found


def lora_rank(run: Run) -> int:
    """The rank the run's adapters were trained with."""
    return RunRecipe.from_stored(run.recipe).lora.r


def why_not(run: Run) -> str:
    if run.state not in SERVABLE_STATES:
        return f"Run {run.name} #{run.pk} is {run.state}: only a finished run's adapters can be served."
    if lora_rank(run) > MAX_SERVED_RANK:
        return (f"Run {run.name} #{run.pk} trained LoRA rank {lora_rank(run)}: vLLM serves ranks up to "
                f"{MAX_SERVED_RANK} (its --max-lora-rank), so it would refuse this adapter at start.")
    return (f"Run {run.name} #{run.pk} has no adapter in vLLM's layout: no phase's final checkpoint holds vllm/ "
            "(its export failed; python -m training.export_adapter --format vllm makes one by hand).")


def base_model(recipe: dict) -> str:
    model = recipe.get("model") or {}
    if model.get("path"):
        return str(model["path"])
    return f"random-{(model.get('config') or {}).get('model_type', 'model')}"  # built from a config: no hub id


def vram_needed_gb(recipe: dict) -> float | None:
    """What serving the run's base takes per GPU, when the product knows its size: BF16 weights and a KV cache."""
    model = recipe.get("model") or {}
    if not model.get("path"):
        return SMALL_MODEL_VRAM_GB
    name = str(model["path"]).rstrip("/").rsplit("/", 1)[-1].lower()
    for preset in PRESETS.values():
        if preset.model.lower() == name:
            return round(2.0 * preset.total_params_b * (1 + KV_CACHE_SHARE), 1)
    return None


def initial(run: Run, adapter: Servable) -> dict:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", run.name).strip("-._") or "run"
    return {"checkpoint": adapter.checkpoint.pk, "name": f"{stem[:60]}-{run.pk}-{adapter.phase_name}"[:100],
            "base_model": base_model(run.recipe),
            "base_revision": (run.recipe.get("model") or {}).get("revision") or "",
            "vram_needed_gb": vram_needed_gb(run.recipe)}


def adapter_folder(run: Run, checkpoint: Checkpoint) -> str:
    where = storage.location(run.bucket, run.pk)
    if where.kind == "s3":
        return f"s3://{where.bucket}/{where.prefix}{checkpoint.uri.strip('/')}/vllm"
    return str(Path(where.bucket) / where.prefix / checkpoint.uri / "vllm")


class NameTaken(Exception):
    """The name asked for is another inference model's (taken since the form checked it)."""


def serve(run: Run, adapter: Servable, data: dict, *, user=None) -> InferenceModel:
    """The inference model serving this adapter; the fleet rents its replicas as soon as it commits. NameTaken when
    another model has its name."""
    try:
        with transaction.atomic():  # a savepoint: a lost race leaves the request's transaction usable
            model = InferenceModel.objects.create(
                name=data["name"], base_model=data["base_model"], base_revision=data.get("base_revision") or "",
                image=data["image"], port=data["port"],
                desired_replicas=data["desired_replicas"], max_replacements_per_day=data["max_replacements_per_day"],
                profile=data["profile"], vram_needed_gb=data["vram_needed_gb"],
                adapter_uri=adapter_folder(run, adapter.checkpoint), adapter_manifest=adapter.files,
                adapter_source=f"run {run.name} #{run.pk}, {adapter.label}"[:300], created_by=user)
    except IntegrityError:
        # Two posts at once both pass the form's check; the name's unique index lets one through.
        if not InferenceModel.objects.filter(name=data["name"]).exists():
            raise
        raise NameTaken(f"An inference model named {data['name']} exists already.") from None
    log.info("%s serves %s (%s) on %s with %s replica(s)", user.get_username() if user else "the product", model.name,
             model.adapter_source, model.base_model, model.desired_replicas)
    transaction.on_commit(enqueue.maintain_inference_fleet, robust=True)
    return model


def adapter_grant(folder_uri: str, names, expires_s: int) -> dict:
    """fleet.hooks.on_read_grant: a serving box's read access to exactly the adapter's files, expiring."""
    return storage.read_grant(folder_uri, names, expires_s)


ADAPTERS_LISTED = 20  # on the Inference page, the best first


def adapters_to_serve(user) -> list[dict]:
    """fleet.hooks.on_adapters_to_serve: the trained runs `user` sees, promoted ones first, then by their latest
    evaluation's adapter score, then the newest; each with its serve form's address and its verdict in words."""
    runs = list(sharing.runs_for(user).filter(state__in=SERVABLE_STATES)[:200])
    latest: dict[int, Evaluation] = {}
    for evaluation in Evaluation.objects.filter(run__in=runs, state=Evaluation.State.FINISHED).order_by("number"):
        latest[evaluation.run_id] = evaluation
    runs.sort(key=lambda r: (r.promoted is not True, -(latest[r.pk].adapter_score if r.pk in latest else -1.0),
                             -r.created_at.timestamp()))
    found = []
    for run in runs[:ADAPTERS_LISTED]:
        evaluation = latest.get(run.pk)
        verdict = "not evaluated" if evaluation is None else (
            f"{'promoted' if run.promoted else 'not promoted' if run.promoted is False else 'evaluated'}: adapter "
            f"{evaluation.adapter_score:.4f} vs base {evaluation.base_score:.4f}")
        found.append({"label": f"{run.name} #{run.pk}", "url": reverse("run_serve", args=[run.pk]),
                      "verdict": verdict, "promoted": run.promoted is True})
    return found
