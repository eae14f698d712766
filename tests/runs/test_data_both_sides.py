"""A data file the launch accepts is one the box can train on, and one it refuses is refused with the line: the
launch check and the box's reader judge every line alike (before hours of earlier phases are paid for)."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from runs import datasets
from runs.launch import example_recipe, launch
from runs.models import DataSet
from training import data as box_data
from training.records import ByteTokenizer, read_records

pytestmark = pytest.mark.django_db
BYTES = datasets.Tokenizer(ByteTokenizer(260), "bytes (vocabulary 260)")
SFT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


def _file(tmp_path, raw: bytes):
    path = tmp_path / "d.jsonl"
    path.write_bytes(raw)
    return path


def test_a_carriage_return_inside_a_line_is_judged_alike_on_both_sides(tmp_path):
    path = _file(tmp_path, b'{"text": "a",\r "x": 1}\n{"text": "b"}\r\n')  # \r is JSON whitespace
    assert datasets.check_file(path, "cpt", BYTES).errors == []
    assert [r["text"] for r in read_records(path, "cpt")] == ["a", "b"]


@pytest.mark.parametrize("kind, record", [
    ("dpo", {"prompt": "p", "chosen": "a", "rejected": "\ud800"}),  # rejected is not in the rendered sample
    ("cpt", {"text": "\ud800"}),
])
def test_a_lone_surrogate_the_box_cannot_encode_is_refused_at_launch_on_any_line(tmp_path, kind, record):
    good = {"dpo": {"prompt": "p", "chosen": "a", "rejected": "b"}, "cpt": {"text": "ok"}}[kind]
    raw = "".join(json.dumps(good) + "\n" for _ in range(250)) + json.dumps(record) + "\n"
    path = _file(tmp_path, raw.encode())
    # The box's reader refuses it when its phase starts, naming the line; the launch refuses it before any rent.
    with pytest.raises(ValueError, match="d.jsonl:251: a string holds a lone UTF-16 surrogate"):
        box_data.load_phase_data(kind, path, ByteTokenizer(260), 64)
    (error,) = datasets.check_file(path, kind, BYTES).errors
    assert "line 251" in error and "lone UTF-16 surrogate" in error


def test_a_tool_definition_whose_function_is_a_string_is_a_line_error(tmp_path):
    path = _file(tmp_path, (json.dumps({**SFT, "tools": [{"type": "function", "function": "add"}]}) + "\n").encode())
    (error,) = datasets.check_file(path, "sft", BYTES).errors
    assert "line 1" in error and "tools[0]" in error


def test_a_nul_in_a_sampled_record_is_stored_and_its_sample_shown(tmp_path):
    recipe = example_recipe()
    recipe["phases"] = [dict(next(p for p in recipe["phases"] if p["kind"] == "cpt"), data="c.jsonl")]
    upload = SimpleUploadedFile("c.jsonl", (json.dumps({"text": "a\u0000b"}) + "\n").encode())
    launch(name="nul", recipe=recipe, bucket=str(tmp_path / "b"), budget_usd=5, max_restarts=1,
           uploads={"c.jsonl": upload})
    stored = DataSet.objects.get()
    assert "\x00" not in json.dumps(stored.report) and stored.rows == 1


@pytest.mark.parametrize("uri", ["s3://bucket/train#v2.jsonl", "s3://bucket/train.jsonl?versionId=1", "s3://bucket"])
def test_an_s3_key_that_cannot_be_read_as_named_is_refused(tmp_path, uri):
    with pytest.raises(datasets.DataError, match="is not an s3://bucket/key this can read as named"):
        datasets._fetched(uri, {}, tmp_path / "d.jsonl", "cpt", None, str(tmp_path / "b"))
