"""Where per-step metrics go: the JSONL file the on-box agent tails and posts to the dashboard (field names in
training/metric_fields.py). Writing a line never holds a training step up."""

import json


class JsonlSink:
    def __init__(self, path):
        self.file = open(path, "a", buffering=1)

    def emit(self, record):
        self.file.write(json.dumps(record) + "\n")

    def close(self):
        self.file.close()


def open_sinks(config):
    return [JsonlSink(config["jsonl"])]
