"""Attempt markers beside a table: written before Spark starts, read back by the driver and the caller."""

from __future__ import annotations

import json
import os

import pytest

from airflow_eo.attempt import Attempt, Secrets
from airflow_eo.driver.main import run_recorded_attempt
from airflow_eo.core.planning import BatchPlan
from airflow_eo.core.offsets import OffsetRange, RunIdentity
from airflow_eo.table.staging import ATTEMPTS_DIR, AttemptMarker, StagingArea, attempt_dir_name, new_attempt_id
from airflow_eo.table.storage import TableLocation
from tests.conftest import build_config

PLAN = BatchPlan("orders_raw", 7, (OffsetRange("orders", 0, 10, 20),), RunIdentity("dag/run/ingest/-1"),
                 planned_at="2026-11-24T00:00:00+00:00", attempt_id="3f2a9c0d1e6b4a52")


def attempt(table_uri: str) -> Attempt:
    config = build_config(table_uri, "orders", {"bootstrap.servers": "b:9092", "sasl.password": "s3cr3t"},
                          ingest_id="orders_raw", max_records_per_run=500)
    return config.attempt(PLAN)


def test_an_attempt_directory_is_named_by_its_batch_and_attempt_id():
    assert attempt_dir_name(PLAN) == "b00000007-3f2a9c0d1e6b4a52"
    ids = {new_attempt_id() for _ in range(100)}
    assert len(ids) == 100 and all(len(i) == 16 and int(i, 16) >= 0 for i in ids)


def test_the_marker_records_the_attempt_before_spark_and_the_driver_reads_it_back(tmp_path):
    uri = str(tmp_path / "t")
    staging = StagingArea(TableLocation.of(uri))
    recorded = attempt(uri)
    assert staging.begin_attempt(recorded) == f"{uri}/b00000007-3f2a9c0d1e6b4a52"
    marker = staging.read_marker(PLAN.attempt_id)
    assert (marker.batch, marker.run_key, marker.ingest_id, marker.kind) == (7, PLAN.run.run_key, "orders_raw", "ingest")
    assert marker.pid == os.getpid() and marker.ended_at is None and not marker.committed
    assert staging.read_attempt(PLAN.attempt_id) == recorded
    assert "s3cr3t" not in (tmp_path / "t" / ATTEMPTS_DIR / f"{PLAN.attempt_id}.json").read_text()


def test_driver_error_and_end_are_recorded_and_a_commit_is_never_unrecorded(tmp_path):
    staging = StagingArea(TableLocation.of(str(tmp_path / "t")))
    staging.begin_attempt(attempt(str(tmp_path / "t")))
    staging.driver_started(PLAN.attempt_id)
    staging.record_error(PLAN.attempt_id, "DataLossError: offsets 0..9 of orders[0] were deleted")
    marker = staging.read_marker(PLAN.attempt_id)
    assert marker.driver_pid == os.getpid() and marker.error.startswith("DataLossError")
    staging.end_attempt(PLAN.attempt_id, committed=True)
    ended = staging.read_marker(PLAN.attempt_id)
    assert ended.committed and ended.ended_at is not None
    staging.end_attempt(PLAN.attempt_id, committed=False)  # a later "not committed" does not undo it
    assert staging.read_marker(PLAN.attempt_id) == ended
    assert [m.attempt_id for m in staging.markers()] == [PLAN.attempt_id]


def test_markers_of_unknown_attempts_are_no_ops_and_torn_ones_are_ignored(tmp_path):
    staging = StagingArea(TableLocation.of(str(tmp_path / "t")))
    staging.driver_started("nope")
    staging.record_error("nope", "x")
    staging.end_attempt("nope")
    assert staging.read_marker("nope") is None and staging.markers() == []
    (tmp_path / "t" / ATTEMPTS_DIR).mkdir(parents=True)
    (tmp_path / "t" / ATTEMPTS_DIR / "torn.json").write_text('{"attempt_id": "torn", "bat')
    assert AttemptMarker.from_json('{"attempt_id": "torn", "bat') is None
    assert staging.markers() == []


def test_a_marker_from_an_older_version_reads_with_defaults():
    old = {"attempt_id": "a", "batch": 3, "run_key": "r", "started_at": 1.0, "ended_at": None,
           "committed": False, "host": "h", "pid": 12, "attempt": "", "unknown_later_field": 1}
    marker = AttemptMarker.from_json(json.dumps(old))
    assert (marker.batch, marker.ingest_id, marker.kind, marker.driver_pid) == (3, "", "", 0)


def test_the_driver_refuses_an_attempt_nobody_recorded_before_starting_spark(tmp_path):
    with pytest.raises(FileNotFoundError, match="attempt 0123 has no marker.*airflow-eo ingest"):
        run_recorded_attempt(None, str(tmp_path / "t"), "0123", Secrets({"bootstrap.servers": "b:9092"}))
