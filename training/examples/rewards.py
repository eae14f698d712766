"""Example GRPO reward functions: fn(prompt, completion, record) -> float. A recipe names one as 'module:function'."""


def contains_answer(prompt, completion, record):
    """1.0 when the record's answer appears in the completion."""
    return 1.0 if str(record["answer"]).strip() in completion else 0.0


def answer_characters(prompt, completion, record):
    """Share of the answer's characters that the completion uses: a dense reward that even a random model varies on
    (the tests and the tiny example recipe use it)."""
    answer = set(str(record["answer"]))
    return len(answer & set(completion)) / max(1, len(answer))
