"""The throughput calibration table: the seeded figures, overlaid with what finished runs of the priced recipe measured
on a GPU (docs/fleet.md, "fleet/offers/calibration.py")."""

from dataclasses import replace

from django.conf import settings
from django.db import transaction

from fleet.models import Instance, Offer, ThroughputCalibration
from fleet.ranking import SEED_CALIBRATION, Calibration, CalibrationEntry, Workload, record_step_time
from fleet.ranking.workload import resolve_kernel_path

GPU_KERNEL_PATHS = ("grouped_mm", "triton")


def simulated_provider(provider: str) -> bool:
    """Whether a provider's boxes are the simulated marketplace's: with the simulator on, it answers as vast.ai."""
    return bool(settings.SIMULATOR_ENABLED) and provider == "vast"


def model_name(model) -> str:
    """A run's model by name (its path's last part: "Qwen/Qwen3-30B-A3B" -> "Qwen3-30B-A3B"); "" for a model built
    from a config with random weights, which is no released model."""
    if isinstance(model, dict):
        model = model.get("path") or ""
    return model.rstrip("/").rsplit("/", 1)[-1] if isinstance(model, str) else ""


def measurement_problem(*, simulated: bool, kernel_path: str, recipe: Workload, run_model,
                        compute_capability: int | None = None) -> str | None:
    """Why a finished run's step times are no measurement of `recipe` on its box's GPU; None when they are."""
    if simulated:
        return ("its box is on the simulated marketplace, which trains on this machine's CPU whatever GPU it lists")
    if kernel_path in ("", "loop"):
        return f"it ran the {kernel_path or 'unknown'} kernel path, not a GPU one (grouped_mm or triton)"
    if kernel_path not in GPU_KERNEL_PATHS:
        return f"it ran the {kernel_path} kernels, which the ranking does not price (it prices grouped_mm and triton)"
    wanted = recipe.kernel_path
    if wanted == "auto":
        wanted = resolve_kernel_path(wanted, compute_capability) if compute_capability else kernel_path
    if kernel_path != wanted:
        return f"it ran the {kernel_path} kernels, and the recipe ranks this GPU with {wanted}"
    name = model_name(run_model)
    if name.lower() != recipe.model.lower():
        return f"it trained {name or 'a model with no released name (random weights)'}, not {recipe.model}"
    return None


def box_measurement_problem(box: Instance, *, kernel_path: str, recipe: Workload, run_model) -> str | None:
    """`measurement_problem` for a run's step times on a box, with the GPU architecture of the offer it was rented
    from (what "auto" resolves the kernel path by)."""
    capability = (Offer.objects.filter(provider=box.provider, offer_id=box.offer_id)
                  .values_list("compute_capability", flat=True).first())
    return measurement_problem(simulated=simulated_provider(box.provider), kernel_path=kernel_path, recipe=recipe,
                               run_model=run_model, compute_capability=capability)


def load_calibration() -> Calibration:
    entries = dict(SEED_CALIBRATION.entries)
    for row in ThroughputCalibration.objects.all():
        entries[(row.gpu_model, row.kernel_path)] = CalibrationEntry(
            gpu_model=row.gpu_model, kernel_path=row.kernel_path, model_tflops=row.model_tflops,
            weight=row.weight, measured_runs=row.measured_runs, note=row.note)
    return replace(SEED_CALIBRATION, entries=entries)


def record_finished_run(*, gpu_name: str, kernel_path: str, recipe: Workload, step_seconds: float,
                        num_gpus: int = 1) -> CalibrationEntry:
    """Folds one finished run's steady-state step time into the stored table and returns the updated entry; the
    caller has checked it is a measurement (measurement_problem)."""
    with transaction.atomic():
        # Lock the rows so two runs finishing at once both count (the last writer would otherwise win).
        list(ThroughputCalibration.objects.select_for_update())
        updated = record_step_time(load_calibration(), gpu_name=gpu_name, kernel_path=kernel_path, recipe=recipe,
                                   step_seconds=step_seconds, num_gpus=num_gpus)
        entry = updated.get(gpu_name, kernel_path)  # the only entry a run changes
        assert entry is not None  # record_step_time has just written it
        ThroughputCalibration.objects.update_or_create(
            gpu_model=entry.gpu_model, kernel_path=entry.kernel_path,
            defaults={"model_tflops": entry.model_tflops, "weight": entry.weight,
                      "measured_runs": entry.measured_runs, "note": entry.note})
    return entry
