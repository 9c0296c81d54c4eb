"""Interval mode on the real broker, Spark and Delta: backfills in any order, reruns, late records,
idle partitions, reprocess, bad input (airflow_eo.core.intervals, airflow_eo.loop.planner)."""

from __future__ import annotations

import functools
import random
import threading
import time
import uuid

import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from airflow_eo.core.errors import CommitConflictError, ConfigError, IntervalNotClosedError
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.loop.config import IngestConfig
from airflow_eo.core.intervals import interval_of
from airflow_eo.core.offsets import Interval, RunIdentity, TopicPartition
from airflow_eo.loop.reprocess import Reprocessor
from airflow_eo.status import table_status
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.table.ledger import Ledger
from tests.helpers import assert_exactly_once, broker_records, keys_of, new_topic, read_table

H = 3_600_000
PARTITIONS = 3


class NoSpark:
    def submit(self, attempt, secrets):
        raise AssertionError("Spark was started for a run that needed none")


def produce_at(config: dict, topic: str, records: list[tuple[int, int]]) -> None:
    """``(partition, timestamp ms)`` records, in this order, with an idempotent producer."""
    producer = Producer({**config, "enable.idempotence": True, "linger.ms": 5})
    for i, (partition, ts) in enumerate(records):
        producer.produce(topic, value=f"r{i}-{ts}".encode(), partition=partition, timestamp=ts)
    producer.flush(30)


def hour_base() -> int:
    """A whole hour ten hours ago: the six test intervals are in the past, inside retention."""
    return (int(time.time() * 1000) // H - 10) * H


def timeline(base: int, seed: int = 3) -> list[tuple[int, int]]:
    """Records over six hours in each partition: mostly rising, some out of order, some an hour
    or two late; then one record per partition after the last hour, which closes the intervals."""
    rng = random.Random(seed)
    out = []
    for p in range(PARTITIONS):
        stamps = sorted(base + rng.randrange(0, 6 * H) for _ in range(40))
        for i in rng.sample(range(40), 8):  # late: sent now, stamped earlier
            stamps[i] = max(base, stamps[i] - rng.randrange(H // 2, 2 * H))
        out += [(p, ts) for ts in stamps]
    return out + [(p, base + 6 * H + 60_000) for p in range(PARTITIONS)]


@pytest.fixture
def ingestion(ingestion):
    return functools.partial(ingestion, mode="interval")


def hours(base: int) -> list[Interval]:
    return [Interval(base + k * H, base + (k + 1) * H) for k in range(6)]


def owned_ranges(table_uri: str, topic: str) -> dict[Interval, dict[int, tuple[int, int]]]:
    intervals = IntervalLedger(Ledger.open(table_uri), "test")
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    return {c.interval: {tp.partition: r for tp, r in intervals.ranges_of(c, tps).items()} for c in intervals.committed()}


def expected_owner(bootstrap: str, topic: str, intervals: list[Interval]):
    """From the broker alone: each record's interval by the B(t) rule, and each interval's late count."""
    records = broker_records(bootstrap, topic)
    stamps = _timestamps(bootstrap, topic)
    owner, late = {}, {iv: 0 for iv in intervals}
    for p in range(PARTITIONS):
        offsets = sorted(o for (_, q, o) in records if q == p)

        def boundary(t, p=p, offsets=offsets):  # this partition's, called in this iteration
            return next((o for o in offsets if stamps[(p, o)] >= t), offsets[-1] + 1)

        for iv in intervals:
            for o in offsets:
                if boundary(iv.start_ms) <= o < boundary(iv.end_ms):
                    owner[(topic, p, o)] = iv
                    late[iv] += stamps[(p, o)] < iv.start_ms
    return owner, late


def _timestamps(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict[tuple[int, int], int]:
    """Each record's Kafka timestamp by (partition, offset), read with kafka-python."""
    from kafka import KafkaConsumer, TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False)
    tps = [KTP(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    ends = consumer.end_offsets(tps)
    out = {}
    while sum(1 for tp in tps if consumer.position(tp) < ends[tp]):
        for tp, messages in consumer.poll(timeout_ms=1000).items():
            for m in messages:
                out[(tp.partition, m.offset)] = m.timestamp
    consumer.close()
    return out


def run_intervals(ing: Ingestion, intervals: list[Interval], order: list[int]) -> list[str]:
    return [ing.run(RunIdentity(f"run-{i}-{uuid.uuid4().hex[:6]}"), intervals[i]).status for i in order]


def test_backfills_forward_backward_shuffled_and_racing_give_one_table(broker, kafka_config, spark, tmp_path, ingestion):
    from airflow_eo.driver.main import InProcessSubmitter

    topic, base = new_topic(kafka_config, PARTITIONS), hour_base()
    produce_at(kafka_config, topic, timeline(base))
    intervals = hours(base)
    owner, late = expected_owner(broker.bootstrap_servers, topic, intervals)
    assert sum(late.values()) > 0  # the timeline does hold late records
    tables = {}
    for name, order in [("forward", list(range(6))), ("backward", list(range(5, -1, -1))),
                        ("shuffled", random.Random(11).sample(range(6), 6))]:
        uri = str(tmp_path / name)
        statuses = run_intervals(ingestion(uri, topic, kafka_config, InProcessSubmitter(spark)), intervals, order)
        assert statuses == ["committed"] * 6
        tables[name] = uri
    # two backfills at once (two workers each taking every other hour): the table takes turns (its
    # lease), so no run loses its commit; a conflict would be retried, as Airflow would, and counted
    uri = tables["racing"] = str(tmp_path / "racing")
    errors, conflicts = [], []

    def worker(indexes):
        ing = ingestion(uri, topic, kafka_config, InProcessSubmitter(spark))
        for i in indexes:
            key = f"race-{i}"
            for _ in range(5):
                try:
                    ing.run(RunIdentity(key), intervals[i])
                    break
                except CommitConflictError as exc:
                    conflicts.append(exc)
                    continue
            else:
                errors.append(i)

    threads = [threading.Thread(target=worker, args=(idx,)) for idx in ([0, 2, 4], [5, 3, 1])]
    [t.start() for t in threads]
    [t.join(600) for t in threads]
    assert not any(t.is_alive() for t in threads)  # a worker still running would leave the table half written
    assert not errors and not conflicts
    reference = owned_ranges(tables["forward"], topic)
    assert set(reference) == set(intervals)
    for name, uri in tables.items():
        assert owned_ranges(uri, topic) == reference, name  # the same offsets per interval, whatever the order
        assert assert_exactly_once(uri, broker.bootstrap_servers, [topic]) == len(owner), name
        table = read_table(uri, ["topic", "partition", "offset"])
        by_batch = {c.batch: c.interval for c in IntervalLedger(Ledger.open(uri), "test").committed()}
        for record in Ledger.open(uri).batches("test", limit=None):
            iv = by_batch[record.meta.batch]
            assert record.meta.findings.late.records == late[iv], (name, iv)  # late counts from the batch metadata
            mine = {k for k, v in owner.items() if v == iv}
            assert {(r.topic, r.partition, o) for r in record.meta.ranges for o in range(r.start, r.end)} == mine
        assert {k for k in keys_of(table)} == set(owner)
    # a rerun of any committed interval (a new run, or a clear) is a verified no-op without Spark
    version = DeltaTable(tables["forward"]).version()
    again = ingestion(tables["forward"], topic, kafka_config, NoSpark()).run(RunIdentity("again"), intervals[2])
    assert again.status == "already_committed" and not again.spark_started and again.interval
    assert DeltaTable(tables["forward"]).version() == version


def test_reprocess_of_an_interval_replaces_exactly_its_rows(broker, kafka_config, spark, table_uri, ingestion):
    from airflow_eo.driver.main import InProcessSubmitter

    topic, base = new_topic(kafka_config, PARTITIONS), hour_base()
    produce_at(kafka_config, topic, timeline(base, seed=5))
    intervals = hours(base)[:3]
    ing = ingestion(table_uri, topic, kafka_config, InProcessSubmitter(spark))
    for i in (0, 2):
        ing.run(RunIdentity(f"r{i}"), intervals[i])
    status = table_status(table_uri, "test", kafka_config).to_dict()  # the JSON `airflow-eo status --json` prints
    assert [c["interval"] for c in status["intervals"]["committed"]] == [str(intervals[0]), str(intervals[2])]
    assert status["intervals"]["gaps"] == [str(intervals[1])]  # the hour never run
    ing.run(RunIdentity("r1"), intervals[1])
    typed = table_status(table_uri, "test", kafka_config)
    assert typed.interval_gaps == [] and len(typed.intervals) == 3
    assert sum(b.late for b in typed.batches) == sum(
        b.meta.findings.late.records for b in Ledger.open(table_uri).batches("test", limit=None))
    before = sorted(keys_of(read_table(table_uri, ["topic", "partition", "offset"])))
    result = Reprocessor(ing).run(RunIdentity("reprocess-r1"), target_run_key="r1")
    assert result.status == "reprocessed" and result.batch == 3
    after = sorted(keys_of(read_table(table_uri, ["topic", "partition", "offset"])))
    assert after == before
    files = DeltaTable(table_uri).file_uris()
    assert not any(f"/b{3:08d}-" in f and result.attempt_id not in f for f in files)  # batch 3's old files gone
    assert any(result.attempt_id in f for f in files)


def test_idle_partition_closes_after_the_grace_and_later_records_are_late_in_the_next(broker, kafka_config, spark,
                                                                                       table_uri, ingestion):
    from airflow_eo.driver.main import InProcessSubmitter

    topic, base = new_topic(kafka_config, PARTITIONS), hour_base()
    first, second = Interval(base, base + H), Interval(base + H, base + 2 * H)
    # partitions 0 and 1 move past the interval; partition 2 has one record in it, then stays idle
    produce_at(kafka_config, topic, [(0, base + 10), (1, base + 20), (2, base + 30),
                                     (0, base + H + 5), (1, base + H + 5)])
    waiting = ingestion(table_uri, topic, kafka_config, NoSpark(), close_after=10 * 24 * 3600)
    with pytest.raises(IntervalNotClosedError) as err:
        waiting.run(RunIdentity("wait"), first)
    assert f"{topic}[2]" in str(err.value) and "\n" not in str(err.value) and err.value.retryable
    assert not DeltaTable.is_deltatable(table_uri)
    ing = ingestion(table_uri, topic, kafka_config, InProcessSubmitter(spark), close_after="0s")
    assert ing.run(RunIdentity("first"), first).rows == 3
    plan = ing.plans.load("first")
    assert plan.closed_idle == (TopicPartition(topic, 2),)
    # partition 2 wakes up with a record stamped in the first interval: late, in the second
    produce_at(kafka_config, topic, [(2, base + 40), (2, base + 2 * H + 1), (0, base + 2 * H), (1, base + 2 * H)])
    second_result = ing.run(RunIdentity("second"), second)
    assert second_result.status == "committed" and second_result.late_records == 1
    assert second_result.rows == 3  # p0 and p1's hour-two records, and p2's late one
    assert ing.run(RunIdentity("first-again"), first).status == "already_committed"
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 6


def test_an_interval_without_records_commits_its_boundaries_without_spark(broker, kafka_config, spark, table_uri, ingestion):
    from airflow_eo.driver.main import InProcessSubmitter

    topic, base = new_topic(kafka_config, PARTITIONS), hour_base()
    first, quiet, third = (Interval(base + k * H, base + (k + 1) * H) for k in range(3))
    # one record per partition in hours 0 and 2, none in hour 1; a later one closes hour 2
    produce_at(kafka_config, topic, [(p, base + k * H + 10 + p) for k in (0, 2, 3) for p in range(PARTITIONS)])
    dedup = {"dedup_key": "CAST(value AS STRING)"}
    ing = ingestion(table_uri, topic, kafka_config, InProcessSubmitter(spark), **dedup)
    assert ing.run(RunIdentity("first"), first).rows == 3  # the first batch creates the table: Spark
    no_spark = ingestion(table_uri, topic, kafka_config, NoSpark(), **dedup)
    result = no_spark.run(RunIdentity("quiet"), quiet)
    assert (result.status, result.batch, result.rows, result.spark_started) == ("committed", 2, 0, False)
    assert result.ranges == [] and result.version == Ledger.open(table_uri).version
    record = Ledger.open(table_uri).find_batch("test", batch=2)
    assert record.meta.attempt_id == result.attempt_id and record.meta.findings.late.records == 0
    assert record.meta.findings.duplicates.records == 0 and record.meta.files == 0
    # its boundaries are recorded: empty ranges where the first interval ended
    assert owned_ranges(table_uri, topic)[quiet] == {p: (1, 1) for p in range(PARTITIONS)}
    assert no_spark.run(RunIdentity("quiet-again"), quiet).status == "already_committed"
    status = table_status(table_uri, "test", kafka_config)
    assert [c.interval for c in status.intervals] == [first, quiet] and status.interval_gaps == []
    assert ing.run(RunIdentity("third"), third).rows == 3
    assert owned_ranges(table_uri, topic)[third] == {p: (1, 2) for p in range(PARTITIONS)}
    assert assert_exactly_once(table_uri, broker.bootstrap_servers, [topic]) == 6


def test_bad_input_is_one_line_and_commits_nothing(broker, kafka_config, spark, table_uri, ingestion):
    from airflow_eo.driver.main import InProcessSubmitter

    topic, base = new_topic(kafka_config, 1), hour_base()
    for start, end, cause in [("2026-03-04T01:00:00Z", "2026-03-04T00:00:00Z", "not after its start"),
                              ("2026-03-04T00:00:00", "2026-03-04T01:00:00Z", "no time zone")]:
        with pytest.raises(ConfigError, match=cause) as err:
            interval_of(start, end)
        assert "\n" not in str(err.value)
    ing = ingestion(table_uri, topic, kafka_config, NoSpark())
    with pytest.raises(ConfigError, match="needs the run's data interval"):
        ing.run(RunIdentity("x"))
    # one ingest id keeps one mode: an offset-mode table refuses interval runs, and back
    produce_at(kafka_config, topic, [(0, base + 5)])
    offsets = ingestion(table_uri, topic, kafka_config, InProcessSubmitter(spark), mode="offsets")
    assert offsets.run(RunIdentity("o1")).status == "committed"
    version = DeltaTable(table_uri).version()
    with pytest.raises(ConfigError, match="offset-keyed"):
        ing.run(RunIdentity("i1"), Interval(0, H))
    with pytest.raises(ConfigError, match="mode"):
        IngestConfig(table_uri=table_uri, ingest_id="test", topics=[topic], kafka_config=kafka_config, mode="daily")
    assert DeltaTable(table_uri).version() == version
    # overlapping intervals on one ingest id are refused
    other = str(table_uri) + "-iv"
    produce_at(kafka_config, topic, [(0, base + 2 * H)])
    ingestion(other, topic, kafka_config, InProcessSubmitter(spark)).run(RunIdentity("a"), Interval(base, base + H))
    with pytest.raises(ConfigError, match="overlaps"):
        ingestion(other, topic, kafka_config, NoSpark()).run(RunIdentity("b"), Interval(base, base + 2 * H))
