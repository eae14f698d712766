"""The agent API that rented boxes report to, with its OpenAPI schema at /api/agent/v1/openapi.json.

Every call carries its box's own token (runs.tokens), and input is taken strictly (docs/runs.md, "runs/api.py").
"""

import functools
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Literal

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse
from ninja import Field, NinjaAPI, Schema
from ninja.errors import HttpError
from ninja.security import HttpBearer
from pydantic import AfterValidator, create_model, field_validator, model_validator

from runs import checkpoints, evaluation_api, evaluations, reports, storage, tokens
from training import metric_fields
from training.checkpoint_names import checkpoint_name


EARLIEST = datetime(2020, 1, 1, tzinfo=UTC)


def _no_nul(text: str) -> str:
    if "\x00" in text:
        raise ValueError("text must not contain NUL characters")
    return text


Text = Annotated[str, AfterValidator(_no_nul)]  # PostgreSQL text cannot hold NUL


class AttemptToken(HttpBearer):
    def authenticate(self, request, token):
        return tokens.attempt_for(token)


BOX_TOKEN = AttemptToken()


def _for_boxes_only(view):
    """The schema is for the agent that calls the API: served to a request with a box's valid token, 401 otherwise
    (it skips the dashboard's login like the rest of this API, so it needs its own check)."""
    @functools.wraps(view)
    def guarded(request, *args, **kwargs):
        if BOX_TOKEN(request) is None:
            return JsonResponse({"detail": "Unauthorized"}, status=401)
        return view(request, *args, **kwargs)

    return guarded


api = NinjaAPI(title="Run agent API", version="1", urls_namespace="agent_api", auth=BOX_TOKEN,
               docs_url=None, docs_decorator=_for_boxes_only)

JSON = "application/json"
BODY_METHODS = ("POST", "PUT", "PATCH")


def _json_bodies_only(run):
    """Wraps every operation before its body is read: a body declared as anything but JSON (text/plain, a form,
    multipart) is answered 415, which the API would otherwise parse as JSON whatever its Content-Type says. A
    request without a box's valid token is answered 401 first, as every call of this API is."""
    @functools.wraps(run)
    def checked(request, *args, **kwargs):
        if request.method in BODY_METHODS and request.content_type != JSON:
            if BOX_TOKEN(request) is None:
                return JsonResponse({"detail": "Unauthorized"}, status=401)
            return JsonResponse({"detail": f"The body must be {JSON}."}, status=415)
        return run(request, *args, **kwargs)

    return checked


api.add_decorator(_json_bodies_only, mode="view")


@api.exception_handler(RequestDataTooBig)
def too_big(request, exc):
    return api.create_response(request, {"detail": "The request body is too large."}, status=413)


@api.exception_handler(checkpoints.CheckpointRefused)
def refused(request, exc):
    return api.create_response(request, {"detail": str(exc)}, status=409)


@api.exception_handler(checkpoints.StillSealing)
def still_sealing(request, exc):
    # Not an error of the box's: it sends the report again after a while (training.agent.watch).
    response = api.create_response(request, {"detail": str(exc)}, status=503)
    response["Retry-After"] = "10"
    return response


@api.exception_handler(storage.StoreUnavailable)
def store_unavailable(request, exc):
    # The box asks again (training.agent.run): a store's bad minute must not fail the run or cost it a box.
    response = api.create_response(request, {"detail": f"{exc}; ask again shortly."}, status=503)
    response["Retry-After"] = "30"
    return response


@api.exception_handler(evaluations.NotYet)
def evaluation_not_yet(request, exc):
    return api.create_response(request, {"detail": str(exc)}, status=409)


@api.exception_handler(evaluations.SamplesRefused)
def evaluation_refused(request, exc):
    return api.create_response(request, {"detail": str(exc)}, status=422)


@api.exception_handler(reports.PointsRefused)
def points_refused(request, exc):
    return api.create_response(request, {"detail": str(exc)}, status=422)


class ErrorOut(Schema):
    detail: str


class PhaseOut(Schema):
    index: int
    name: str
    kind: str
    steps: int
    data: dict | None = None  # {dataset_id, name, sha256, manifest, download}: what the agent fetches and checks
    eval_data: dict | None = None  # the phase's held-out data (its recipe's eval_data), in the same form


class PresignedGetsOut(Schema):
    kind: Literal["s3-get"]
    files: dict[str, str] = Field(..., description="{file name: its presigned GET}")


class HubModelOut(Schema):
    kind: Literal["hub"]
    repo_id: str
    revision: str | None = None


class S3ModelOut(Schema):
    kind: Literal["s3"]
    uri: str
    files: dict[str, int] = Field(..., description="{file name under the prefix: its size in bytes}, what each "
                                                   "download is checked against")
    download: PresignedGetsOut
    expires_at: datetime = Field(..., description="the presigned GETs stop working then")
    manifest: dict[str, dict] | None = Field(None, description="{file name: {size, sha256}} as the dashboard hashed "
                                                               "the files: a volume's copy is used only if it matches")


class RefusedModelOut(Schema):
    kind: Literal["refused"]
    uri: str
    reason: str = Field(..., description="why the dashboard could not grant the model; the box reports it and stops")


ModelOut = Annotated[HubModelOut | S3ModelOut | RefusedModelOut, Field(discriminator="kind")]


class SpecOut(Schema):
    run_id: int
    name: str
    recipe: dict
    phases: list[PhaseOut]
    model: ModelOut | None = Field(None, description="the base model the box downloads; none when it is built from "
                                                     "the recipe's config")
    model_volume: dict | None = Field(None, description="{mount_path}: where the run's volume is mounted, the model "
                                                        "kept in it between boxes")
    resume: list[dict]
    upload: dict
    heartbeat_interval_s: int
    dead_man_window_s: int
    renewed_until: datetime
    max_metric_points: int
    evaluation: dict | None = Field(None, description="{phase, done}: every training phase is banked, the box only "
                                                      "evaluates, skipping the sample indices done")


class HeartbeatIn(Schema):
    state: Literal["installing", "training", "uploading", "evaluating", "idle", "stopping"]
    process_alive: bool = Field(False, strict=True)
    phase: int | None = Field(None, ge=0, le=100, strict=True)
    step: int | None = Field(None, ge=0, le=10_000_000, strict=True)
    gpu_util_percent: float | None = Field(None, ge=0, le=100, strict=True)
    gpu_mem_gib: float | None = Field(None, ge=0, le=10_000, strict=True)
    gpu_ok: bool | None = Field(None, strict=True)
    upload_queue: int = Field(0, ge=0, le=100_000, strict=True)


class HeartbeatOut(Schema):
    renewed_until: datetime
    command: Literal["continue", "stop", "stop_machine"]
    reason: str
    upload: dict


def _metric_field(field: metric_fields.MetricField):
    """One field of the metric record as the API validates it, from the record's own table: a number strictly (a
    float field takes an integer, nothing takes a boolean or a string of digits), within its bounds."""
    if field.kind is str:
        return Text, Field("", max_length=field.max_length)
    # None is no limit, as if not given
    return field.kind | None, Field(None, strict=True, ge=field.minimum, le=field.maximum,
                                    allow_inf_nan=False if field.kind is float else None)


class _PointBase(Schema):
    @field_validator(metric_fields.AT, check_fields=False)  # the field itself comes with PointIn below
    @classmethod
    def in_utc_and_plausible(cls, at: datetime | None) -> datetime | None:
        if at is None:
            return None
        try:
            at = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
        except OverflowError:  # the year 1 or 9999 with an offset
            raise ValueError("at must be when the step ran (UTC)") from None
        if not EARLIEST <= at <= datetime.now(UTC) + timedelta(days=1):
            raise ValueError("at must be when the step ran (UTC), not a time far in the past or the future")
        return at


def _one_width(counts: list[list[int]]) -> list[list[int]]:
    if len({len(layer) for layer in counts}) != 1:
        raise ValueError("router_load: every MoE layer counts the same experts (one width for every row)")
    return counts


# The router's load over one interval (training/router_load.py): per MoE layer, the (token, choice) pairs each expert
# received, as non-negative integers (a float, NaN or a negative count is refused).
RouterLoadIn = Annotated[
    list[Annotated[list[Annotated[int, Field(strict=True, ge=0, le=metric_fields.ROUTER_MAX_COUNT)]],
                   Field(min_length=1, max_length=metric_fields.ROUTER_MAX_EXPERTS)]],
    Field(min_length=1, max_length=metric_fields.ROUTER_MAX_LAYERS), AfterValidator(_one_width)]


# A point's fields come from metric_fields' table at run time; a type checker sees the class they extend.
if TYPE_CHECKING:
    PointIn = _PointBase
else:
    PointIn = create_model(
        "PointIn", __base__=_PointBase,
        **{key: (int, Field(..., ge=0, le=limit, strict=True)) for key, limit in metric_fields.KEY_LIMITS.items()},
        **{metric_fields.AT: (datetime | None, None)},
        **{field.name: _metric_field(field) for field in metric_fields.FIELDS},
        **{metric_fields.ROUTER_LOAD: (RouterLoadIn | None, None)},
    )


class MetricsIn(Schema):
    points: list[PointIn] = Field(..., max_length=10_000)


class MetricsOut(Schema):
    stored: int


class CheckpointIn(Schema):
    phase: int = Field(..., ge=0, le=100, strict=True)
    step: int = Field(..., ge=0, le=10_000_000, strict=True)
    uri: str = Field(..., min_length=1, max_length=500, pattern=r"^[A-Za-z0-9._/-]+$",
                     description="the checkpoint's folder in the run's own prefix: ckpt-p<phase>-s<step>, as the "
                                 "trainer names it")
    complete: bool = Field(..., strict=True)
    manifest: dict[str, dict] | None = Field(None, description="{file name: {size, sha256}}; required when complete")

    @model_validator(mode="after")
    def named_for_its_step(self):
        # Its own folder and no other: pruning deletes by this name, so one naming another checkpoint's folder (or
        # the run's whole prefix) would take that one's files with it.
        expected = checkpoint_name(self.phase, self.step)
        if self.uri != expected:
            raise ValueError(f"the checkpoint of phase {self.phase} step {self.step} is the folder {expected}")
        return self


class CheckpointOut(Schema):
    phase: int
    step: int
    complete: bool


class RejectedIn(Schema):
    phase: int = Field(..., ge=0, le=100, strict=True)
    step: int = Field(..., ge=0, le=10_000_000, strict=True)
    reason: Text = Field(..., min_length=1, max_length=2000)


class RejectedOut(Schema):
    rejected: bool


class EventIn(Schema):
    kind: Literal[reports.AGENT_EVENTS]  # type: ignore[valid-type]  # pydantic reads the tuple's values
    message: Text = Field("", max_length=4000)


class EventOut(Schema):
    state: str


@api.get("/spec", response={200: SpecOut})
def spec(request):
    return reports.spec(request.auth)


@api.post("/heartbeat", response={200: HeartbeatOut})
def heartbeat(request, beat: HeartbeatIn):
    return reports.heartbeat(request.auth, beat.dict())


@api.post("/metrics", response={200: MetricsOut, 413: ErrorOut})
def metrics(request, batch: MetricsIn):
    if len(batch.points) > settings.AGENT_MAX_METRIC_POINTS:
        raise HttpError(413, f"At most {settings.AGENT_MAX_METRIC_POINTS} points a batch.")
    return {"stored": reports.ingest_metrics(request.auth, [p.dict() for p in batch.points])}


@api.post("/checkpoints", response={200: CheckpointOut, 409: ErrorOut})
def checkpoint(request, notice: CheckpointIn):
    return checkpoints.checkpoint(request.auth, notice.dict())


@api.post("/checkpoints/rejected", response={200: RejectedOut})
def checkpoint_rejected(request, report: RejectedIn):
    return {"rejected": checkpoints.checkpoint_rejected(request.auth, report.phase, report.step, report.reason)}


@api.post("/events", response={200: EventOut, 503: ErrorOut})
def event(request, report: EventIn):
    return {"state": reports.agent_event(request.auth, report.kind, report.message)}


api.add_router("/evaluation/", evaluation_api.router)  # start, samples, finish, failed (runs/evaluation_api.py)
