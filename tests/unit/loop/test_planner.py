"""The planners against Kafka in memory (tests/unit/fakes.py) and real Delta ledgers on disk."""

from __future__ import annotations

import pytest

from airflow_eo.core.errors import ConfigError, DataLossError, IntervalNotClosedError, KafkaUnavailableError, \
    OffsetsAheadError
from airflow_eo.core.intervals import CommittedInterval
from airflow_eo.loop.planner import IntervalPlanner, OffsetPlanner, shrunk
from airflow_eo.core.offsets import Interval, OffsetRange, RunIdentity, TopicPartition
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.app_ids import batch_app_id, interval_app_id, interval_at_app_id, partition_app_id, span_app_id
from tests.conftest import build_config
from tests.unit.fakes import FakeKafka, Txn, ledger_table

T0, T1 = TopicPartition("orders", 0), TopicPartition("orders", 1)
RUN = RunIdentity("dag/run/task/-1")
HOUR = 3_600_000
BASE = 1_767_225_600_000  # 2026-01-01T00:00Z


def config(**options):
    """An ingest's config with the planners' options (the table path is unused: the ledger is given)."""
    options = {"ingest_id": "orders_raw", "topics": ["orders"], **options}
    return build_config("/nonexistent/orders", options.pop("topics"), {"bootstrap.servers": "fake:9092"}, **options)


def kafka_with(*counts: int) -> FakeKafka:
    kafka = FakeKafka(orders=len(counts))
    for p, n in enumerate(counts):
        kafka.produce(TopicPartition("orders", p), *(BASE + i for i in range(n)))
    return kafka


def committed(tmp_path, batch: int, **offsets: int) -> Ledger:
    """A table ``orders_raw`` committed ``batch`` batches to, with next offsets ``p0=…, p1=…``."""
    uri = str(tmp_path / "t")
    ledger_table(uri, Txn(batch_app_id("orders_raw"), batch),
                 *(Txn(partition_app_id("orders_raw", TopicPartition("orders", int(k[1:]))), v)
                   for k, v in offsets.items()))
    return Ledger.open(uri)


def new_table(tmp_path) -> Ledger:
    return Ledger.open(str(tmp_path / "new"))


def test_a_new_table_reads_every_partition_from_the_earliest_offset(tmp_path):
    plan = OffsetPlanner(config()).plan(RUN, new_table(tmp_path), kafka_with(5, 3))
    assert plan.batch == 1 and plan.ingest_id == "orders_raw" and plan.run == RUN
    assert plan.ranges == (OffsetRange("orders", 0, 0, 5), OffsetRange("orders", 1, 0, 3))
    assert plan.new_partitions == (T0, T1)


def test_latest_start_commits_the_ends_of_new_partitions_and_reads_nothing(tmp_path):
    plan = OffsetPlanner(config(starting_offsets="latest")).plan(RUN, new_table(tmp_path), kafka_with(5, 3))
    assert plan.ranges == (OffsetRange("orders", 0, 5, 5), OffsetRange("orders", 1, 3, 3))
    assert plan.data_ranges == () and not plan.is_empty  # the starts must be committed, or 'latest' drifts


def test_a_timestamp_start_begins_at_the_first_record_at_or_after_it(tmp_path):
    kafka = kafka_with(5, 3)
    plan = OffsetPlanner(config(starting_offsets={"timestamp": BASE + 2})).plan(RUN, new_table(tmp_path), kafka)
    assert plan.ranges == (OffsetRange("orders", 0, 2, 5), OffsetRange("orders", 1, 2, 3))
    later = OffsetPlanner(config(starting_offsets={"timestamp": BASE + 4})).plan(RUN, new_table(tmp_path), kafka)
    assert later.ranges == (OffsetRange("orders", 0, 4, 5), OffsetRange("orders", 1, 3, 3))  # none: at the end


def test_explicit_offsets_outside_what_kafka_holds_are_a_config_error(tmp_path):
    settings = config(starting_offsets={"orders": {"0": 2, "1": 9}})
    with pytest.raises(ConfigError, match=r"starting offset 9 for orders\[1\] is outside"):
        OffsetPlanner(settings).plan(RUN, new_table(tmp_path), kafka_with(5, 3))


def test_the_next_batch_starts_where_the_table_committed(tmp_path):
    plan = OffsetPlanner(config()).plan(RUN, committed(tmp_path, 4, p0=3, p1=3), kafka_with(5, 3))
    assert plan.batch == 5 and plan.new_partitions == ()
    assert plan.ranges == (OffsetRange("orders", 0, 3, 5), OffsetRange("orders", 1, 3, 3))
    assert plan.data_ranges == (OffsetRange("orders", 0, 3, 5),)


def test_nothing_new_is_an_empty_plan(tmp_path):
    plan = OffsetPlanner(config()).plan(RUN, committed(tmp_path, 2, p0=5, p1=3), kafka_with(5, 3))
    assert plan.is_empty and plan.batch == 3


def test_a_partition_added_to_the_topic_starts_at_the_starting_position(tmp_path):
    plan = OffsetPlanner(config(starting_offsets="latest")).plan(
        RUN, committed(tmp_path, 1, p0=2), kafka_with(5, 3))
    assert plan.new_partitions == (T1,)
    assert plan.ranges == (OffsetRange("orders", 0, 2, 5), OffsetRange("orders", 1, 3, 3))


def test_the_cap_is_shared_fairly_between_partitions(tmp_path):
    plan = OffsetPlanner(config(max_records_per_run=6)).plan(RUN, new_table(tmp_path), kafka_with(100, 2))
    assert plan.ranges == (OffsetRange("orders", 0, 0, 4), OffsetRange("orders", 1, 0, 2))


def test_offsets_lost_to_retention_fail_unless_skipping_is_asked_for(tmp_path):
    kafka = kafka_with(10)
    kafka.delete_records(T0, 7)
    with pytest.raises(DataLossError, match=r"orders\[0\].*next offset is 2.*starts at 7"):
        OffsetPlanner(config()).plan(RUN, committed(tmp_path, 1, p0=2), kafka)
    plan = OffsetPlanner(config(on_data_loss="skip")).plan(RUN, Ledger.open(str(tmp_path / "t")), kafka)
    assert plan.ranges == (OffsetRange("orders", 0, 7, 10),)
    assert [(s.start, s.end, s.reason) for s in plan.skipped] == [(2, 7, "retention")]


def test_a_table_ahead_of_kafka_is_refused(tmp_path):
    with pytest.raises(OffsetsAheadError, match=r"orders\[0\].*committed offset 50"):
        OffsetPlanner(config()).plan(RUN, committed(tmp_path, 1, p0=50, p1=0), kafka_with(5, 3))


def test_a_topic_recreated_with_fewer_partitions_is_refused(tmp_path):
    """The table committed partition 1; Kafka now has only partition 0."""
    with pytest.raises(OffsetsAheadError, match=r"orders\[1\]"):
        OffsetPlanner(config()).plan(RUN, committed(tmp_path, 1, p0=2, p1=2), kafka_with(5))
    assert shrunk([T0, T1, TopicPartition("other", 0)]) == [TopicPartition("orders", 2), TopicPartition("other", 1)]


def test_a_missing_topic_is_kafka_unavailable_and_nothing_else_is_asked(tmp_path):
    kafka = kafka_with(5)
    with pytest.raises(KafkaUnavailableError, match="'payments' does not exist"):
        OffsetPlanner(config(topics=["orders", "payments"])).plan(RUN, new_table(tmp_path), kafka)
    assert kafka.asked == ["partitions"]


# -- interval mode ---------------------------------------------------------------------------

def hourly_kafka() -> FakeKafka:
    """Two partitions with records 10 minutes apart from BASE to BASE + 3 h."""
    kafka = FakeKafka(orders=2)
    for p in (0, 1):
        kafka.produce(TopicPartition("orders", p), *(BASE + k * 600_000 + p for k in range(18)))
    return kafka


def test_an_interval_owns_the_offsets_between_its_boundaries(tmp_path):
    interval = Interval(BASE + HOUR, BASE + 2 * HOUR)
    plan = IntervalPlanner(config(), interval).plan(RUN, new_table(tmp_path), hourly_kafka())
    assert plan.interval == interval and plan.batch == 1
    assert plan.ranges == (OffsetRange("orders", 0, 6, 12), OffsetRange("orders", 1, 6, 12))


def test_an_interval_still_receiving_records_is_not_closed(tmp_path):
    kafka = FakeKafka(orders=1)
    kafka.produce(T0, BASE, BASE + 1)  # nothing after the interval yet, and it ends in the future
    interval = Interval(BASE, BASE + 100 * 365 * 24 * HOUR)
    with pytest.raises(IntervalNotClosedError):
        IntervalPlanner(config(), interval).plan(RUN, new_table(tmp_path), kafka)
    assert "newest_timestamps" in kafka.asked  # the message says how far the partition got


def test_a_committed_interval_is_answered_with_its_batch_and_kafka_is_not_asked(tmp_path):
    uri, interval = str(tmp_path / "t"), Interval(BASE, BASE + HOUR)
    ledger_table(uri, Txn(batch_app_id("orders_raw"), 1), Txn(interval_app_id("orders_raw", 1, "start"), BASE),
                 Txn(interval_app_id("orders_raw", 1, "end"), BASE + HOUR),
                 Txn(interval_at_app_id("orders_raw", BASE), 1),
                 Txn(span_app_id("orders_raw", "min-start"), BASE), Txn(span_app_id("orders_raw", "max-end"), BASE + HOUR))
    kafka = hourly_kafka()
    assert IntervalPlanner(config(), interval).plan(RUN, Ledger.open(uri), kafka) == CommittedInterval(1, interval)
    assert kafka.asked == []
    assert IntervalLedger(Ledger.open(uri), "orders_raw").committed() == [CommittedInterval(1, interval)]
    with pytest.raises(ConfigError, match="overlaps interval"):
        IntervalPlanner(config(), Interval(BASE + HOUR // 2, BASE + 2 * HOUR)).plan(RUN, Ledger.open(uri), kafka)
    with pytest.raises(ConfigError, match="is interval-keyed; this run asks for offset mode"):
        OffsetPlanner(config()).plan(RUN, Ledger.open(uri), kafka)
