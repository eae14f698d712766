"""The metrics sink: the JSONL file the on-box agent tails."""

import json

from training.metrics import JsonlSink, open_sinks


def test_the_jsonl_sink_appends_one_record_a_line(tmp_path):
    sink = JsonlSink(tmp_path / "m.jsonl")
    sink.emit({"step": 1, "loss": 2.5})
    sink.emit({"step": 2, "loss": 2.0})
    sink.close()
    assert [json.loads(line)["step"] for line in open(tmp_path / "m.jsonl")] == [1, 2]


def test_a_recipe_opens_the_jsonl_sink_only(tmp_path):
    sinks = open_sinks({"jsonl": tmp_path / "m.jsonl"})
    assert [type(s) for s in sinks] == [JsonlSink]
    for sink in sinks:
        sink.close()
