"""When a run ends and what it costs, and its cost so far as a curve: pure over plain values."""

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from fleet.instances import ledger

# A finish further out than this is not a date anyone plans by (and past year 9999 none can be written): the
# projection says it is beyond reach instead of computing one.
HORIZON = timedelta(days=3650)
STEPS_PER_PRICE = 1000  # cost is shown per this many steps: a step alone costs fractions of a cent


@dataclass(frozen=True)
class Projection:
    steps_done: int
    steps_total: int
    step_s: float | None
    usd_per_step: Decimal | None
    finish_at: datetime | None
    total_usd: Decimal | None
    cost_usd: Decimal = Decimal(0)  # so far
    beyond_horizon: bool = False  # at this step time the run would not end within HORIZON

    @property
    def percent(self) -> float:
        return 100 * self.steps_done / self.steps_total if self.steps_total else 0.0  # exact for any int

    @property
    def usd_per_1k_steps(self) -> Decimal | None:
        return None if self.usd_per_step is None else self.usd_per_step * STEPS_PER_PRICE


def usable_step_s(step_s: float | None) -> float | None:
    """A reported step time the projection can rest on: a box may have stored NaN, an infinity or a negative."""
    return step_s if step_s is not None and math.isfinite(step_s) and step_s >= 0 else None


def steps_done(planned: list[int], current_phase: int, current_step: int) -> int:
    """Steps trained so far: every earlier phase in full, plus the current one's."""
    return sum(planned[:current_phase]) + min(current_step, planned[current_phase] if current_phase < len(planned)
                                              else current_step)


def project(*, planned: list[int], current_phase: int, current_step: int, step_s: float | None,
            usd_per_hour: Decimal | None, cost_usd: Decimal, now: datetime, active: bool,
            finished_at: datetime | None = None) -> Projection:
    """When the run ends and what it costs by then, at its recent step time on its current box's price. An ended
    run's projection is what happened; a run with no step time yet projects nothing, and one that would not end
    within HORIZON projects neither a date nor a total."""
    total = sum(planned)
    done = total if (not active and finished_at and current_phase >= len(planned) - 1
                     and current_step >= (planned[-1] if planned else 0)) else steps_done(planned, current_phase,
                                                                                       current_step)
    step_s = usable_step_s(step_s)
    per_step = None
    if step_s is not None and usd_per_hour is not None:
        per_step = usd_per_hour * Decimal(str(step_s)) / ledger.SECONDS_PER_HOUR
    if not active:
        return Projection(done, total, step_s, per_step, finished_at, cost_usd, cost_usd)
    if step_s is None or usd_per_hour is None:
        return Projection(done, total, step_s, per_step, None, None, cost_usd)
    remaining = max(0, total - done)
    # Compared before multiplying: a stored step count can be larger than any float or timedelta holds.
    if step_s and remaining > HORIZON.total_seconds() / step_s:
        return Projection(done, total, step_s, per_step, None, None, cost_usd, beyond_horizon=True)
    remaining_s = remaining * step_s
    return Projection(done, total, step_s, per_step, now + timedelta(seconds=remaining_s),
                      cost_usd + usd_per_hour * Decimal(str(remaining_s)) / ledger.SECONDS_PER_HOUR, cost_usd)


def cost_curve(segments: list[tuple], traffic_usd: Decimal, now: datetime) -> tuple[list[datetime], list[float]]:
    """The run's cumulative cost over time from its boxes' cost segments (usd_per_hour, started_at, ended_at): exact,
    since the cost is linear between segment boundaries. Traffic is billed in the first point."""
    times = sorted({t for _, start, end in segments for t in (start, end or now) if t <= now} | ({now} if segments
                                                                                              else set()))
    values = [float(traffic_usd + ledger.cost_in_window(segments, None, t)) for t in times]
    return times, values
