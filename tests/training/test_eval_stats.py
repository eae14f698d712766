"""An evaluation's summary (means, paired-bootstrap interval, wins/ties/losses) and the promote rule over it."""

import random

import pytest

from training.eval_stats import promoted, summarize


def test_it_gives_a_zero_interval_when_the_adapter_changes_nothing():
    scores = [1.0, 0.0, 1.0, 1.0, 0.0]
    summary = summarize(scores, list(scores))
    assert summary == {"n": 5, "base_score": 0.6, "adapter_score": 0.6, "difference": 0.0, "ci_low": 0.0,
                       "ci_high": 0.0, "wins": 0, "ties": 5, "losses": 0}


def test_it_centres_the_interval_on_a_known_shift():
    rng = random.Random(7)
    base = [rng.uniform(0.0, 0.7) for _ in range(400)]
    adapter = [b + 0.25 + rng.uniform(-0.05, 0.05) for b in base]
    summary = summarize(base, adapter, seed=3)
    assert summary["difference"] == pytest.approx(0.25, abs=0.01)
    # Differences spread over +-0.05 (sd about 0.029): the mean's 95% interval is about +-0.003 wide.
    assert 0.24 < summary["ci_low"] < summary["difference"] < summary["ci_high"] < 0.26
    assert summary["ci_high"] - summary["ci_low"] < 0.01
    assert (summary["wins"], summary["ties"], summary["losses"]) == (400, 0, 0)


def test_it_covers_zero_when_wins_and_losses_balance():
    base = [0.0, 1.0] * 50
    adapter = [1.0, 0.0] * 50
    summary = summarize(base, adapter)
    assert summary["difference"] == 0.0
    assert summary["ci_low"] < 0.0 < summary["ci_high"]
    assert (summary["wins"], summary["ties"], summary["losses"]) == (50, 0, 50)


def test_it_is_the_same_for_the_same_seed_and_differs_for_another():
    rng = random.Random(1)
    base = [float(rng.random() < 0.4) for _ in range(60)]
    adapter = [float(rng.random() < 0.6) for _ in range(60)]
    assert summarize(base, adapter, seed=11) == summarize(base, adapter, seed=11)
    other = summarize(base, adapter, seed=12)
    assert (other["ci_low"], other["ci_high"]) != (summarize(base, adapter, seed=11)["ci_low"],
                                                   summarize(base, adapter, seed=11)["ci_high"])
    assert other["difference"] == summarize(base, adapter, seed=11)["difference"]


def test_it_counts_partial_scores_sample_by_sample():
    summary = summarize([0.5, 0.2, 0.9], [0.75, 0.2, 0.1])
    assert (summary["wins"], summary["ties"], summary["losses"]) == (1, 1, 1)
    assert summary["adapter_score"] == pytest.approx(1.05 / 3)


@pytest.mark.parametrize(("base", "adapter", "words"), [
    ([], [], "no samples"),
    ([0.5], [0.5, 0.5], "1 base scores but 2 adapter scores"),
    ([0.5], [1.5], "adapter score of sample 0 is 1.5"),
    ([float("nan")], [0.5], "base score of sample 0 is nan"),
])
def test_it_refuses_scores_that_are_not_paired_numbers_from_0_to_1(base, adapter, words):
    with pytest.raises(ValueError, match=words):
        summarize(base, adapter)


def _summary(base, adapter):
    return {"base_score": base, "adapter_score": adapter}


def test_it_promotes_on_gain_and_minimum_score():
    assert promoted(_summary(0.4, 0.6), {"metric": "difference", "min_gain": 0.1})[0]
    ok, reason = promoted(_summary(0.4, 0.45), {"metric": "difference", "min_gain": 0.1})
    assert not ok and "+0.0500 is below the required +0.1000" in reason
    ok, reason = promoted(_summary(0.4, 0.6), {"metric": "adapter_score", "min_gain": 0.0, "min_score": 0.7})
    assert not ok and "adapter score 0.6000 is below the required 0.7000" in reason
    ok, reason = promoted(_summary(0.4, 0.8), {"metric": "adapter_score", "min_score": 0.7})
    assert ok and "0.8000 >= 0.7000" in reason


def test_it_promotes_an_unchanged_adapter_only_when_no_gain_is_asked():
    assert promoted(_summary(0.5, 0.5), {"metric": "difference"})[0]
    assert not promoted(_summary(0.5, 0.49), {"metric": "difference"})[0]


def test_it_promotes_nothing_without_a_rule():
    assert promoted(_summary(0.1, 0.9), None) == (False, "the recipe has no promote rule")
