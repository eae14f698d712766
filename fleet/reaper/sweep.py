"""Running the reaper: snapshot the live instances, decide, claim each condemned row, then hand the destroys and moves
to the actions module through tasks (docs/fleet.md, "fleet/reaper/sweep.py")."""

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from fleet import enqueue
from fleet.alerts.notify import raise_alert
from fleet.instances import ledger
from fleet.models import Alert, Instance, InstanceEvent
from fleet.reaper.policy import (DESTROY, KEEP, MOVE, SKIP, Decision, InstanceSnapshot, ReaperPolicy, decide,
                                 keep_reason)

log = logging.getLogger(__name__)
State = Instance.State

_SNAPSHOT_FIELDS = ["pk", "label", "purpose", "requested_at", "running_at", "usd_per_hour", "keep_until",
                    "last_process_at", "last_step_at", "gpu_last_ok_at", "gpu_util_percent",
                    "consecutive_probe_failures"]


def policy_from_settings() -> ReaperPolicy:
    cap = settings.SPEND_CAP_USD_PER_HOUR
    return ReaperPolicy(
        max_age=timedelta(hours=settings.REAPER_MAX_AGE_HOURS),
        idle_grace=timedelta(minutes=settings.REAPER_IDLE_GRACE_MIN),
        boot_timeout=timedelta(minutes=settings.REAPER_BOOT_TIMEOUT_MIN),
        probe_failures=settings.REAPER_PROBE_FAILURES,
        gpu_unresponsive=timedelta(minutes=settings.REAPER_GPU_UNRESPONSIVE_MIN),
        no_progress=timedelta(minutes=settings.REAPER_NO_PROGRESS_MIN),
        spend_cap_usd_per_hour=cap if cap > 0 else None,
        first_step_timeout=timedelta(minutes=settings.RUN_FIRST_STEP_TIMEOUT_MIN),
    )


def snapshots(now: datetime | None = None) -> list[InstanceSnapshot]:
    """The rows the rules judge (live, not reaped yet) and, for the spend cap, those whose destroy is overdue."""
    live = Q(state__in=[State.PROVISIONING, State.RUNNING], reaped_at__isnull=True)
    rows = Instance.objects.filter(live | ledger.destroy_overdue(now or timezone.now()))
    return [InstanceSnapshot(*values, destroy_overdue=state == State.STOPPING)
            for *values, state in rows.values_list(*_SNAPSHOT_FIELDS, "state")]


_SAID = {DESTROY: "destroy", MOVE: "move", SKIP: "kept", KEEP: "kept"}
_SAID_DRY = {**_SAID, DESTROY: "would destroy", MOVE: "would move"}


@dataclass
class ReapReport:
    dry_run: bool
    decisions: list[Decision] = field(default_factory=list)  # what a rule said, protected boxes (SKIP) included
    kept: list[Decision] = field(default_factory=list)  # every other box judged (KEEP), with why it may live
    acted: list[int] = field(default_factory=list)  # the pks this pass claimed
    handed_over_again: list[int] = field(default_factory=list)  # reaped earlier, found still billing

    def lines(self) -> list[str]:
        """The rules' decisions, one line each, as the log says them."""
        return [self._line(d) for d in self.decisions]

    def every_line(self) -> list[str]:
        """Each box judged, condemned or not, with its reason, then what the pass comes to."""
        return [*self.lines(), *(self._line(d) for d in self.kept), self.summary()]

    def summary(self) -> str:
        due = [d for d in self.decisions if d.action in (DESTROY, MOVE)]
        checked = len(self.decisions) + len(self.kept)
        counts = f"{checked} box{'' if checked == 1 else 'es'} checked, {checked - len(due)} kept"
        if not due:
            return f"nothing to reap: {counts}"
        moves = sum(1 for d in due if d.action == MOVE)
        return f"{'would reap' if self.dry_run else 'reaping'} {len(due)} ({len(due) - moves} destroy, {moves} " \
               f"move): {counts}"

    def _line(self, d: Decision) -> str:
        return f"{(_SAID_DRY if self.dry_run else _SAID)[d.action]} {d.label}: {d.reason}"


def reap(*, now: datetime | None = None, dry_run: bool | None = None, policy: ReaperPolicy | None = None
         ) -> ReapReport:
    now = now or timezone.now()
    dry_run = settings.REAPER_DRY_RUN if dry_run is None else dry_run
    policy = policy or policy_from_settings()
    boxes = snapshots(now)
    decisions = decide(boxes, policy, now)
    judged = {d.pk for d in decisions}
    kept = [b for b in boxes if b.pk not in judged and not b.destroy_overdue]  # an overdue destroy is no box to keep
    report = ReapReport(dry_run=dry_run, decisions=decisions,
                        kept=[Decision(b.pk, b.label, KEEP, "", keep_reason(b, policy, now)) for b in kept])
    for line in report.lines():
        log.info("reaper%s: %s", " (dry run)" if dry_run else "", line)
    if dry_run:
        return report
    report.handed_over_again = hand_over_again(now=now)
    if not decisions:
        return report

    acting = {d.pk: d for d in decisions if d.action != SKIP}
    with transaction.atomic():
        # Rows another pass holds are skipped, rows it already reaped or that stopped meanwhile are filtered out, and
        # one kept for debugging since the snapshot is spared: each is claimed once, as the row is now.
        claimed = [i for i in Instance.objects.select_for_update(skip_locked=True).filter(
            pk__in=list(acting), reaped_at__isnull=True, state__in=[State.PROVISIONING, State.RUNNING])
            if not (i.keep_until and i.keep_until > now)]
        for instance in claimed:
            reason = acting[instance.pk].reason
            instance.reaped_at, instance.reap_reason = now, reason
            _stop(instance, f"reaped: {reason}", now)
        Instance.objects.bulk_update(claimed, ["reaped_at", "reap_reason", *_STOPPING_FIELDS])
        InstanceEvent.objects.bulk_create([
            InstanceEvent(instance=i, at=now, kind="reaped", message=f"Reaper: {acting[i.pk].action} "
                                                                      f"({acting[i.pk].reason})") for i in claimed])
        for instance in claimed:
            decision = acting[instance.pk]
            raise_alert(Alert.Kind.INSTANCE_REAPED, f"{instance.label} reaped: {decision.reason}",
                        instance=instance, now=now)
            transaction.on_commit(lambda d=decision: _hand_over(d.pk, d.action, d.reason), robust=True)
        if any(d.rule == "spend_cap" for d in acting.values()):
            cause = next(d.reason for d in acting.values() if d.rule == "spend_cap").split(":")[0]
            raise_alert(Alert.Kind.SPEND_CAP_HIT, f"{cause}: destroying the newest boxes until under the cap.",
                        now=now)
        _say_skipped([d for d in decisions if d.action == SKIP], now)
    report.acted = [i.pk for i in claimed]
    return report


_STOPPING_FIELDS = ["state", "destroy_reason", "destroy_requested_at"]


def _stop(instance: Instance, reason: str, now: datetime) -> None:
    """What actions.destroy writes before its provider call; the call itself comes with the hand-over."""
    instance.state, instance.destroy_reason, instance.destroy_requested_at = State.STOPPING, reason, now


def hand_over_again(*, now: datetime | None = None) -> list[int]:
    """Reaped rows still provisioning or running (reaped before rows moved to stopping in the reaper's transaction,
    their hand-over lost): moved to stopping and handed over as a destroy, once per row."""
    now = now or timezone.now()
    with transaction.atomic():
        stale = list(Instance.objects.select_for_update(skip_locked=True).filter(
            reaped_at__isnull=False, state__in=[State.PROVISIONING, State.RUNNING]).exclude(keep_until__gt=now))
        for instance in stale:
            _stop(instance, f"reaped: {instance.reap_reason}", now)
        Instance.objects.bulk_update(stale, _STOPPING_FIELDS)
        InstanceEvent.objects.bulk_create([
            InstanceEvent(instance=i, at=now, kind="reaped", message=f"Reaper: reaped at {i.reaped_at:%Y-%m-%d %H:%M} "
                          "UTC but still billing (its hand-over was lost): destroying it now.") for i in stale])
        for instance in stale:
            transaction.on_commit(lambda i=instance: _hand_over(i.pk, DESTROY, i.reap_reason), robust=True)
    return [i.pk for i in stale]


def _hand_over(pk: int, action: str, reason: str) -> None:
    if action == MOVE:
        enqueue.move_instance(pk, f"reaped: {reason}")
    else:
        enqueue.destroy_instance(pk, f"reaped: {reason}")


def _say_skipped(skipped: list[Decision], now: datetime) -> None:
    """A protected box's page says once why the reaper let it be, not once a minute."""
    said: dict[int, list[str]] = {}  # instance -> the skip messages already on its page (one query for the pass)
    for pk, message in InstanceEvent.objects.filter(instance_id__in=[d.pk for d in skipped], kind="reap-skipped"
                                                    ).values_list("instance_id", "message"):
        said.setdefault(pk, []).append(message)
    new = []
    for decision in skipped:
        message = f"Reaper: not reaped, {decision.reason}"
        kept_until = message.split(";")[0]  # the same keep, whatever the rule's figures say this minute
        if not any(m.startswith(kept_until) for m in said.get(decision.pk, ())):
            new.append(InstanceEvent(instance_id=decision.pk, at=now, kind="reap-skipped", message=message))
            said.setdefault(decision.pk, []).append(message)
    InstanceEvent.objects.bulk_create(new)
