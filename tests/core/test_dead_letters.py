"""Dead letters: undecodable records go to their own table, once, and a threshold stops a bad run."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from airflow_eo import job
from airflow_eo.commit import COMMITTED
from airflow_eo.dead_letters import dlq_app_id
from airflow_eo.errors import DeadLetterThresholdError
from airflow_eo.ingest import IngestConfig, Ingestion
from airflow_eo.ledger import Ledger
from airflow_eo.planning import RunIdentity
from airflow_eo.submit import InProcessSubmitter
from airflow_eo.transforms import Transform
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


def run(config, spark, run_key="r1"):
    return Ingestion(config, InProcessSubmitter(spark)).run(RunIdentity(run_key=run_key))


def dead_letters(config) -> list[tuple]:
    t = read_table(config.dead_letter_table_uri, ["offset", "value", "reason", "batch"])
    return sorted(zip(t["offset"].to_pylist(), t["value"].to_pylist(), t["reason"].to_pylist(), t["batch"].to_pylist()),
                  key=lambda r: r[0])


def test_undecodable_records_go_to_the_dead_letter_table(config, spark):
    orphan = os.path.join(config.dead_letter_table_uri, "b00000009-0123456789abcdef")
    os.makedirs(orphan)  # staged by an attempt that died long ago
    open(os.path.join(orphan, "part-0.parquet"), "wb").close()
    result = run(dataclasses.replace(config, staging_grace_seconds=0), spark)
    assert not os.path.exists(orphan)
    assert result.status == COMMITTED
    table = read_table(config.table_uri, ["offset", "id", "name"])
    assert sorted(table["id"].to_pylist()) == list(range(6))
    letters = dead_letters(config)
    assert [r[0] for r in letters] == [3, 4, 5, 6, 7]  # offsets of the bad records
    for (_, value, reason, batch), (raw, why) in zip(letters, BAD.items()):
        assert value == raw and why in reason and batch == 1
    assert DeltaTable(config.dead_letter_table_uri).transaction_version(dlq_app_id(INGEST_ID)) == 1


def test_a_retry_after_the_dead_letter_commit_writes_neither_twice(config, spark, monkeypatch):
    def die(*args, **kwargs):
        raise RuntimeError("driver died between the dead-letter commit and the main commit")

    monkeypatch.setattr(job, "commit_batch", die)  # the crash point, not the code under test
    with pytest.raises(Exception, match="ended without committing"):
        run(config, spark)
    dlq_version = DeltaTable(config.dead_letter_table_uri).version()
    assert len(dead_letters(config)) == 5 and not Ledger.open(config.table_uri).exists
    monkeypatch.undo()
    assert run(config, spark).status == COMMITTED  # same run key: replays the same plan
    assert DeltaTable(config.dead_letter_table_uri).version() == dlq_version  # skipped, not rewritten
    assert len(dead_letters(config)) == 5
    assert read_table(config.table_uri, ["offset"]).num_rows == 6


def test_too_many_dead_letters_fail_the_run_and_commit_nothing(config, spark):
    strict = dataclasses.replace(config, max_dead_letters=2)
    with pytest.raises(DeadLetterThresholdError, match="5 of 11 records could not be decoded"):
        run(strict, spark)
    assert not Ledger.open(config.table_uri).exists
    assert not Ledger.open(config.dead_letter_table_uri).exists
    fraction = dataclasses.replace(config, max_dead_letter_fraction=0.5)  # 5/11 < 0.5: passes
    assert run(fraction, spark, "r2").status == COMMITTED
