"""Runs in the admin, to look at: launched (recipe validated, bucket checked) and cancelled from the Runs pages with
the launch permission; their bucket, budget, restarts and recipe are never edited here, since the box writes to that
bucket and executes that recipe, and the supervisor spends by that budget."""

from django.contrib import admin

from fleet.admin import ReadOnlyAdmin, ReadOnlyInline
from runs.models import Checkpoint, Evaluation, Run, RunEvent


class RunEventInline(ReadOnlyInline):
    model = RunEvent


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ["name", "state", "restarts", "max_restarts", "budget_usd", "created_at"]
    list_filter = ["state"]
    exclude = ["token_nonce"]
    inlines = [RunEventInline]


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    """What a run resumes from: written by its box through the agent API only."""

    list_display = ["run", "phase", "step", "complete", "uri", "created_at"]
    list_filter = ["complete"]


@admin.register(Evaluation)
class EvaluationAdmin(ReadOnlyAdmin):
    """A run's adapter scored against its base model: recorded from its box's samples through the agent API only."""

    list_display = ["run", "number", "state", "base_score", "adapter_score", "difference", "promoted", "created_at"]
    list_filter = ["state", "promoted"]
