"""The metric record is named once (training/metric_fields.py); every layer that carries it must agree."""

import json
import time

from runs import reports, run_data
from runs.api import PointIn
from runs.models import MetricPoint
from training import metric_fields
from training.agent.metrics import to_point

KEY = {metric_fields.PHASE, metric_fields.STEP, metric_fields.AT}


def test_the_api_takes_exactly_the_record_and_its_key():
    # and the router's load matrix, beside the scalar fields (it is stored apart: runs.models.RouterLoad)
    assert set(PointIn.model_fields) == KEY | set(metric_fields.NAMES) | {metric_fields.ROUTER_LOAD}


def test_the_database_stores_every_field_under_its_wire_name():
    columns = {f.name for f in MetricPoint._meta.concrete_fields} - {"id", "run", "instance"}
    assert columns == KEY | set(metric_fields.NAMES)
    assert reports.METRIC_FIELDS == list(metric_fields.NAMES)


def test_the_csv_and_the_charts_read_the_same_names():
    assert run_data.CSV_COLUMNS[:3 + len(metric_fields.NAMES)] == (metric_fields.PHASE, metric_fields.STEP,
                                                                  metric_fields.AT, *metric_fields.NAMES)
    assert set(run_data.ENVELOPED) <= set(metric_fields.NAMES)


def test_the_agent_forwards_a_trainer_record_as_one_valid_point(tmp_path):
    record = {"phase": 2, "phase_name": "dpo", "kind": "dpo", "step": 9, "steps": 10, "time": time.time() - 60,
              "routed_b_count": 96, "gpu_peak_gib": 80.0, "tokens": 4096, "signal": True,
              **{f.name: ("triton" if f.kind is str else f.kind(1)) for f in metric_fields.FIELDS},
              metric_fields.ROUTER_LOAD: [[3, 0], [1, 2]]}
    point = json.loads(json.dumps(to_point(record)))
    assert set(point) == set(PointIn.model_fields)  # nothing the dashboard stores is left unsent, nothing extra
    parsed = PointIn(**point)
    assert (parsed.phase, parsed.step, parsed.gpu_mem_gib, parsed.kernel_path) == (2, 9, 1.0, "triton")
