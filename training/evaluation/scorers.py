"""How an eval phase scores an answer: each scorer gives a number in [0, 1] per sample from the model's answer and
the record (docs/training.md, "The eval phase"). The built-ins give 0 or 1; a recipe may name its own function as
'module:function', called as GRPO's rewards are: fn(prompt, answer, record)."""

import json
import math
import re

from training.recipe import SCORERS, load_reward

from .tools import argument_problem, parse_tool_call, tools_by_name

_REASONING_END = "</think>"


class ScoreError(ValueError):
    """A scorer that cannot score: a record it cannot read, or a function that raised or gave something outside
    [0, 1]."""


def final_answer(text: str) -> str:
    """What a model answered after its reasoning (Qwen3 writes `<think>...</think>` first): the text after the last
    `</think>`, or the whole text."""
    return text.rsplit(_REASONING_END, 1)[-1]


def _spaced(text: str) -> str:
    return " ".join(text.split())


def exact(answer: str, record: dict) -> float:
    """1 when the answer is the expected text, spaces and newlines around either aside."""
    return float(final_answer(answer).strip() == record["expected"].strip())


def contains(answer: str, record: dict) -> float:
    """1 when the expected text occurs in the answer, every run of spaces and newlines in both read as one space."""
    return float(_spaced(record["expected"]) in _spaced(final_answer(answer)))


def regex(answer: str, record: dict) -> float:
    """1 when the expected text, a Python regular expression (flags inline: `(?i)`, `(?s)`, `(?m)`), matches somewhere
    in the answer."""
    return float(re.search(record["expected"], final_answer(answer)) is not None)


def tool_call(answer: str, record: dict) -> float:
    """1 when the answer calls one of the record's tools (`tool_call_verdict`), with arguments its schema accepts,
    and (when the record gives one) is the expected call."""
    return float(not tool_call_verdict(answer, record))


def tool_call_verdict(answer: str, record: dict) -> str:
    """Why the answer is not the call the record asks for, or "" when it is."""
    call = parse_tool_call(final_answer(answer))
    if call is None:
        return "no tool call in the answer"
    known = tools_by_name(record.get("tools"))
    if call["name"] not in known:
        return f"calls {call['name'][:60]!r}, not one of the record's tools ({', '.join(sorted(known))})"
    if not isinstance(call["arguments"], dict):
        return "its arguments are not a JSON object"
    if problem := argument_problem(known[call["name"]], call["arguments"]):
        return f"its arguments do not fit {call['name']}'s schema: {problem}"
    expected = record.get("expected")
    if isinstance(expected, dict) and (call["name"], call["arguments"]) != (expected["name"],
                                                                           expected.get("arguments", {})):
        return f"not the expected call {json.dumps(expected, sort_keys=True)[:200]}"
    return ""


BUILT_IN = {"exact": exact, "contains": contains, "regex": regex, "tool_call": tool_call}
assert tuple(BUILT_IN) == SCORERS


def record_problem(scorer: str, record: dict) -> str:
    """Why a (checked) record cannot be scored by a built-in scorer, or "" (a function's records are its own
    business)."""
    expected = record.get("expected")
    if scorer == "tool_call":
        return "" if record.get("tools") else "the tool_call scorer needs the record's tools"
    if scorer not in BUILT_IN:
        return ""
    if not isinstance(expected, str):
        return f"the {scorer} scorer needs expected as a text"
    if scorer == "regex":
        try:
            re.compile(expected)
        except re.error as exc:
            return f"expected is not a regular expression: {exc}"
    return ""


class Scorer:
    """One eval phase's scorer by its recipe name: score(prompt, answer, record) -> a number in [0, 1]."""

    def __init__(self, name: str):
        self.name = name
        self.function = None if name in BUILT_IN else load_reward(name)

    def score(self, prompt, answer: str, record: dict) -> float:
        if self.function is None:
            return BUILT_IN[self.name](answer, record)
        try:
            value = self.function(prompt, answer, record)
        except Exception as exc:  # the recipe's own code: whatever it raises stops the evaluation, with its words
            raise ScoreError(f"the scorer {self.name} raised {type(exc).__name__}: {str(exc)[:300]}") from exc
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value <= 1:
            raise ScoreError(f"the scorer {self.name} returned {str(value)[:60]!r}; a score is a number from 0 to 1")
        return float(value)
