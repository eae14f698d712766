"""Phase data records, without torch: what each kind's JSONL line must hold, the tokenizer, and conversations rendered
with the assistant mask (docs/training.md, "training/records.py")."""

import json
import re

from training.evaluation.tools import call_problems, tool_spec_problems

IGNORE = -100
ROLES = ("system", "developer", "user", "assistant", "tool")
# A template that marks the assistant's tokens itself ({% generation %} ... {% endgeneration %}) is asked for them.
_GENERATION_MARK = re.compile(r"\{%-?\s*generation\s*-?%\}")
# How many tokens a template may add to a conversation's final assistant turn that the same turn inside a longer
# conversation lacks (Qwen3 opens the last one with an empty reasoning block: 4 tokens).
_MAX_LAST_TURN_EXTRA = 64
# A record's bounds, the box's and the launch check's alike: far past any real conversation, short of what makes
# parsing one line costly (json.loads recurses once per level and gives up near 1000).
MAX_RECORD_BYTES = 64 * 1024**2  # the launch check reads at most DATASET_MAX_LINE_BYTES of it, 16 MiB by default
MAX_RECORD_DEPTH = 64  # objects and lists inside one another


class RecordUnreadable(ValueError):
    """A JSONL line that is not read as a record: too long, not UTF-8, not JSON or nested too deep."""


class ByteTokenizer:
    """For models built from a config with random weights (tests, benchmarks): bytes shifted past 3 specials."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    chat_template = None
    SPECIALS = {0: "<pad>", 1: "<bos>", 2: "<eos>"}

    def __init__(self, vocab_size):
        if vocab_size < 4:
            raise ValueError("the byte tokenizer needs a vocabulary of at least 4")
        self.vocab_size = vocab_size

    def encode(self, text, add_special_tokens=False):
        return [3 + b % (self.vocab_size - 3) for b in text.encode("utf-8")]

    def decode(self, ids, skip_special_tokens=True):
        parts, data = [], bytearray()
        for i in ids:
            if i >= 3:
                data.append((i - 3) % 256)
            elif not skip_special_tokens:
                parts.append(data.decode("utf-8", errors="replace") + self.SPECIALS[i])
                data = bytearray()
        return "".join(parts) + data.decode("utf-8", errors="replace")


def load_tokenizer(model_recipe, vocab_size):
    if "config" in model_recipe and not model_recipe.get("tokenizer"):
        return ByteTokenizer(vocab_size)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_recipe.get("tokenizer") or model_recipe["path"])
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# -- what a record must hold -------------------------------------------------------------------------------------

def record_problems(kind: str, record) -> list[str]:
    """Everything wrong with one parsed JSONL record for a phase of this kind, in words; [] when it is usable."""
    if not isinstance(record, dict):
        return [f"a JSON object, got {type(record).__name__}"]
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # JSON may write "\ud800" alone; no tokenizer can encode it, and the box would stop
        return ["a string holds a lone UTF-16 surrogate (such as \\ud800), which is no character"]
    if kind == "cpt":
        return _text(record, "text")
    if kind == "sft":
        problems = _messages(record.get("messages"), "messages", needs_assistant=True)
        return problems + _tools(record.get("tools"))
    if kind not in ("dpo", "kto", "grpo", "eval"):
        raise ValueError(f"unknown phase kind {kind!r}")
    problems = _prompt(record)
    if kind == "eval":
        return problems + _eval_answer(record)
    if kind == "dpo":
        problems += _text(record, "chosen") + _text(record, "rejected")
        if not problems and record["chosen"] == record["rejected"]:  # no margin to learn: a constant loss
            problems.append("chosen and rejected are the same text")
    if kind == "kto":
        problems += _text(record, "completion")
        if not isinstance(record.get("label"), bool):
            problems.append(f"label: true or false, got {record.get('label')!r}" if "label" in record
                            else "missing label (true or false)")
    return problems


def _prompt(record: dict) -> list[str]:
    if "prompt" not in record:
        return ["missing prompt"]
    if isinstance(record["prompt"], str):
        return [] if record["prompt"] else ["prompt: empty"]
    return _messages(record["prompt"], "prompt", needs_assistant=False)


def _eval_answer(record: dict) -> list[str]:
    """An eval record's tools, expected answer (a text, or a call of one of its tools) and reference."""
    problems = tool_spec_problems(record.get("tools"))
    expected = record.get("expected")
    if isinstance(expected, dict):
        problems += [] if problems else call_problems(expected, record.get("tools"))
    elif expected is not None and (not isinstance(expected, str) or not expected):
        problems.append(f"expected: a text or a tool call {{\"name\", \"arguments\"}}, got "
                        f"{'an empty text' if expected == '' else type(expected).__name__}")
    if record.get("reference") is not None and not isinstance(record["reference"], str):
        problems.append(f"reference: a text, got {type(record['reference']).__name__}")
    if expected is None and record.get("reference") is None and not record.get("tools"):
        problems.append("missing expected (the answer to score against), reference or tools (to check a call of)")
    return problems


def _text(record: dict, key: str) -> list[str]:
    if key not in record:
        return [f"missing {key}"]
    if not isinstance(record[key], str):
        return [f"{key}: a string, got {type(record[key]).__name__}"]
    return [] if record[key] else [f"{key}: empty"]


def _messages(messages, where: str, *, needs_assistant: bool) -> list[str]:
    if messages is None:
        return [f"missing {where}"]
    if not isinstance(messages, list) or not messages:
        return [f"{where}: a non-empty list of messages (or a string)" if where == "prompt"
                else f"{where}: a non-empty list of messages"]
    problems = []
    for i, message in enumerate(messages):
        problems += _message(message, f"{where}[{i}]")
    if needs_assistant and not problems and not any(m["role"] == "assistant" for m in messages):
        problems.append(f"{where}: no assistant message, so nothing to train on")
    return problems


def _message(message, where: str) -> list[str]:
    if not isinstance(message, dict):
        return [f"{where}: a message object, got {type(message).__name__}"]
    role = message.get("role")
    if role not in ROLES:
        return [f"{where}.role: one of {', '.join(ROLES)}, got {role!r}"]
    content, calls = message.get("content"), message.get("tool_calls")
    problems = [] if content is None or isinstance(content, str) else _parts(content, f"{where}.content")
    if calls is not None and role != "assistant":
        problems.append(f"{where}.tool_calls: only an assistant message calls tools")
    elif calls is not None:
        if not isinstance(calls, list) or not calls:
            problems.append(f"{where}.tool_calls: a non-empty list")
        else:
            for j, call in enumerate(calls):
                problems += _tool_call(call, f"{where}.tool_calls[{j}]")
    if content is None and not (role == "assistant" and calls):
        problems.append(f"{where}.content: missing (only an assistant message with tool_calls may leave it out)")
    return problems


def _parts(content, where: str) -> list[str]:
    """Problems of a content given as parts (OpenAI's [{"type": "text", "text": ...}]): text parts only."""
    if not isinstance(content, list):
        return [f"{where}: a string or a list of text parts, got {type(content).__name__}"]
    problems = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            continue
        if isinstance(kind, str) and kind != "text":
            problems.append(f"{where}[{j}]: a {kind[:40]!r} part; only text parts are trained on (the model reads "
                            "text)")
        else:
            problems.append(f"{where}[{j}]: a text part {{\"type\": \"text\", \"text\": \"...\"}}")
    return problems


def _text_of(content) -> str:
    """A content as one string: its text parts joined as chat templates join them (nothing between)."""
    if isinstance(content, list):
        return "".join(part["text"] for part in content)
    return content or ""


def _tool_call(call, where: str) -> list[str]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return [f"{where}: {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}"]
    problems = []
    if call.get("type", "function") != "function":
        problems.append(f"{where}.type: 'function', got {call.get('type')!r}")
    if not isinstance(function.get("name"), str) or not function["name"]:
        problems.append(f"{where}.function.name: the tool's name")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as exc:
            return problems + [f"{where}.function.arguments: not JSON ({exc})"]
    if not isinstance(arguments, dict):
        problems.append(f"{where}.function.arguments: a JSON object, got {type(arguments).__name__}")
    return problems


def _tools(tools) -> list[str]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        return ["tools: a list of tool definitions"]
    return [f"tools[{i}]: {{\"type\": \"function\", \"function\": {{\"name\", ...}}}}" for i, tool in enumerate(tools)
            if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict)
            or not isinstance(tool["function"].get("name"), str)]


def parse_record(raw: bytes, max_bytes: int = MAX_RECORD_BYTES):
    """One JSONL line's value, within bounds: RecordUnreadable (a ValueError) in words when it is longer than
    `max_bytes`, not UTF-8, not JSON, or nested deeper than MAX_RECORD_DEPTH (docs/training.md,
    "training/records.py")."""
    if len(raw) > max_bytes:
        raise RecordUnreadable(f"longer than {max_bytes:,} bytes: not read")
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise RecordUnreadable("not UTF-8 text") from None
    except RecursionError:  # json's decoder gives up near the interpreter's recursion limit
        raise RecordUnreadable(f"nested deeper than {MAX_RECORD_DEPTH} levels") from None
    except ValueError as exc:
        raise RecordUnreadable(f"not JSON ({exc})") from None
    if nested_deeper_than(value, MAX_RECORD_DEPTH):  # the checks after this one recurse, within the bound
        raise RecordUnreadable(f"nested deeper than {MAX_RECORD_DEPTH} levels")
    return value


def nested_deeper_than(value, levels: int) -> bool:
    """Whether a parsed JSON or YAML value holds mappings and lists more than `levels` inside one another, measured
    without recursion (a deep value is what would exhaust it)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > levels:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def read_records(path, kind: str, max_bytes: int = MAX_RECORD_BYTES) -> list[dict]:
    """Every record of a phase's JSONL file; the first unusable line raises ValueError with its line number."""
    records = []
    # Lines end at "\n" alone, as the launch check splits them: a "\r" inside a line (JSON whitespace) is no end.
    with open(path, "rb") as f:
        for number, line in enumerate(iter(lambda: f.readline(max_bytes + 1), b""), 1):
            if not line.strip():
                continue
            try:
                record = parse_record(line, max_bytes)
            except RecordUnreadable as exc:
                raise RecordUnreadable(f"{path}:{number}: {exc}") from None
            problems = record_problems(kind, record)
            if problems:
                raise ValueError(f"{path}:{number}: {'; '.join(problems)}")
            records.append(record)
    if not records:
        raise ValueError(f"{path}: no records")
    return records


# -- rendering ---------------------------------------------------------------------------------------------------

def encode(tokenizer, text) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def openai_messages(messages: list[dict]) -> list[dict]:
    """Messages as chat templates read them: a tool call's arguments as an object (OpenAI sends a JSON string;
    Qwen's templates iterate the object, others write it with tojson), content a string, never missing (Qwen3's
    template would drop a list of parts)."""
    out = []
    for message in messages:
        message = {**message, "content": _text_of(message.get("content"))}
        if message.get("tool_calls"):
            message["tool_calls"] = [_call_with_object_arguments(call) for call in message["tool_calls"]]
        out.append(message)
    return out


def _call_with_object_arguments(call: dict) -> dict:
    function = dict(call["function"])
    if isinstance(function.get("arguments"), str):
        function["arguments"] = json.loads(function["arguments"])
    function.setdefault("arguments", {})
    return {**call, "type": call.get("type", "function"), "function": function}


def _plain_turn(message) -> tuple[str, str]:
    """A turn without a chat template, as (its header, its body)."""
    body = message.get("content") or ""
    body += "".join(f"\n<tool_call>{json.dumps(call, sort_keys=True)}</tool_call>"
                    for call in message.get("tool_calls") or [])
    return f"<|{message['role']}|>\n", f"{body}\n"


def _template(tokenizer, messages, tools, generation_prompt=False) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=generation_prompt)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def render_chat(tokenizer, messages, tools=None) -> tuple[list[int], list[int]]:
    """(ids, labels) of a conversation; labels are IGNORE everywhere but the assistant's own tokens (docs/training.md,
    "training/records.py")."""
    messages = openai_messages(messages)
    if not getattr(tokenizer, "chat_template", None):
        return _render_plain(tokenizer, messages)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    if _GENERATION_MARK.search(template):
        out = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        ids = list(out["input_ids"])
        return ids, [t if m else IGNORE for t, m in zip(ids, out["assistant_masks"], strict=True)]
    full = _template(tokenizer, messages, tools)
    labels = [IGNORE] * len(full)
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            start, end = _assistant_span(tokenizer, messages, tools, i, full)
            labels[start:end] = full[start:end]
    return full, labels


def _assistant_span(tokenizer, messages, tools, i, full) -> tuple[int, int]:
    start = _common(full, _opening(tokenizer, messages, tools, i))
    through = _template(tokenizer, messages[: i + 1], tools)
    apart = _common(full, through)
    end = apart if apart == len(through) else _realigned_end(full, through, apart)
    if end is None or end <= start:
        raise ValueError(f"messages[{i}]: the chat template renders this assistant turn differently inside the "
                         "conversation than at its end, so its tokens cannot be told apart (a template with "
                         "{% generation %} marks can say which they are)")
    return start, end


def _opening(tokenizer, messages, tools, i) -> list[int]:
    """What the template renders before assistant turn i, its header included: the conversation before it with the
    generation prompt (docs/training.md, "training/records.py")."""
    if i:
        return _template(tokenizer, messages[:i], tools, generation_prompt=True)
    try:
        return _template(tokenizer, [], tools, generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template's own error (jinja's, an index into no messages)
        return _template(tokenizer, [{"role": "assistant", "content": ""}], tools)


def _realigned_end(full, through, apart) -> int | None:
    """Where a turn ends in the whole conversation when the template renders it, as the conversation's last, with a
    few tokens more after the point where the two part (Qwen3: an empty reasoning block after the header): the
    rest of it lines up again once those are skipped."""
    for extra in range(1, min(_MAX_LAST_TURN_EXTRA, len(through) - apart - 1) + 1):  # something must be left
        tail = through[apart + extra:]
        if full[apart:apart + len(tail)] == tail:
            return apart + len(tail)
    return None


def _render_plain(tokenizer, messages) -> tuple[list[int], list[int]]:
    ids, labels = [], []
    for message in messages:
        header, body = _plain_turn(message)
        if message["role"] == "assistant":
            head, own = encode(tokenizer, header), encode(tokenizer, body) + [tokenizer.eos_token_id]
            ids += head + own
            labels += [IGNORE] * len(head) + own
        else:
            turn = encode(tokenizer, header + body)
            ids += turn
            labels += [IGNORE] * len(turn)
    return ids, labels


def render_prompt(tokenizer, prompt) -> list[int]:
    """Token ids of a prompt (a string, or chat messages ending where the assistant is to answer)."""
    if isinstance(prompt, str):
        return encode(tokenizer, prompt)
    prompt = openai_messages(prompt)
    if getattr(tokenizer, "chat_template", None):
        return _template(tokenizer, prompt, None, generation_prompt=True)
    return encode(tokenizer, "".join("".join(_plain_turn(m)) for m in prompt) + "<|assistant|>\n")


def render_record(kind: str, record: dict, tokenizer) -> tuple[list[int], list[int]]:
    """One record as the trainer sees it, in one sequence: (ids, labels), labels IGNORE where nothing is trained
    (a dpo record shows its chosen answer; a grpo prompt trains on what the model generates, so nothing of it)."""
    eos = tokenizer.eos_token_id
    if kind == "cpt":
        ids = encode(tokenizer, record["text"]) + [eos]
        return ids, list(ids)
    if kind == "sft":
        return render_chat(tokenizer, record["messages"], record.get("tools"))
    prompt = render_prompt(tokenizer, record["prompt"])
    if kind == "grpo":
        return prompt, [IGNORE] * len(prompt)
    answer = encode(tokenizer, record["chosen" if kind == "dpo" else "completion"]) + [eos]
    return prompt + answer, [IGNORE] * len(prompt) + answer


def trained_segments(tokenizer, ids: list[int], labels: list[int]) -> list[tuple[str, bool]]:
    """The rendered text in runs of trained and untrained tokens, special tokens written out."""
    segments: list[tuple[str, bool]] = []
    run: list[int] = []
    for i, token in enumerate(ids):
        trained = labels[i] != IGNORE
        if run and (labels[i - 1] != IGNORE) != trained:
            segments.append((tokenizer.decode(run, skip_special_tokens=False), not trained))
            run = []
        run.append(token)
    if run:
        segments.append((tokenizer.decode(run, skip_special_tokens=False), labels[-1] != IGNORE))
    return segments
