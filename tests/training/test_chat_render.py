"""Tool-calling conversations in OpenAI's messages format, rendered with a model's own chat template: the loss is on
the assistant's tokens only, its tool calls included. The tokenizer is built here (a word-level vocabulary, no
download) with a template shaped like Qwen3's: tools in the system turn, tool calls as <tool_call> JSON, tool results
as user turns, and an empty reasoning block opening the conversation's last assistant turn only."""

import json
import re

import pytest

from training.records import ByteTokenizer, record_problems, render_chat, render_record, trained_segments

SPECIALS = ["<pad>", "<eos>", "<unk>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
            "<tool_response>", "</tool_response>", "<think>", "</think>", "<tools>", "</tools>"]
WORDS = ("system user assistant tool you can call tools what is 41 plus 31 72 add a b name arguments type function "
         "integer description two integers the answer parameters object").split()
PUNCTUATION = list('{}[]":,.?\n ')
# Qwen3's template, cut down to what this test exercises (its tool-call and reasoning rules kept as they are).
NL = "{{ '\\n' }}"  # a newline right after a block tag would be trimmed (transformers renders with trim_blocks)
QWEN3_LIKE = (
    "{% if tools %}<|im_start|>system\n{{ messages[0].content if messages[0].role == 'system' else '' }}"
    "<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>" + NL +
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>" + NL +
    "{% endif %}{% for m in messages %}"
    "{% if m.role == 'user' %}<|im_start|>user\n{{ m.content }}<|im_end|>" + NL +
    "{% elif m.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if loop.last %}<think>\n\n</think>\n\n{% endif %}{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>" + NL +
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>" + NL +
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# The same, with the assistant's own tokens marked for transformers (return_assistant_tokens_mask).
MARKED = (QWEN3_LIKE.replace("{% if loop.last %}", "{% generation %}{% if loop.last %}")
          .replace("</tool_call>{% endfor %}<|im_end|>", "</tool_call>{% endfor %}<|im_end|>{% endgeneration %}"))
TOOLS = [{"type": "function", "function": {"name": "add", "description": "add two integers",
                                           "parameters": {"type": "object"}}}]
CONVERSATION = [
    {"role": "system", "content": "you can call tools"},
    {"role": "user", "content": "what is 41 plus 31 ?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "add", "arguments": json.dumps({"a": 41, "b": 31})}}]},  # OpenAI's: a JSON string
    {"role": "tool", "tool_call_id": "call_1", "content": "72"},
    {"role": "assistant", "content": "the answer is 72 ."},
]


def tiny_tokenizer(template):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS + PUNCTUATION)}
    split = "|".join(re.escape(t) for t in SPECIALS) + r"|[{}\[\]\":,.?\n ]"
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(split), "isolated")
    backend.decoder = decoders.Fuse()  # tokens written back as they were, without spaces between
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>",
                                        unk_token="<unk>")
    tokenizer.chat_template = template
    return tokenizer


def trained_text(tokenizer, ids, labels):
    return [text for text, trained in trained_segments(tokenizer, ids, labels) if trained]


# Turn by turn, a turn ends where the template ends it (after the newline that follows <|im_end|>); a marked template
# says so itself.
@pytest.mark.parametrize("template, end", [(QWEN3_LIKE, "<|im_end|>\n"), (MARKED, "<|im_end|>")],
                         ids=["turn-by-turn", "generation-marks"])
def test_the_loss_is_on_the_assistants_tokens_tool_calls_included(template, end):
    tokenizer = tiny_tokenizer(template)
    ids, labels = render_chat(tokenizer, CONVERSATION, TOOLS)
    assert "<unk>" not in tokenizer.decode(ids, skip_special_tokens=False)
    assert ids == list(tokenizer.apply_chat_template(
        [{**m, "content": m["content"] or ""} for m in CONVERSATION[:2]] + [
            {**CONVERSATION[2], "content": "", "tool_calls": [{**CONVERSATION[2]["tool_calls"][0], "function": {
                "name": "add", "arguments": {"a": 41, "b": 31}}}]}] + CONVERSATION[3:],
        tools=TOOLS, tokenize=True)["input_ids"])  # the conversation rendered once, whole, arguments as an object
    assert trained_text(tokenizer, ids, labels) == [
        '<tool_call>\n{"name": "add", "arguments": {"a": 41, "b": 31}}\n</tool_call>' + end,
        "<think>\n\n</think>\n\nthe answer is 72 ." + end,
    ]
    untrained = "".join(text for text, trained in trained_segments(tokenizer, ids, labels) if not trained)
    assert "<tools>" in untrained and "what is 41 plus 31 ?" in untrained and "<tool_response>\n72" in untrained
    assert untrained.count("<|im_start|>assistant\n") == 2  # the headers the template opens a turn with


def test_a_template_that_hides_where_a_turn_ends_is_said_with_the_message():
    # A last turn rendered with far more than a few extra tokens cannot be lined up with the same turn inside.
    odd = QWEN3_LIKE.replace("<think>\n\n</think>\n\n", "<think>\n\n</think>\n\n" + "you can call tools " * 40)
    with pytest.raises(ValueError, match=r"messages\[2\]: the chat template renders this assistant turn"):
        render_chat(tiny_tokenizer(odd), CONVERSATION, TOOLS)


def test_without_a_template_the_turn_header_is_prompt_and_the_tool_call_is_trained():
    tokenizer = ByteTokenizer(260)
    ids, labels = render_chat(tokenizer, CONVERSATION, TOOLS)
    trained = trained_text(tokenizer, ids, labels)
    assert trained[0].startswith('\n<tool_call>{"function": {"arguments": {"a": 41, "b": 31}, "name": "add"}')
    assert trained[1] == "the answer is 72 .\n<eos>"
    assert all("<|assistant|>" not in text for text in trained)


def test_prompts_end_where_the_assistant_answers():
    tokenizer = tiny_tokenizer(QWEN3_LIKE)
    ids, labels = render_record("dpo", {"prompt": CONVERSATION[:2], "chosen": "72", "rejected": "71"}, tokenizer)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n72<eos>")
    assert trained_text(tokenizer, ids, labels) == ["72<eos>"]


def test_a_conversation_opening_with_the_assistant_trains_neither_the_tools_block_nor_the_header():
    tokenizer = tiny_tokenizer(QWEN3_LIKE)
    ids, labels = render_chat(tokenizer, [{"role": "assistant", "content": "the answer is 72 ."}], TOOLS)
    trained = "".join(trained_text(tokenizer, ids, labels))
    assert "the answer is 72 ." in trained
    assert "<tools>" not in trained and "<|im_start|>" not in trained


def test_a_preference_pair_of_one_text_twice_is_refused():
    assert record_problems("dpo", {"prompt": "p", "chosen": "a", "rejected": "a"}) == [
        "chosen and rejected are the same text"]


def test_content_given_as_text_parts_trains_as_the_same_text():
    tokenizer = tiny_tokenizer(QWEN3_LIKE)
    parted = [dict(m) for m in CONVERSATION]
    parted[1]["content"] = [{"type": "text", "text": "what is 41 "}, {"type": "text", "text": "plus 31 ?"}]
    parted[4]["content"] = [{"type": "text", "text": "the answer is 72 ."}]
    assert record_problems("sft", {"messages": parted, "tools": TOOLS}) == []
    assert render_chat(tokenizer, parted, TOOLS) == render_chat(tokenizer, CONVERSATION, TOOLS)
    prompt = {"prompt": parted[:2], "chosen": "72", "rejected": "71"}
    assert render_record("dpo", prompt, tokenizer) == render_record("dpo", {**prompt, "prompt": CONVERSATION[:2]},
                                                                   tokenizer)


def test_a_part_the_model_cannot_read_is_said_with_its_place():
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this ?"}, image]},
                {"role": "assistant", "content": [{"type": "text"}]}]
    assert record_problems("sft", {"messages": messages}) == [
        "messages[0].content[1]: a 'image_url' part; only text parts are trained on (the model reads text)",
        'messages[1].content[0]: a text part {"type": "text", "text": "..."}']
    assert record_problems("sft", {"messages": [{"role": "user", "content": 7}, {"role": "assistant", "content": "x"}]}
                           ) == ["messages[0].content: a string or a list of text parts, got int"]
