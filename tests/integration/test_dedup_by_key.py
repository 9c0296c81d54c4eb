"""Dedup by producer key through the whole loop: real broker, real Spark, real Delta — an
at-least-once producer's resends, counts that add up, dead letters, reprocess, bad input."""

from __future__ import annotations

import random
import uuid

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from airflow_eo.core.errors import ConfigError
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.loop.reprocess import Reprocessor
from airflow_eo.table.ledger import Ledger
from tests.helpers import duplicates, new_topic, read_table

KEY = "CAST(headers['event-id'] AS STRING)"
SQL = "SELECT topic, partition, offset, CAST(value AS STRING) AS body FROM source"


def produce_with_resends(config: dict, topic: str, events: int, resend_fraction: float, seed: int = 1) -> int:
    """An at-least-once producer: every event once, and a share of them sent again later (at a new
    offset, maybe another partition), as retries without idempotence do. Returns the records sent."""
    rng = random.Random(seed)
    producer = Producer({**config, "linger.ms": 5})
    sent = 0
    resends = rng.sample(range(events), int(events * resend_fraction))
    order = list(range(events)) + resends  # a resend comes after its first send
    for n, i in enumerate(order):
        partition = rng.randrange(3) if n >= events else i % 3
        producer.produce(topic, value=f"event-{i}".encode(), partition=partition,
                         headers=[("event-id", str(i).encode())])
        sent += 1
    producer.flush(30)
    return sent


def test_resent_events_land_once_with_dedup_and_once_per_offset_without(broker, kafka_config, spark_path, tmp_path, ingestion):
    from airflow_eo.spec import Transform

    topic = new_topic(kafka_config, 3)
    sent = produce_with_resends(kafka_config, topic, 300, 0.10)
    deduped, dlq, plain = str(tmp_path / "deduped"), str(tmp_path / "dlq"), str(tmp_path / "plain")
    ing = ingestion(deduped, topic, kafka_config, spark_path.submitter(), transform=Transform(sql=SQL),
                    dedup_key=KEY, duplicates_to_dead_letters=True, dead_letter_table_uri=dlq,
                    max_records_per_run=120)
    results = []
    while True:  # batches of 120 offsets: resends fall in the same batch and in later ones
        result = ing.run(RunIdentity(uuid.uuid4().hex))
        if result.status == "nothing_new":
            break
        results.append(result)
    assert len(results) == 3
    table = read_table(deduped, ["topic", "partition", "offset", "body", "_dedup_key"])
    bodies = table["body"].to_pylist()
    assert sorted(bodies) == sorted(f"event-{i}" for i in range(300))  # each event once
    assert set(table["_dedup_key"].to_pylist()) == {str(i) for i in range(300)}
    assert duplicates(table) == {}
    dropped = sum(r.duplicates for r in results)
    assert dropped == sent - 300 == 30
    assert sum(r.rows for r in results) + dropped == sent  # rows + duplicates = records read
    records = Ledger.open(deduped).batches("test", limit=None)
    assert sum(b.meta.findings.duplicates.records for b in records) == dropped
    dead = read_table(dlq, ["offset", "reason"])
    assert dead.num_rows == dropped and set(dead["reason"].to_pylist()) == {"duplicate key"}
    # without dedup, the resends are separate records: each offset once
    plain_ing = ingestion(plain, topic, kafka_config, spark_path.submitter(), transform=Transform(sql=SQL))
    assert plain_ing.run(RunIdentity("all")).rows == sent
    # reprocess of a deduplicated batch keeps its rows: its own keys are not "already in the table"
    before = read_table(deduped, ["topic", "partition", "offset"]).num_rows
    again = Reprocessor(ing).run(RunIdentity("rp"), target_run_key=results[0].run_key)
    assert again.status == "reprocessed"
    assert read_table(deduped, ["topic", "partition", "offset"]).num_rows == before


def test_dedup_horizon_in_batches_limits_the_look_back(broker, kafka_config, spark, tmp_path, ingestion):
    from airflow_eo.spec import Transform
    from airflow_eo.driver.main import InProcessSubmitter

    topic = new_topic(kafka_config, 3)
    producer = Producer(kafka_config)
    uri = str(tmp_path / "t")
    ing = ingestion(uri, topic, kafka_config, InProcessSubmitter(spark), transform=Transform(sql=SQL),
                    dedup_key=KEY, dedup_horizon="1 batches")

    def send(ids):
        for i in ids:
            producer.produce(topic, value=f"e{i}".encode(), partition=i % 3, headers=[("event-id", str(i).encode())])
        producer.flush(10)
        return ing.run(RunIdentity(uuid.uuid4().hex))

    assert send(range(10)).rows == 10
    assert send(range(5, 15)).duplicates == 5  # 5..9 are in the last batch: dropped
    third = send(range(0, 3))  # 0..2 are two batches back: beyond a horizon of one batch
    assert third.duplicates == 0 and third.rows == 3
    with pytest.raises(ConfigError, match="dedup_horizon"):
        ingestion(uri, topic, kafka_config, None, dedup_key=KEY, dedup_horizon="soon batches")


def test_bad_dedup_expression_is_one_line_and_commits_nothing(broker, kafka_config, spark, table_uri, ingestion):
    from airflow_eo.driver.main import InProcessSubmitter

    topic = new_topic(kafka_config, 1)
    Producer(kafka_config).produce(topic, value=b"x", partition=0)
    Producer(kafka_config).flush(10)
    produce_with_resends(kafka_config, topic, 3, 0.0)
    ing = ingestion(table_uri, topic, kafka_config, InProcessSubmitter(spark), dedup_key="get_json_object(value,")
    with pytest.raises(ConfigError) as err:
        ing.run(RunIdentity("bad"))
    assert "dedup_key" in str(err.value) and "\n" not in str(err.value)
    assert not DeltaTable.is_deltatable(table_uri)
    with pytest.raises(ConfigError, match="dead_letter_table_uri"):
        ingestion(table_uri, topic, kafka_config, None, dedup_key=KEY, duplicates_to_dead_letters=True)


def test_a_duration_horizon_reads_only_the_files_whose_timestamps_reach_it(broker, kafka_config, spark_path, tmp_path, ingestion):
    """Each staged file carries Delta stats of its Kafka timestamps, so a one-day horizon reads the
    keys of the recent files only; a resend of an event stored before it lands again, a resend
    of a recent one is dropped. The transform keeps ``_dedup_key`` (no join-back), and the count
    comes from the write's observed metrics on both Spark paths."""
    import time

    from airflow_eo.spec import DedupSpec
    from airflow_eo.driver.dedup import key_files
    from airflow_eo.table.storage import TableLocation

    topic = new_topic(kafka_config, 2)
    producer = Producer(kafka_config)
    uri = str(tmp_path / "t")
    ing = ingestion(uri, topic, kafka_config, spark_path.submitter(), dedup_key=KEY, dedup_horizon="1d")
    now_ms = int(time.time() * 1000)

    def send(ids, ts_ms):
        for i in ids:
            producer.produce(topic, value=f"e{i}".encode(), partition=i % 2, timestamp=ts_ms,
                             headers=[("event-id", str(i).encode())])
        producer.flush(10)
        return ing.run(RunIdentity(uuid.uuid4().hex))

    assert send(range(10), now_ms - 3 * 86_400_000).rows == 10  # three days ago
    assert send(range(10, 20), now_ms - 3_600_000).rows == 10  # an hour ago
    ledger = Ledger.open(uri)
    stats = pa.table(ledger.table.get_add_actions(flatten=True)).to_pydict()
    assert all(ts is not None for ts in stats["max.timestamp"])  # every file says how new it is
    next_plan = type("Plan", (), {"batch": ledger.last_batch("test") + 1})()  # key_files reads only .batch
    files, horizon_ms, _ = key_files(TableLocation.of(uri), None, DedupSpec(key=KEY, horizon="1d"), next_plan, now_ms)
    recent = [p for p, ts in zip(stats["path"], stats["max.timestamp"]) if ts.timestamp() * 1000 >= horizon_ms]
    assert 0 < len(files) == len(recent) < len(stats["path"])  # the old batch's files are not read
    third = send([3, 4, 13, 14, 99], now_ms)  # two old resends, two recent resends, one new event
    assert (third.rows, third.duplicates) == (3, 2)
    table = read_table(uri, ["offset", "_dedup_key"])
    assert sorted(table["_dedup_key"].to_pylist()) == sorted([str(i) for i in range(20)] + ["3", "4", "99"])
