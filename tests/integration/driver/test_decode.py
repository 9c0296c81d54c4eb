"""Decoding and dead letters: undecodable records go to their own table, once, and a threshold
stops a bad run."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from airflow_eo.spec import Transform
from airflow_eo.sinks.dead_letters import DeadLetterSink
from airflow_eo.core.errors import CommitConflictError, DeadLetterThresholdError
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.loop.config import IngestConfig
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.table.commit import ALREADY_COMMITTED, COMMITTED
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.app_ids import dlq_app_id
from tests.helpers import new_topic, read_table

INGEST_ID = "orders_json"
GOOD = [json.dumps({"id": i, "name": f"n{i}"}).encode() for i in range(6)]
BAD = {
    b"{not json": "does not match value_schema",
    json.dumps({"id": "abc", "name": "x"}).encode(): "does not match value_schema",
    b"123": "not a JSON object",
    json.dumps({"id": 7, "name": "x" * 200}).encode(): "exceeds max_value_bytes=64",
    None: "value is null",
}


@pytest.fixture
def mixed_topic(kafka_config) -> str:
    topic = new_topic(kafka_config, 1)
    producer = Producer(kafka_config)
    for value in [*GOOD[:3], *BAD, *GOOD[3:]]:
        producer.produce(topic, key=b"k", value=value, partition=0)
    producer.flush(30)
    return topic


@pytest.fixture
def config(mixed_topic, kafka_config, tmp_path) -> IngestConfig:
    return IngestConfig(
        table_uri=str(tmp_path / "orders"), ingest_id=INGEST_ID, topics=[mixed_topic], kafka_config=kafka_config,
        transform=Transform(sql="SELECT topic, partition, offset, data.id AS id, data.name AS name FROM source"),
        value_schema="id INT, name STRING", max_value_bytes=64, dead_letter_table_uri=str(tmp_path / "orders_dlq"),
    )


def run(config, spark_path, run_key="r1"):
    return Ingestion(config, spark_path.submitter()).run(RunIdentity(run_key=run_key))


def dead_letters(config) -> list[tuple]:
    t = read_table(config.spec.dead_letters.table_uri, ["offset", "value", "reason", "batch"])
    return sorted(zip(t["offset"].to_pylist(), t["value"].to_pylist(), t["reason"].to_pylist(), t["batch"].to_pylist()),
                  key=lambda r: r[0])


def test_undecodable_records_go_to_the_dead_letter_table(config, spark_path):
    orphan = os.path.join(config.spec.dead_letters.table_uri, "b00000009-0123456789abcdef")
    os.makedirs(orphan)  # staged by an attempt that died long ago
    open(os.path.join(orphan, "part-0.parquet"), "wb").close()
    result = run(dataclasses.replace(config, staging_grace_seconds=0), spark_path)
    assert not os.path.exists(orphan)
    assert result.status == COMMITTED
    table = read_table(config.table_uri, ["offset", "id", "name"])
    assert sorted(table["id"].to_pylist()) == list(range(6))
    letters = dead_letters(config)
    assert [r[0] for r in letters] == [3, 4, 5, 6, 7]  # offsets of the bad records
    for (_, value, reason, batch), (raw, why) in zip(letters, BAD.items()):
        assert value == raw and why in reason and batch == 1
    assert DeltaTable(config.spec.dead_letters.table_uri).transaction_version(dlq_app_id(INGEST_ID)) == 1


def test_a_crash_between_the_main_and_the_dead_letter_commit_is_rolled_forward_once(config, spark_path, monkeypatch):
    def die(*args, **kwargs):
        raise RuntimeError("driver died between the main commit and the dead-letter commit")

    monkeypatch.setattr(DeadLetterSink, "follow", staticmethod(die))  # the crash point, not the code under test
    monkeypatch.setattr(Ingestion, "complete_dead_letters", lambda self, ledger: None)  # the worker died too
    assert run(config, spark_path).status == COMMITTED  # the job failed after the main commit landed
    assert read_table(config.table_uri, ["offset"]).num_rows == 6  # the main commit landed
    assert dead_letters(config) == []  # its dead letters did not (yet)
    monkeypatch.undo()

    again = run(config, spark_path)  # the retry: same run key, nothing re-read, dead letters rolled forward
    assert again.status == ALREADY_COMMITTED and not again.spark_started
    assert [r[0] for r in dead_letters(config)] == [3, 4, 5, 6, 7]
    version = DeltaTable(config.spec.dead_letters.table_uri).version()
    assert run(config, spark_path, "r-next").status == "nothing_new"
    assert DeltaTable(config.spec.dead_letters.table_uri).version() == version  # never twice
    assert read_table(config.table_uri, ["offset"]).num_rows == 6


def test_racing_runs_with_different_plans_keep_only_the_winners_dead_letters(config, spark_path):
    small = Ingestion(dataclasses.replace(config, max_records_per_run=5), spark_path.submitter())
    large = Ingestion(config, spark_path.submitter())
    plan_a, plan_b = small.plan(RunIdentity("run-a")), large.plan(RunIdentity("run-b"))
    assert plan_a.batch == plan_b.batch == 1 and plan_a.ends != plan_b.ends
    small.plans.record(plan_a)
    large.plans.record(plan_b)

    assert small.execute(plan_a).status == COMMITTED  # offsets 0-4: dead letters at 3, 4
    with pytest.raises(CommitConflictError):
        large.execute(plan_b)  # planned from the same starts: loses the compare-and-set
    assert [r[0] for r in dead_letters(config)] == [3, 4]  # the loser left the dead letters alone
    assert sorted(read_table(config.table_uri, ["id"])["id"].to_pylist()) == [0, 1, 2]

    follow = run(config, spark_path, "run-c")  # the next run takes the rest, and its dead letters
    assert follow.status == COMMITTED and follow.batch == 2
    assert [r[0] for r in dead_letters(config)] == [3, 4, 5, 6, 7]
    assert [r[3] for r in dead_letters(config)] == [1, 1, 2, 2, 2]
    assert sorted(read_table(config.table_uri, ["id"])["id"].to_pylist()) == list(range(6))


def test_too_many_dead_letters_fail_the_run_and_commit_nothing(config, spark_path):
    strict = dataclasses.replace(config, max_dead_letters=2)
    with pytest.raises(DeadLetterThresholdError, match="5 of 11 records could not be decoded"):
        run(strict, spark_path)
    assert not Ledger.open(config.table_uri).exists
    assert not Ledger.open(config.spec.dead_letters.table_uri).exists
    fraction = dataclasses.replace(config, max_dead_letter_fraction=0.5)  # 5/11 < 0.5: passes
    assert run(fraction, spark_path, "r2").status == COMMITTED
