"""Phase data: JSONL in, token tensors out, drawn by position so a checkpoint only remembers where it was
(docs/training.md, "training/data.py")."""

import functools
import hashlib
import json

import torch

from training.packing import cu_seq_lens, row_positions, sample_starts
from training.records import (IGNORE, ByteTokenizer, encode, load_tokenizer, read_records, render_chat,  # noqa: F401
                              render_prompt)


def _pack(samples, seq_len, pad_id):
    """Pack (ids, labels) samples into rows of seq_len tokens, each sample whole in one row, its positions restarting
    and its first token no target (docs/training.md, "training/data.py")."""
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
    return phase_items(kind, read_records(path, kind), tokenizer, seq_len)


def held_out_share(record: dict, seed: int) -> float:
    """Where a record falls in [0, 1): a hash of the run's seed and the record's canonical JSON, the same on every
    box and after every resume, whatever the file's order."""
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(f"{seed}\n{canonical}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_records(records: list[dict], share: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(training records, held-out records): those whose `held_out_share` is below `share` are held out, at least
    the lowest one, and at least one is left to train on; each keeps the file's order."""
    if len(records) < 2:
        raise ValueError(f"eval_split needs at least 2 records to hold one out and train on another, got "
                         f"{len(records)}")
    shares = [held_out_share(record, seed) for record in records]
    lowest = min(shares)
    held = [i for i, s in enumerate(shares) if s < share or s == lowest]
    if len(held) == len(records):
        raise ValueError(f"eval_split {share:g} held out all {len(records)} records: nothing is left to train on")
    taken = set(held)
    return [r for i, r in enumerate(records) if i not in taken], [records[i] for i in held]


def phase_items(kind, records, tokenizer, seq_len):
    """Checked records (training/records.py) as the phase's items: rows for cpt/sft, examples for the others."""
    eos = tokenizer.eos_token_id
    if kind == "cpt":
        samples = []
        for record in records:
            ids = encode(tokenizer, record["text"]) + [eos]
            samples.append((ids, list(ids)))
        return _pack(samples, seq_len, tokenizer.pad_token_id)
    if kind == "sft":
        samples = [render_chat(tokenizer, record["messages"], record.get("tools")) for record in records]
        return _pack(samples, seq_len, tokenizer.pad_token_id)
    if kind == "dpo":
        items = []
        for record in records:
            prompt = render_prompt(tokenizer, record["prompt"])
            pairs = [_truncate(prompt, encode(tokenizer, record[k]) + [eos], seq_len) for k in ("chosen", "rejected")]
            items.append({"chosen": pairs[0], "rejected": pairs[1]})
        return items
    if kind == "kto":
        items = []
        for record in records:
            prompt = render_prompt(tokenizer, record["prompt"])
            pair = _truncate(prompt, encode(tokenizer, record["completion"]) + [eos], seq_len)
            items.append({"pair": pair, "desirable": bool(record["label"])})
        return items
    if kind == "grpo":
        return [{"prompt_ids": render_prompt(tokenizer, r["prompt"])[-seq_len // 2:], "record": r}
                for r in records]
    raise ValueError(f"unknown phase kind {kind!r}")


@functools.lru_cache(maxsize=2)
def _epoch_order(num_items, seed, epoch):
    return torch.randperm(num_items, generator=torch.Generator().manual_seed(seed * 100003 + epoch)).tolist()


def batch_indices(num_items, batch_size, position, seed):
    """Item indices of micro-batch `position`: sample k is item perm_{k // N}[k % N], perm_e seeded by (seed, e)."""
    return [_epoch_order(num_items, seed, k // num_items)[k % num_items]
            for k in range(position * batch_size, (position + 1) * batch_size)]


# Padding to a bucket changes nothing the loss sees (the padding comes after every real token, is masked out of the
# attention and is out of the labels), only how many shapes a phase's batches take. The ladder goes 2^k, 3 * 2^(k-1):
# a row is padded to at most half again its longest pair (a fifth more on average over lengths spread evenly on a log
# scale) and a phase's batches take at most two lengths per doubling, 9 up to a seq_len of 2048; multiples of 128
# would pad less but give 16 lengths there and 64 at 8192, too many graphs to capture and hold. Rows shorter than the
# smallest bucket are host-bound, so their padding costs next to nothing.
SMALLEST_BUCKET = 128


def length_buckets(seq_len):
    """The lengths DPO/KTO rows are padded up to, rising, seq_len the last (no pair is longer: `_truncate`)."""
    buckets, size = [], SMALLEST_BUCKET
    while size < seq_len:
        buckets += [b for b in (size, size * 3 // 2) if b < seq_len]
        size *= 2
    return buckets + [seq_len]


def bucket_length(longest, seq_len):
    """The smallest bucket that holds the longest pair of a micro-batch."""
    return next((b for b in length_buckets(seq_len) if b >= longest), longest)


def pad_pairs(pairs, pad_id, seq_len=None):
    """(prompt, completion) id lists -> input_ids, attention_mask, labels (completion only), right-padded to the
    longest pair, or with seq_len to its bucket."""
    length = max(len(p) + len(c) for p, c in pairs)
    if seq_len is not None:
        length = bucket_length(length, seq_len)
    input_ids = torch.full((len(pairs), length), pad_id, dtype=torch.long)
    labels = torch.full((len(pairs), length), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(pairs), length), dtype=torch.long)
    for i, (prompt, completion) in enumerate(pairs):
        n = len(prompt) + len(completion)
        input_ids[i, :n] = torch.tensor(prompt + completion)
        labels[i, len(prompt):n] = torch.tensor(completion)
        mask[i, :n] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def boundaries_width(items, batch_size):
    """How many entries a packed micro-batch's `cu_seq_lens` needs at most over the phase, so its micro-batches have one
    shape and one CUDA graph (docs/training.md, "training/data.py")."""
    most = max(len(sample_starts(it["position_ids"])) for it in items)
    return 1 << (most * batch_size).bit_length()


def collate(kind, items, pad_id, seq_len=None, width=None):
    """A micro-batch of tensors (on the CPU) for the phase's loss; seq_len: DPO/KTO rows padded to a bucket; width:
    CPT/SFT sample boundaries padded to it (`boundaries_width`), else to the next power of two."""
    if kind in ("cpt", "sft"):
        positions = [it["position_ids"] for it in items]
        return {"input_ids": torch.tensor([it["input_ids"] for it in items]),
                "labels": torch.tensor([it["labels"] for it in items]),
                "position_ids": torch.tensor(positions), "cu_seq_lens": cu_seq_lens(positions, width)}
    if kind == "dpo":
        # Chosen rows first, then rejected rows, in one forward.
        return pad_pairs([it["chosen"] for it in items] + [it["rejected"] for it in items], pad_id, seq_len)
    if kind == "kto":
        batch = pad_pairs([it["pair"] for it in items], pad_id, seq_len)
        batch["desirable"] = torch.tensor([it["desirable"] for it in items])
        return batch
    if kind == "grpo":
        return {"prompts": [it["prompt_ids"] for it in items], "records": [it["record"] for it in items]}
    raise ValueError(f"unknown phase kind {kind!r}")
