"""When a run ends and what it costs, and its cost so far as a curve: pure over plain values."""

import math
import statistics
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
    eta_span_s: tuple[float, float] | None = None  # seconds to the finish at the steps' lower and upper quartile

    @property
    def eta_words(self) -> str:
        """How long until it finishes, as a range: "12–15 min"."""
        return span_words(*self.eta_span_s) if self.eta_span_s else ""

    @property
    def percent(self) -> float:
        return 100 * self.steps_done / self.steps_total if self.steps_total else 0.0  # exact for any int

    @property
    def usd_per_1k_steps(self) -> Decimal | None:
        return None if self.usd_per_step is None else self.usd_per_step * STEPS_PER_PRICE


@dataclass(frozen=True)
class StepTime:
    """The newest steps' time: their median, which one slow step (a checkpoint's) does not move, and their lower and
    upper quartile, the range a projection gives."""

    typical_s: float
    low_s: float
    high_s: float


def step_time(samples) -> StepTime | None:
    """The step time of a run's newest steps' times; None without a usable one."""
    usable = sorted(s for s in samples if usable_step_s(s) is not None)
    if not usable:
        return None
    if len(usable) == 1:
        return StepTime(usable[0], usable[0], usable[0])
    low, typical, high = statistics.quantiles(usable, n=4, method="inclusive")
    return StepTime(typical, low, high)


# A span is said in the largest unit its upper end reaches twice over: seconds, minutes, hours, days.
_UNITS = ((120, 1, "s"), (120 * 60, 60, "min"), (48 * 3600, 3600, "h"), (math.inf, 86400, "days"))


def span_words(low_s: float, high_s: float) -> str:
    """"12–15 min", "2.5–3.1 h", "5–6 days": both ends in one unit; one figure where they read alike."""
    _, size, unit = next(u for u in _UNITS if high_s < u[0])
    places = 1 if unit == "h" and high_s < 10 * 3600 else 0
    low, high = (f"{round(x / size, places):.{places}f}" for x in (low_s, high_s))
    return f"{low} {unit}" if low == high else f"{low}–{high} {unit}"


def usable_step_s(step_s: float | None) -> float | None:
    """A reported step time the projection can rest on: a box may have stored NaN, an infinity or a negative."""
    return step_s if step_s is not None and math.isfinite(step_s) and step_s >= 0 else None


def steps_done(planned: list[int], current_phase: int, current_step: int) -> int:
    """Steps trained so far: every earlier phase in full, plus the current one's."""
    return sum(planned[:current_phase]) + min(current_step, planned[current_phase] if current_phase < len(planned)
                                              else current_step)


def project(*, planned: list[int], current_phase: int, current_step: int, step_s: float | StepTime | None,
            usd_per_hour: Decimal | None, cost_usd: Decimal, now: datetime, active: bool,
            finished_at: datetime | None = None) -> Projection:
    """When the run ends and what it costs by then, at its recent step time (a StepTime: its median and quartiles)
    on its current box's price. An ended run's projection is what happened; a run with no step time yet projects
    nothing, and one that would not end within HORIZON projects neither a date nor a total."""
    spread = step_s if isinstance(step_s, StepTime) else None
    typical = step_s.typical_s if isinstance(step_s, StepTime) else step_s
    total = sum(planned)
    done = total if (not active and finished_at and current_phase >= len(planned) - 1
                     and current_step >= (planned[-1] if planned else 0)) else steps_done(planned, current_phase,
                                                                                       current_step)
    step_s = usable_step_s(typical)
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
    span = (remaining * spread.low_s, remaining * spread.high_s) if spread is not None else (remaining_s, remaining_s)
    return Projection(done, total, step_s, per_step, now + timedelta(seconds=remaining_s),
                      cost_usd + usd_per_hour * Decimal(str(remaining_s)) / ledger.SECONDS_PER_HOUR, cost_usd,
                      eta_span_s=span)


def cost_curve(segments: list[tuple], traffic_usd: Decimal, now: datetime) -> tuple[list[datetime], list[float]]:
    """The run's cumulative cost over time from its boxes' cost segments (usd_per_hour, started_at, ended_at): exact,
    since the cost is linear between segment boundaries. Traffic is billed in the first point."""
    times = sorted({t for _, start, end in segments for t in (start, end or now) if t <= now} | ({now} if segments
                                                                                              else set()))
    values = [float(traffic_usd + ledger.cost_in_window(segments, None, t)) for t in times]
    return times, values
