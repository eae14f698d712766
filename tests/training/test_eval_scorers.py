"""The eval phase's scorers on the answers a model gives: a tool call wrapped in text or reasoning, broken JSON,
arguments of the wrong type or missing, a tool the record does not offer, regex flags, spaces and newlines."""

import pytest

from training.evaluation.scorers import Scorer, ScoreError, contains, exact, record_problem, regex, tool_call, \
    tool_call_verdict

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}, "days": {"type": "integer",
                                                                                     "minimum": 1}},
                                                "required": ["city"], "additionalProperties": False}}}
RECORD = {"prompt": "weather in Paris?", "tools": [WEATHER]}
EXPECTING = {**RECORD, "expected": {"name": "get_weather", "arguments": {"city": "Paris"}}}


@pytest.mark.parametrize("answer", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    'Let me look that up.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\nDone.',
    '<think>\nI should call {"name": "nothing"} here.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
    '"arguments": {"city": "Paris"}}\n</tool_call>',
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    'Sure: {"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"} is the call.',
    '```json\n{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}\n```',
])
def test_a_well_formed_call_scores_one_however_it_is_wrapped(answer):
    assert tool_call(answer, RECORD) == 1.0
    assert tool_call(answer, EXPECTING) == 1.0


@pytest.mark.parametrize("answer, why", [
    ("It is sunny in Paris.", "no tool call in the answer"),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}</tool_call>', "no tool call in the answer"),
    ('<tool_call>{"name": "get_weather", "arguments": "{city: Paris}"}</tool_call>',
     "its arguments are not a JSON object"),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": 75001}}</tool_call>',
     "its arguments do not fit get_weather's schema: city: 75001 is not of type 'string'"),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": "2"}}</tool_call>',
     "days: '2' is not of type 'integer'"),
    ('<tool_call>{"name": "get_weather", "arguments": {"days": 2}}</tool_call>', "'city' is a required property"),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}</tool_call>',
     "Additional properties are not allowed"),
    ('<tool_call>{"name": "get_time", "arguments": {"city": "Paris"}}</tool_call>',
     "calls 'get_time', not one of the record's tools (get_weather)"),
    ('<think><tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call></think>No call.',
     "no tool call in the answer"),
])
def test_a_call_that_is_not_right_scores_zero_and_says_why(answer, why):
    assert tool_call(answer, RECORD) == 0.0
    assert why in tool_call_verdict(answer, RECORD)


def test_a_valid_call_that_is_not_the_expected_one_scores_zero():
    answer = '<tool_call>{"name": "get_weather", "arguments": {"city": "Lyon"}}</tool_call>'
    assert tool_call(answer, RECORD) == 1.0  # well formed: all the record asks without an expected call
    assert tool_call(answer, EXPECTING) == 0.0
    assert tool_call_verdict(answer, EXPECTING).startswith("not the expected call")


def test_exact_and_contains_read_spaces_and_reasoning_as_said():
    record = {"prompt": "p", "expected": "New York"}
    assert exact("  New York\n", record) == 1.0
    assert exact("New  York", record) == 0.0
    assert exact("new york", record) == 0.0
    assert exact("<think>\nMaybe Boston.\n</think>\n\nNew York", record) == 1.0
    assert contains("It is New\n   York, I think.", record) == 1.0
    assert contains("It is NewYork.", record) == 0.0
    assert contains("<think>New York</think>Boston", record) == 0.0
    assert contains("x New York x", {"prompt": "p", "expected": "  New York\t"}) == 1.0


def test_regex_searches_anywhere_with_inline_flags():
    assert regex("The answer is 85.", {"prompt": "p", "expected": r"\b85\b"}) == 1.0
    assert regex("The answer is 850.", {"prompt": "p", "expected": r"\b85\b"}) == 0.0
    assert regex("PARIS", {"prompt": "p", "expected": "paris"}) == 0.0
    assert regex("PARIS", {"prompt": "p", "expected": "(?i)paris"}) == 1.0
    assert regex("first\nsecond", {"prompt": "p", "expected": "first.second"}) == 0.0
    assert regex("first\nsecond", {"prompt": "p", "expected": "(?s)first.second"}) == 1.0
    assert regex("a\nb", {"prompt": "p", "expected": "(?m)^b$"}) == 1.0


def test_a_record_a_scorer_cannot_read_is_said_before_any_generation():
    assert record_problem("regex", {"prompt": "p", "expected": "(unclosed"}).startswith(
        "expected is not a regular expression")
    assert record_problem("exact", EXPECTING) == "the exact scorer needs expected as a text"
    assert record_problem("tool_call", {"prompt": "p", "expected": "x"}) == \
        "the tool_call scorer needs the record's tools"
    assert record_problem("contains", {"prompt": "p", "expected": "x"}) == ""


def test_a_scoring_function_is_called_as_grpo_rewards_are_and_held_to_zero_to_one():
    scorer = Scorer("training.examples.rewards:answer_characters")
    assert scorer.score("2 + 2 =", "44", {"prompt": "2 + 2 =", "answer": "4"}) == 1.0
    assert Scorer("exact").score("p", "4", {"prompt": "p", "expected": "4"}) == 1.0
    over = Scorer("tests.training.test_eval_scorers:twice")
    with pytest.raises(ScoreError, match=r"the scorer tests\.training\.test_eval_scorers:twice returned '2\.0'"):
        over.score("p", "a", {"prompt": "p"})
    with pytest.raises(ScoreError, match="returned 'nan'"):
        Scorer("tests.training.test_eval_scorers:not_a_number").score("p", "a", {"prompt": "p"})
    # A GRPO reward taken for a scorer reads a record's `answer`, which an eval record does not have.
    with pytest.raises(ScoreError, match="^the scorer training.examples.rewards:contains_answer raised KeyError: "
                                         "'answer'$"):
        Scorer("training.examples.rewards:contains_answer").score("p", "a", {"prompt": "p", "expected": "4"})


def twice(prompt, answer, record):
    return 2.0


def not_a_number(prompt, answer, record):
    return float("nan")
