"""How the run pages write figures and recorded reasons: the runs list and a run's page write one figure the same
way, and a machine's token never reaches a person as it is."""

import math
from decimal import Decimal

from django import template

from runs import phase_figures, wording

register = template.Library()


@register.filter
def usd(value) -> str:
    """Dollars to the cent from $1 on, to three significant digits below (a thousand steps of a small run cost less
    than a cent): $1,204.00, $4.40, $0.0417."""
    if value is None:
        return "–"
    value = Decimal(value)
    if not value.is_finite():
        return "unknown"
    if value == 0 or abs(value) >= 1:
        return f"${value:,.2f}"
    decimals = 2 - math.floor(math.log10(abs(value)))
    return f"${value:.{decimals}f}"


@register.filter
def reason(message: str) -> str:
    return wording.reason_text(message)


@register.filter
def event_kind(kind: str) -> str:
    return wording.event_kind_text(kind)


@register.filter
def kind_charts(run) -> list[str]:
    """The ids of a run's phase-kind charts (runs/phase_figures.py), for their places on its page."""
    return phase_figures.kind_charts(run)
