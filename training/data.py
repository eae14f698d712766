"""Phase data: JSONL in, token tensors out.

One record per line, by phase kind:
    cpt   {"text": "..."}                                            packed into seq_len rows, loss on every token
    sft   {"messages": [{"role", "content", "tool_calls"?}], "tools"?: [...]}
                                                                     packed; loss only on assistant tokens
(packed: whole samples per row, each with its own positions, kept apart in the forward: training/packing.py)
    dpo   {"prompt": str | messages, "chosen": str, "rejected": str}
    kto   {"prompt": str | messages, "completion": str, "label": true | false}
    grpo  {"prompt": str | messages, ...anything the reward function reads (e.g. "answer")}

Batches are drawn by position: micro-batch p holds samples p*B .. p*B+B-1 of an endless sequence of seeded
permutations, so a checkpoint only has to remember p.
"""

import functools
import json

import torch

from training.packing import row_positions

IGNORE = -100


class ByteTokenizer:
    """For models built from a config with random weights (tests, benchmarks): bytes shifted past 3 specials."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    chat_template = None

    def __init__(self, vocab_size):
        if vocab_size < 4:
            raise ValueError("the byte tokenizer needs a vocabulary of at least 4")
        self.vocab_size = vocab_size

    def encode(self, text, add_special_tokens=False):
        return [3 + b % (self.vocab_size - 3) for b in text.encode("utf-8")]

    def decode(self, ids, skip_special_tokens=True):
        data = bytes((i - 3) % 256 for i in ids if i >= 3)
        return data.decode("utf-8", errors="replace")


def load_tokenizer(model_recipe, vocab_size):
    if "config" in model_recipe and not model_recipe.get("tokenizer"):
        return ByteTokenizer(vocab_size)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_recipe.get("tokenizer") or model_recipe["path"])
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def read_jsonl(path, required):
    records = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from exc
            missing = [key for key in required if key not in record]
            if missing:
                raise ValueError(f"{path}:{number}: missing {', '.join(missing)}")
            records.append(record)
    if not records:
        raise ValueError(f"{path}: no records")
    return records


def _encode(tokenizer, text):
    return list(tokenizer.encode(text, add_special_tokens=False))


def _simple_turn(message):
    body = message.get("content") or ""
    if message.get("tool_calls"):
        body += "".join(f"\n<tool_call>{json.dumps(call, sort_keys=True)}</tool_call>" for call in message["tool_calls"])
    return f"<|{message['role']}|>\n{body}\n"


def _template(tokenizer, messages, tools, generation_prompt=False):
    ids = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=generation_prompt)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def render_chat(tokenizer, messages, tools=None):
    """(ids, labels) of a conversation; labels are IGNORE everywhere but the assistant turns.

    With a chat template each turn's tokens are the difference between the rendering of the conversation up to and
    including it and the one before it (so template tokens around a turn count to that turn)."""
    ids, labels = [], []
    for i, message in enumerate(messages):
        if getattr(tokenizer, "chat_template", None):
            full = _template(tokenizer, messages[: i + 1], tools)
            common = 0
            while common < min(len(full), len(ids)) and full[common] == ids[common]:
                common += 1
            ids, labels = ids[:common], labels[:common]
            new = full[common:]
        else:
            new = _encode(tokenizer, _simple_turn(message))
            if message["role"] == "assistant":
                new = new + [tokenizer.eos_token_id]
        ids += new
        labels += new if message["role"] == "assistant" else [IGNORE] * len(new)
    return ids, labels


def render_prompt(tokenizer, prompt):
    """Token ids of a prompt (a string, or chat messages ending where the assistant is to answer)."""
    if isinstance(prompt, str):
        return _encode(tokenizer, prompt)
    if getattr(tokenizer, "chat_template", None):
        return _template(tokenizer, prompt, None, generation_prompt=True)
    return _encode(tokenizer, "".join(_simple_turn(m) for m in prompt) + "<|assistant|>\n")


def _pack(samples, seq_len, pad_id):
    """Pack (ids, labels) samples into rows of seq_len tokens, in order, each sample whole in one row (one longer
    than seq_len is cut into seq_len pieces, each a sample of its own); the tail of a row padded, out of the loss.
    Every row carries its positions, restarting at each sample (training/packing.py keeps the samples apart), and a
    sample's first token is no target: nothing before it in the row belongs to it."""
    pieces = [(ids[i:i + seq_len], labels[i:i + seq_len])
              for ids, labels in samples for i in range(0, len(ids), seq_len)]
    rows, current = [], []
    for piece in pieces:
        if current and sum(len(ids) for ids, _ in current) + len(piece[0]) > seq_len:
            rows.append(current)
            current = []
        current.append(piece)
    if current:
        rows.append(current)
    packed = []
    for row in rows:
        row_ids = [t for ids, _ in row for t in ids]
        row_labels = [IGNORE if i == 0 else t for _, labels in row for i, t in enumerate(labels)]
        lengths = [len(ids) for ids, _ in row]
        pad = seq_len - len(row_ids)
        if pad:
            lengths.append(pad)
        packed.append({"input_ids": row_ids + [pad_id] * pad, "labels": row_labels + [IGNORE] * pad,
                       "position_ids": row_positions(lengths)})
    return packed


def _truncate(prompt_ids, completion_ids, seq_len):
    """Keep the completion; cut the prompt from the left if the pair is longer than seq_len."""
    completion_ids = completion_ids[:seq_len - 1]
    return prompt_ids[-(seq_len - len(completion_ids)):], completion_ids


def load_phase_data(kind, path, tokenizer, seq_len):
    """The phase's items (rows for cpt/sft, examples for the others) as plain lists of token ids."""
    eos = tokenizer.eos_token_id
    if kind == "cpt":
        samples = []
        for record in read_jsonl(path, ["text"]):
            ids = _encode(tokenizer, record["text"]) + [eos]
            samples.append((ids, list(ids)))
        return _pack(samples, seq_len, tokenizer.pad_token_id)
    if kind == "sft":
        samples = [render_chat(tokenizer, record["messages"], record.get("tools"))
                   for record in read_jsonl(path, ["messages"])]
        return _pack(samples, seq_len, tokenizer.pad_token_id)
    if kind == "dpo":
        items = []
        for record in read_jsonl(path, ["prompt", "chosen", "rejected"]):
            prompt = render_prompt(tokenizer, record["prompt"])
            pairs = [_truncate(prompt, _encode(tokenizer, record[k]) + [eos], seq_len) for k in ("chosen", "rejected")]
            items.append({"chosen": pairs[0], "rejected": pairs[1]})
        return items
    if kind == "kto":
        items = []
        for record in read_jsonl(path, ["prompt", "completion", "label"]):
            prompt = render_prompt(tokenizer, record["prompt"])
            pair = _truncate(prompt, _encode(tokenizer, record["completion"]) + [eos], seq_len)
            items.append({"pair": pair, "desirable": bool(record["label"])})
        return items
    if kind == "grpo":
        return [{"prompt_ids": render_prompt(tokenizer, r["prompt"])[-seq_len // 2:], "record": r}
                for r in read_jsonl(path, ["prompt"])]
    raise ValueError(f"unknown phase kind {kind!r}")


@functools.lru_cache(maxsize=2)
def _epoch_order(num_items, seed, epoch):
    return torch.randperm(num_items, generator=torch.Generator().manual_seed(seed * 100003 + epoch)).tolist()


def batch_indices(num_items, batch_size, position, seed):
    """Item indices of micro-batch `position`: sample k is item perm_{k // N}[k % N], perm_e seeded by (seed, e)."""
    return [_epoch_order(num_items, seed, k // num_items)[k % num_items]
            for k in range(position * batch_size, (position + 1) * batch_size)]


def pad_pairs(pairs, pad_id):
    """(prompt, completion) id lists -> input_ids, attention_mask, labels (completion only), right-padded."""
    length = max(len(p) + len(c) for p, c in pairs)
    input_ids = torch.full((len(pairs), length), pad_id, dtype=torch.long)
    labels = torch.full((len(pairs), length), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(pairs), length), dtype=torch.long)
    for i, (prompt, completion) in enumerate(pairs):
        n = len(prompt) + len(completion)
        input_ids[i, :n] = torch.tensor(prompt + completion)
        labels[i, len(prompt):n] = torch.tensor(completion)
        mask[i, :n] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def collate(kind, items, pad_id):
    """A micro-batch of tensors (on the CPU) for the phase's loss."""
    if kind in ("cpt", "sft"):
        return {"input_ids": torch.tensor([it["input_ids"] for it in items]),
                "labels": torch.tensor([it["labels"] for it in items]),
                "position_ids": torch.tensor([it["position_ids"] for it in items])}
    if kind == "dpo":
        # Chosen rows first, then rejected rows, in one forward.
        return pad_pairs([it["chosen"] for it in items] + [it["rejected"] for it in items], pad_id)
    if kind == "kto":
        batch = pad_pairs([it["pair"] for it in items], pad_id)
        batch["desirable"] = torch.tensor([it["desirable"] for it in items])
        return batch
    if kind == "grpo":
        return {"prompts": [it["prompt_ids"] for it in items], "records": [it["record"] for it in items]}
    raise ValueError(f"unknown phase kind {kind!r}")
