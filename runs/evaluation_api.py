"""The agent API's evaluation calls (under /api/agent/v1/evaluation/, the box's own token; docs/runs.md,
"Evaluation"): start, samples, finish, failed. Every text and score a box posts is checked strictly; a post with one
bad sample stores none of it."""

from typing import Annotated, Literal

from ninja import Field, Router, Schema
from pydantic import AfterValidator, ConfigDict

from runs import evaluations
from training.metric_fields import LARGEST_TOKENS_PER_S

MAX_TEXT_CHARS = 20_000  # each text of a sample; the agent cuts a longer one and ends it with " [cut]"
MAX_SAMPLES_PER_POST = 100
MAX_REASON_CHARS = 4000


def _no_nul(text: str) -> str:
    if "\x00" in text:
        raise ValueError("text must not contain NUL characters")
    return text


SampleText = Annotated[str, Field(max_length=MAX_TEXT_CHARS), AfterValidator(_no_nul)]
Score = Annotated[float, Field(strict=True, ge=0.0, le=1.0, allow_inf_nan=False)]
PhaseIndex = Annotated[int, Field(ge=0, le=100, strict=True)]

router = Router(tags=["evaluation"])


class _Strict(Schema):
    model_config = ConfigDict(extra="forbid")  # a field the contract does not name (a box's own summary) is refused


class ErrorOut(Schema):
    detail: str


class StartIn(_Strict):
    phase: PhaseIndex


class StartOut(Schema):
    done: list[int] = Field(..., description="the sample indices already recorded for this phase")


class SampleIn(_Strict):
    index: int = Field(..., ge=0, le=10_000_000, strict=True)
    prompt: SampleText
    expected: SampleText
    base_answer: SampleText
    adapter_answer: SampleText
    base_score: Score
    adapter_score: Score


class SamplesIn(_Strict):
    phase: PhaseIndex
    samples: list[SampleIn] = Field(..., max_length=MAX_SAMPLES_PER_POST)


class SamplesOut(Schema):
    recorded: int = Field(..., description="the samples of this post not recorded before")


class FinishIn(_Strict):
    phase: PhaseIndex
    generated_with: Literal["vllm", "transformers"]
    tokens_per_s: float = Field(..., strict=True, ge=0, le=LARGEST_TOKENS_PER_S, allow_inf_nan=False)


class FinishOut(Schema):
    state: str
    promoted: bool | None
    base_score: float
    adapter_score: float
    difference: float
    ci_low: float
    ci_high: float


class FailedIn(_Strict):
    phase: PhaseIndex
    reason: SampleText = Field(..., min_length=1, max_length=MAX_REASON_CHARS)


class FailedOut(Schema):
    state: str


@router.post("/start", response={200: StartOut, 409: ErrorOut, 422: ErrorOut})
def start(request, body: StartIn):
    return {"done": evaluations.start(request.auth, body.phase)}


@router.post("/samples", response={200: SamplesOut, 409: ErrorOut, 422: ErrorOut})
def samples(request, body: SamplesIn):
    return {"recorded": evaluations.record_samples(request.auth, body.phase, [s.dict() for s in body.samples])}


@router.post("/finish", response={200: FinishOut, 409: ErrorOut, 422: ErrorOut})
def finish(request, body: FinishIn):
    evaluation = evaluations.finish(request.auth, body.phase, body.generated_with, body.tokens_per_s)
    evaluation.run.refresh_from_db()
    return {"state": evaluation.run.state, "promoted": evaluation.promoted, "base_score": evaluation.base_score,
            "adapter_score": evaluation.adapter_score, "difference": evaluation.difference,
            "ci_low": evaluation.ci_low, "ci_high": evaluation.ci_high}


@router.post("/failed", response={200: FailedOut, 422: ErrorOut})
def failed(request, body: FailedIn):
    return {"state": evaluations.failed(request.auth, body.phase, body.reason)}
