"""Each phase kind's own charts on the run page (DPO/KTO rewards, GRPO rewards and rollouts, the KL to the reference,
CPT's held-out perplexity), in the phase's colour with its held-out figures beside its training ones; pure over what
runs/run_data.py read. Only the charts of kinds the run has are drawn (`kind_charts`)."""

from dataclasses import dataclass

from runs.figures import _phase_marks, _phase_series, _trace, held_out_trace, layout, phase_colour
from runs.run_data import ChartInputs
from training.recipe import RunRecipe

PREFERENCE, GRPO = ("dpo", "kto"), ("grpo",)
NOTHING_YET = "Nothing yet: this chart fills in as the phase trains (its held-out figures at each validation)."


@dataclass(frozen=True)
class Line:
    field: str  # a metric_fields name; eval_* draws as held-out diamonds
    label: str
    dash: str = "solid"
    right: bool = False  # on the right-hand axis


@dataclass(frozen=True)
class KindChart:
    id: str
    title: str
    y_title: str
    kinds: tuple[str, ...]
    lines: tuple[Line, ...]
    y2_title: str = ""
    held_out_only: bool = False  # drawn only for phases validated on held-out data


CHARTS = (
    KindChart("perplexity", "Held-out perplexity (CPT)", "perplexity", ("cpt",),
              (Line("eval_perplexity", "perplexity"),), held_out_only=True),
    KindChart("preference-rewards", "DPO/KTO rewards: chosen (solid), rejected (dashed), held-out (diamonds)",
              "reward (beta x log-prob gain)", PREFERENCE,
              (Line("rewards_chosen", "chosen"), Line("rewards_rejected", "rejected", "dash"),
               Line("eval_rewards_chosen", "chosen"), Line("eval_rewards_rejected", "rejected"))),
    KindChart("preference-margin", "DPO/KTO reward margin (solid) and DPO accuracy (dashed, right)",
              "chosen - rejected reward", PREFERENCE,
              (Line("rewards_margin", "margin"), Line("eval_rewards_margin", "margin"),
               Line("rewards_accuracy", "accuracy", "dash", right=True),
               Line("eval_rewards_accuracy", "accuracy", right=True)), y2_title="accuracy"),
    KindChart("grpo-reward", "GRPO reward: mean (solid), spread within groups (dotted), held-out greedy (diamonds)",
              "reward", GRPO,
              (Line("reward_mean", "mean"), Line("reward_std", "spread", "dot"), Line("eval_reward_mean", "mean"),
               Line("eval_reward_std", "spread"))),
    KindChart("grpo-rollouts", "GRPO completions: length (solid), groups without reward spread (dashed, right)",
              "tokens", GRPO,
              (Line("completion_length", "length"), Line("zero_spread_groups", "no spread", "dash", right=True)),
              y2_title="share of groups"),
    KindChart("kl", "KL to the reference (KTO's estimate; GRPO: to the adapter-off model)", "KL", ("kto", "grpo"),
              (Line("kl", "KL"),)),
)
BY_ID = {chart.id: chart for chart in CHARTS}


def kind_charts(run) -> list[str]:
    """The ids of the charts a run's recipe asks for, in page order: those of its phases' kinds, the held-out-only
    ones where such a phase names eval_data or eval_split."""
    phases = RunRecipe.from_stored(run.recipe).phases
    return [chart.id for chart in CHARTS
            if any(p.kind in chart.kinds and (not chart.held_out_only or p.eval_data or p.eval_split) for p in phases)]


def _figure(chart: KindChart, inputs: ChartInputs) -> dict:
    data, rows, edges = inputs.data, inputs.rows, inputs.edges
    traces = []
    for p in data.stats:
        if not p.points or p.kind not in chart.kinds:
            continue
        colour = phase_colour(p)
        for line in chart.lines:
            axis = {"yaxis": "y2"} if line.right else {}
            if line.field.startswith("eval_"):
                held = held_out_trace(data, rows, edges, line.field, p, line.label, **axis)
                if held is not None:
                    traces.append(held)
                continue
            xs, ys = _phase_series(data, rows, edges, line.field, p)
            if any(y is not None for y in ys):
                traces.append(_trace(f"{line.label} · {p.name}", xs, ys, colour,
                                     line={"color": colour, "width": 1.4, "dash": line.dash}, **axis))
    extra: dict = {}
    if chart.y2_title:
        extra = {"yaxis2": {"title": {"text": chart.y2_title}, "overlaying": "y", "side": "right",
                            "rangemode": "tozero", "showgrid": False}, "margin": {"l": 64, "r": 56}}
    figure = {"id": chart.id, "title": chart.title, "data": traces,
              "layout": layout(chart.title, chart.y_title, shapes=_phase_marks(data), **extra)}
    return figure if traces else {**figure, "empty": NOTHING_YET}


def phase_kind_figures(inputs: ChartInputs) -> list[dict]:
    """The figures of the charts its run asks for (`kind_charts`)."""
    return [_figure(BY_ID[chart_id], inputs) for chart_id in kind_charts(inputs.data.run)]
