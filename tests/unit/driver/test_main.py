"""The Spark job's entry point, up to where it would start Spark: its flags and their errors."""

from __future__ import annotations

import pytest

from airflow_eo.driver import main as driver_main


def test_without_an_attempt_or_a_standalone_ingest_the_job_stops_before_spark(capsys, monkeypatch):
    monkeypatch.setattr(driver_main, "build_session", lambda *a, **k: pytest.fail("Spark was started"))
    with pytest.raises(SystemExit) as stop:
        driver_main.main(["--table-uri", "/data/orders"])
    assert stop.value.code == 2
    assert "give --attempt-id, or --ingest-id and --topics for a standalone run" in capsys.readouterr().err


def test_the_table_is_required(capsys):
    with pytest.raises(SystemExit) as stop:
        driver_main.main(["--attempt-id", "3f2a9c0d1e6b4a52"])
    assert stop.value.code == 2 and "--table-uri" in capsys.readouterr().err


def test_a_batch_the_driver_reads_itself_starts_no_spark(tmp_path, capsys, monkeypatch):
    """A batch within driver_read_max_offsets on the direct path: the job commits it without a
    SparkContext (here one that reads nothing: its partitions have no new offsets)."""
    import json

    from airflow_eo.attempt import Attempt, Env
    from airflow_eo.core.planning import BatchPlan
    from airflow_eo.core.offsets import OffsetRange, RunIdentity, TopicPartition
    from airflow_eo.spec import IngestSpec
    from airflow_eo.table.ledger import Ledger
    from airflow_eo.table.staging import StagingArea
    from airflow_eo.table.storage import TableLocation

    uri = str(tmp_path / "orders")
    spec = IngestSpec.of(table_uri=uri, ingest_id="orders", topics="orders")
    partition = TopicPartition("orders", 0)
    plan = BatchPlan("orders", 1, (OffsetRange("orders", 0, 7, 7),), RunIdentity("r1"), new_partitions=(partition,),
                     attempt_id="3f2a9c0d1e6b4a52")
    StagingArea(TableLocation.of(uri, None)).begin_attempt(Attempt(plan, spec))
    monkeypatch.setenv(Env.KAFKA_CONFIG, json.dumps({"bootstrap.servers": "127.0.0.1:9"}))
    monkeypatch.setattr(driver_main, "build_session", lambda *a, **k: pytest.fail("Spark was started"))
    assert driver_main.main(["--table-uri", uri, "--attempt-id", plan.attempt_id]) == 0
    result = json.loads(capsys.readouterr().out.split(driver_main.RESULT_PREFIX, 1)[1])
    assert result["status"] == "committed" and result["rows"] == 0
    assert Ledger.open(uri, None).committed_offsets("orders", [partition]) == {partition: 7}


def test_a_batch_above_driver_read_max_offsets_is_not_read_without_spark(tmp_path):
    from airflow_eo.attempt import Attempt, Secrets
    from airflow_eo.core.planning import BatchPlan
    from airflow_eo.core.offsets import OffsetRange, RunIdentity
    from airflow_eo.spec import IngestSpec

    uri = str(tmp_path / "orders")
    spec = IngestSpec.of(table_uri=uri, ingest_id="orders", topics="orders", driver_read_max_offsets=10)
    plan = BatchPlan("orders", 1, (OffsetRange("orders", 0, 0, 11),), RunIdentity("r1"), attempt_id="3f2a9c0d1e6b4a52")
    with pytest.raises(ValueError, match="needs Spark .11 offsets; the driver reads a direct batch of at most 10"):
        driver_main.run_attempt(None, Attempt(plan, spec), Secrets({"bootstrap.servers": "127.0.0.1:9"}))
