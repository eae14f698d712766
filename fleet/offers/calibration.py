"""The throughput calibration table: the seeded figures, overlaid with what finished runs measured."""

from dataclasses import replace

from django.db import transaction

from fleet.models import ThroughputCalibration
from fleet.ranking import SEED_CALIBRATION, Calibration, CalibrationEntry, Recipe, record_step_time


def load_calibration() -> Calibration:
    entries = dict(SEED_CALIBRATION.entries)
    for row in ThroughputCalibration.objects.all():
        entries[(row.gpu_model, row.kernel_path)] = CalibrationEntry(
            gpu_model=row.gpu_model, kernel_path=row.kernel_path, model_tflops=row.model_tflops,
            weight=row.weight, measured_runs=row.measured_runs, note=row.note)
    return replace(SEED_CALIBRATION, entries=entries)


def record_finished_run(*, gpu_name: str, kernel_path: str, recipe: Recipe, step_seconds: float,
                        num_gpus: int = 1) -> CalibrationEntry:
    """Folds one finished run's steady-state step time into the stored table and returns the updated entry."""
    with transaction.atomic():
        # Lock the rows so two runs finishing at once both count (the last writer would otherwise win).
        list(ThroughputCalibration.objects.select_for_update())
        updated = record_step_time(load_calibration(), gpu_name=gpu_name, kernel_path=kernel_path, recipe=recipe,
                                   step_seconds=step_seconds, num_gpus=num_gpus)
        entry = updated.get(gpu_name, kernel_path)  # the only entry a run changes
        ThroughputCalibration.objects.update_or_create(
            gpu_model=entry.gpu_model, kernel_path=entry.kernel_path,
            defaults={"model_tflops": entry.model_tflops, "weight": entry.weight,
                      "measured_runs": entry.measured_runs, "note": entry.note})
    return entry
