"""Reaper policies: which live instances to destroy or move, and why. Pure: plain records in, decisions out
(docs/fleet.md, "fleet/reaper/policy.py")."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

DESTROY = "destroy"
MOVE = "move"  # destroy and continue the work on a new box
SKIP = "skip"  # a rule fired but the box is protected
KEEP = "keep"  # no rule fired: the box may live (a report says why)


@dataclass(frozen=True, slots=True)
class InstanceSnapshot:
    pk: int
    label: str
    purpose: str  # manual, training, serving, adopted
    requested_at: datetime
    running_at: datetime | None
    usd_per_hour: Decimal
    keep_until: datetime | None = None
    last_process_at: datetime | None = None  # a training or serving process was seen
    last_step_at: datetime | None = None  # training made step progress
    gpu_last_ok_at: datetime | None = None  # the GPU answered the on-box agent
    gpu_util_percent: float | None = None
    consecutive_probe_failures: int = 0
    # Asked to stop, and still listed after a destroy was due to be carried out: no rule acts on it (its destroy is
    # retried by the sync); it bills, and the spend cap counts its dollars as already being shed.
    destroy_overdue: bool = field(default=False, kw_only=True)


@dataclass(frozen=True)
class ReaperPolicy:
    max_age: timedelta = timedelta(hours=12)
    idle_grace: timedelta = timedelta(minutes=30)
    boot_timeout: timedelta = timedelta(minutes=60)  # asked for, never reported running
    probe_failures: int = 3
    gpu_unresponsive: timedelta = timedelta(minutes=5)
    no_progress: timedelta = timedelta(minutes=30)
    gpu_idle_percent: float = 5.0
    first_step_timeout: timedelta = timedelta(minutes=120)  # rented, its GPU idle, and no step yet
    spend_cap_usd_per_hour: Decimal | None = Decimal("12")


@dataclass(frozen=True, slots=True)
class Decision:
    pk: int
    label: str
    action: str  # DESTROY, MOVE, SKIP or KEEP
    rule: str  # max_age, probes, boot, hung, idle, spend_cap; "" for KEEP
    reason: str


def _span(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes} min"


def _limit(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes // 60}h" if minutes % 60 == 0 and minutes >= 60 else f"{minutes} min"


def hung(*, progress_at: datetime | None, gpu_util_percent: float | None, gpu_last_ok_at: datetime | None,
         policy: ReaperPolicy, now: datetime, first_step_since: datetime | None = None) -> str | None:
    """Why a training box counts as hung (it bills while nothing trains), or None: the rule the reaper and the run
    supervisor both judge by (docs/fleet.md, "Hung boxes")."""
    if gpu_last_ok_at is not None and now - gpu_last_ok_at > policy.gpu_unresponsive:
        return f"GPU not responding for {_span(now - gpu_last_ok_at)}"
    idle = gpu_util_percent is not None and gpu_util_percent < policy.gpu_idle_percent
    if progress_at is not None and idle and now - progress_at > policy.no_progress:
        return f"GPU idle {_span(now - progress_at)} and no step progress"
    if first_step_since is not None and idle and now - first_step_since > policy.first_step_timeout:
        return f"no first step {_span(now - first_step_since)} after it was rented, its GPU idle"
    return None


def rule_for(box: InstanceSnapshot, policy: ReaperPolicy, now: datetime) -> tuple[str, str, str] | None:
    """The first rule that condemns this box, as (action, rule, reason), or None if it may live."""
    started = box.running_at or box.requested_at
    age = now - started
    # A run of several phases takes days (33 h in docs/field-notes.md): a training box that is making progress is not
    # "forgotten", and killing it at 12 h would cost a restart. The hung-training rules below still watch it.
    training = box.purpose == "training" and box.last_step_at is not None \
        and now - box.last_step_at <= policy.no_progress
    if age > policy.max_age and not training:
        return DESTROY, "max_age", f"age {_span(age)} > max {_limit(policy.max_age)}"
    if box.purpose == "serving" and box.consecutive_probe_failures >= policy.probe_failures:
        return DESTROY, "probes", f"{box.consecutive_probe_failures} failed probes of /v1/models"
    if box.running_at is None:
        # Still booting. An image pull that hangs, or a bid the host refused (the machine made, stopped), never gets
        # further, and nothing else watches a manual or adopted box.
        waited = now - box.requested_at
        if waited > policy.boot_timeout:
            return DESTROY, "boot", f"not running {_span(waited)} after it was asked for"
        return None
    if box.purpose == "training" and box.last_process_at is not None:
        why = hung(progress_at=box.last_step_at or box.last_process_at, gpu_util_percent=box.gpu_util_percent,
                   gpu_last_ok_at=box.gpu_last_ok_at, policy=policy, now=now,
                   first_step_since=box.requested_at if box.last_step_at is None else None)
        if why:
            return MOVE, "hung", why
    if box.last_process_at is None and age > policy.idle_grace:
        return DESTROY, "idle", f"no training or serving process {_span(age)} after start"
    return None


def _ago(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    return f"{seconds} s" if seconds < 60 else _span(delta)


def keep_reason(box: InstanceSnapshot, policy: ReaperPolicy, now: datetime) -> str:
    """Why no rule condemns a box `rule_for` lets live, with the limit it is nearest to, in a report's words."""
    age = f"age {_ago(now - (box.running_at or box.requested_at))} of max {_limit(policy.max_age)}"
    if box.running_at is None:
        return f"booting for {_ago(now - box.requested_at)}, destroyed if not running after " \
               f"{_limit(policy.boot_timeout)}"
    if box.purpose == "serving":
        return f"serving, {box.consecutive_probe_failures} failed probes in a row of {policy.probe_failures} " \
               f"allowed; {age}"
    if box.purpose == "training" and box.last_step_at is not None:
        return f"training, last step {_ago(now - box.last_step_at)} ago; moved if hung (GPU silent " \
               f"{_limit(policy.gpu_unresponsive)}, or idle {_limit(policy.no_progress)} without progress)"
    if box.last_process_at is not None:
        return f"a {box.purpose} process seen {_ago(now - box.last_process_at)} ago; {age}"
    return f"no process yet, {_ago(now - box.running_at)} after start of {_limit(policy.idle_grace)} allowed"


def decide(boxes: list[InstanceSnapshot], policy: ReaperPolicy, now: datetime) -> list[Decision]:
    decisions = []
    condemned = set()
    stopping = [b for b in boxes if b.destroy_overdue]
    boxes = [b for b in boxes if not b.destroy_overdue]
    for box in boxes:
        verdict = rule_for(box, policy, now)
        if verdict is None:
            continue
        action, rule, reason = verdict
        decisions.append(_protect(box, action, rule, reason, now))
        if decisions[-1].action != SKIP:
            condemned.add(box.pk)

    cap = policy.spend_cap_usd_per_hour
    if cap is not None:
        billing = [b for b in boxes if b.pk not in condemned]
        # A box whose destroy is overdue bills, so the spend counts it; but its destroy was asked for already (the
        # sync retries it), so its dollars count as shed too: no live box is destroyed in its place, pass after pass.
        shed = sum((b.usd_per_hour for b in stopping), Decimal(0))
        spend = shed + sum((b.usd_per_hour for b in billing), Decimal(0))
        if spend - shed > cap:
            cause = f"spend ${spend:.2f}/h > cap ${cap:.2f}/h: newest first"
            if shed:
                cause = f"spend ${spend:.2f}/h (${shed:.2f}/h of it in destroys asked for, not yet carried out) > " \
                        f"cap ${cap:.2f}/h: newest first"
            for box in sorted(billing, key=lambda b: (b.requested_at, b.pk), reverse=True):
                if spend - shed <= cap:
                    break
                decision = _protect(box, DESTROY, "spend_cap", cause, now)
                decisions.append(decision)
                if decision.action != SKIP:
                    shed += box.usd_per_hour
    return decisions


def _protect(box: InstanceSnapshot, action: str, rule: str, reason: str, now: datetime) -> Decision:
    if box.keep_until is not None and box.keep_until > now:
        return Decision(box.pk, box.label, SKIP, rule,
                        f"kept for debugging until {box.keep_until:%Y-%m-%d %H:%M} UTC; would {action}: {reason}")
    return Decision(box.pk, box.label, action, rule, reason)
