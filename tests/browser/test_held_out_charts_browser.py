"""The run page in a real browser draws a phase's held-out figures beside its training curve and each phase kind's
own charts, in the phase's colour."""

import pytest

from tests.browser.conftest import chromium, log_in, needs_chromium, wait_until

pytestmark = [needs_chromium, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def validated(member):
    from tests.runs.seeding import seed_run

    from runs.models import MetricPoint

    run = seed_run("validated", created_by=member)
    run.recipe = {"phases": [{"kind": "cpt", "data": "c", "steps": 40, "eval_split": 0.1, "eval_every": 10},
                             {"kind": "sft", "data": "s", "steps": 40},
                             {"kind": "dpo", "data": "d", "steps": 30, "eval_data": "held-dpo"}]}
    run.save(update_fields=["recipe"])
    for step in (10, 20, 30, 40):
        MetricPoint.objects.filter(run=run, phase=0, step=step).update(eval_loss=3.0 - step / 40,
                                                                       eval_perplexity=20.0 - step / 4)
    MetricPoint.objects.filter(run=run, phase=2).update(rewards_chosen=-0.5, rewards_rejected=-1.5,
                                                        rewards_accuracy=0.75, rewards_margin=1.0)
    MetricPoint.objects.filter(run=run, phase=2, step=30).update(eval_rewards_chosen=-0.7, eval_rewards_rejected=-1.2,
                                                                 eval_rewards_accuracy=0.5, eval_rewards_margin=0.5)
    return run


def test_held_out_diamonds_sit_beside_each_phases_curve_and_each_kind_has_its_charts(live_server, validated):
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        log_in(page, live_server, "member")
        page.goto(f"{live_server.url}/runs/{validated.pk}/")
        wait_until(page, "document.querySelector('[data-chart=\"preference-margin\"].js-plotly-plot') !== null",
                   timeout_ms=20_000)
        traces = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('.js-plotly-plot')].map(
            el => [el.dataset.chart, (el.data || []).map(t => [t.name, t.mode, (t.marker || {}).symbol || null,
                                                             (t.line || {}).color])]))""")
        loss = {name: (mode, symbol, colour) for name, mode, symbol, colour in traces["loss"]}
        mode, symbol, colour = loss["held-out loss · cpt"]
        assert (mode, symbol) == ("lines+markers", "diamond") and colour == loss["0 · cpt"][2]  # the phase's colour
        assert {name for name, *_ in traces["preference-rewards"]} == {
            "chosen · dpo", "rejected · dpo", "held-out chosen · dpo", "held-out rejected · dpo"}
        assert {name for name, *_ in traces["perplexity"]} == {"held-out perplexity · cpt"}
        assert "grpo-reward" not in traces and "kl" not in traces  # no GRPO or KTO phase in this run
        assert errors == []
