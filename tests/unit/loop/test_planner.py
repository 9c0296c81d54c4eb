"""The planners against Kafka in memory (tests/unit/fakes.py) and real Delta ledgers on disk."""

from __future__ import annotations

import re

import pytest

from airflow_eo.core.errors import ConfigError, DataLossError, IntervalNotClosedError, KafkaUnavailableError, \
    OffsetsAheadError
from airflow_eo.core.intervals import CommittedInterval
from airflow_eo.loop.planner import IntervalPlanner, OffsetPlanner, shrunk
from airflow_eo.core.offsets import Interval, OffsetRange, RunIdentity, TopicPartition
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.app_ids import batch_app_id, interval_app_id, interval_at_app_id, partition_app_id, span_app_id
from airflow_eo.core.errors import TopicRecreatedError
from airflow_eo.core.identity import id_mark, pack_stamp
from airflow_eo.core.offsets import RecordStamp, TopicReset
from airflow_eo.table.app_ids import stamp_app_id, topic_mark_app_id
from airflow_eo.table.commit import identity_transactions
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


def committed(tmp_path, batch: int, *extra: Txn, **offsets: int) -> Ledger:
    """A table ``orders_raw`` committed ``batch`` batches to, with next offsets ``p0=…, p1=…`` (and ``extra``)."""
    uri = str(tmp_path / "t")
    ledger_table(uri, Txn(batch_app_id("orders_raw"), batch),
                 *(Txn(partition_app_id("orders_raw", TopicPartition("orders", int(k[1:]))), v)
                   for k, v in offsets.items()), *extra)
    return Ledger.open(uri)


def stamp_of(kafka: FakeKafka, tp: TopicPartition, committed_at: int) -> Txn:
    """The fingerprint a commit up to ``committed_at`` recorded of ``tp`` (its last record below)."""
    return Txn(stamp_app_id("orders_raw", tp), pack_stamp(kafka._stamp(tp, committed_at - 1), committed_at))


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


def test_a_partition_added_after_the_first_batch_starts_at_its_log_start_whatever_the_starting_position(tmp_path):
    # "latest" (or a timestamp) placed the first batch's partitions; one added later would lose the
    # records written to it before this run if it started there too
    for start in ("latest", '{"timestamp": %d}' % (BASE + 10)):
        plan = OffsetPlanner(config(starting_offsets=start)).plan(RUN, committed(tmp_path / start[:3], 1, p0=2),
                                                                  kafka_with(5, 3))
        assert plan.new_partitions == (T1,)
        assert plan.ranges == (OffsetRange("orders", 0, 2, 5), OffsetRange("orders", 1, 0, 3))


def test_a_partition_the_user_named_starts_where_named_even_when_it_appears_later(tmp_path):
    plan = OffsetPlanner(config(starting_offsets='{"orders": {"1": 2}}')).plan(
        RUN, committed(tmp_path, 1, p0=2), kafka_with(5, 3))
    assert plan.ranges == (OffsetRange("orders", 0, 2, 5), OffsetRange("orders", 1, 2, 3))


def test_the_first_batch_places_every_partition_at_the_starting_position(tmp_path):
    plan = OffsetPlanner(config(starting_offsets="latest")).plan(RUN, new_table(tmp_path), kafka_with(5, 3))
    assert plan.ranges == (OffsetRange("orders", 0, 5, 5), OffsetRange("orders", 1, 3, 3))


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
    with pytest.raises(OffsetsAheadError, match=r"orders\[0\] read up to offset 50.*orders\[0\] ending at offset 5"):
        OffsetPlanner(config()).plan(RUN, committed(tmp_path, 1, p0=50, p1=0), kafka_with(5, 3))


def test_a_topic_recreated_with_fewer_partitions_is_refused(tmp_path):
    """The table committed partition 1; Kafka now has only partition 0."""
    with pytest.raises(TopicRecreatedError, match=r"orders.*partition 1 read up to offset 2.*1 partition\(s\), no orders\[1\]"):
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


def recreated_kafka() -> tuple[FakeKafka, Txn]:
    """``orders`` held 10 records when the table committed them (its fingerprint), then was deleted and
    created again, and holds 25 new ones."""
    kafka = kafka_with(10)
    stamp = stamp_of(kafka, T0, 10)
    kafka.recreate("orders", 1)
    kafka.produce(T0, *(BASE + HOUR + i for i in range(25)))
    return kafka, stamp


def test_a_recreated_topic_is_refused_in_one_line_naming_both_fingerprints(tmp_path):
    kafka, stamp = recreated_kafka()
    with pytest.raises(TopicRecreatedError) as raised:
        OffsetPlanner(config()).plan(RUN, committed(tmp_path, 1, stamp, p0=10), kafka)
    message = str(raised.value)
    assert "\n" not in message and not raised.value.retryable
    assert re.search(r"topic 'orders' was deleted and created again.*orders\[0\] record 9 at 2026-01-01T00:00:00\.009Z"
                     r".*orders\[0\] record 9 at 2026-01-01T01:00:00\.009Z.*on_topic_recreated='reset'", message)


def test_with_reset_a_recreated_topic_is_read_from_its_start_and_the_reset_is_recorded(tmp_path):
    kafka, stamp = recreated_kafka()
    plan = OffsetPlanner(config(on_topic_recreated="reset")).plan(RUN, committed(tmp_path, 1, stamp, p0=10), kafka)
    assert plan.ranges == (OffsetRange("orders", 0, 0, 25),) and plan.expected_committed == {T0: 10}
    assert [(r.tp, r.committed, r.start) for r in plan.resets] == [(T0, 10, 0)]
    assert plan.stamps == ((T0, RecordStamp(24, BASE + HOUR + 24)),)  # the new topic's, for the next run
    txns = {t.app_id: t.version for t in identity_transactions(plan)}
    assert txns["airflow-eo:orders_raw:identity:orders:reset"] == plan.batch
    assert txns[stamp_app_id("orders_raw", T0)] == pack_stamp(RecordStamp(24, BASE + HOUR + 24), 25)


def test_the_same_topic_passes_and_each_moved_partition_gets_a_new_fingerprint(tmp_path):
    kafka = kafka_with(10, 4)
    stamp = stamp_of(kafka, T0, 10)
    kafka.produce(T0, *(BASE + 100 + i for i in range(5)))
    plan = OffsetPlanner(config()).plan(RUN, committed(tmp_path, 1, stamp, p0=10, p1=4), kafka)
    assert plan.ranges == (OffsetRange("orders", 0, 10, 15), OffsetRange("orders", 1, 4, 4)) and not plan.resets
    assert plan.stamps == ((T0, RecordStamp(14, BASE + 104)),)  # p1 did not move: its fingerprint stays


def test_nothing_new_reads_no_fingerprint_from_kafka(tmp_path):
    kafka = kafka_with(10)
    plan = OffsetPlanner(config()).plan(RUN, committed(tmp_path, 1, stamp_of(kafka, T0, 10), p0=10), kafka)
    assert plan.is_empty and "records_at" not in kafka.asked and "last_records" not in kafka.asked


def test_a_topic_recreated_shorter_than_the_table_read_is_refused_and_reset_on_request(tmp_path):
    kafka = kafka_with(10)
    kafka.recreate("orders", 1)
    kafka.produce(T0, BASE + HOUR, BASE + HOUR + 1)
    with pytest.raises(TopicRecreatedError, match=r"orders\[0\] read up to offset 10.*ending at offset 2"):
        OffsetPlanner(config()).plan(RUN, committed(tmp_path / "a", 1, p0=10), kafka)
    plan = OffsetPlanner(config(on_topic_recreated="reset")).plan(RUN, committed(tmp_path / "b", 1, p0=10), kafka)
    assert plan.ranges == (OffsetRange("orders", 0, 0, 2),)


def test_with_reset_partitions_the_new_topic_lacks_are_cleared(tmp_path):
    kafka = kafka_with(5)  # orders had partitions 0..2 when the table read them; now one
    plan = OffsetPlanner(config(on_topic_recreated="reset")).plan(RUN, committed(tmp_path, 1, p0=2, p1=3, p2=4), kafka)
    assert [(r.tp, r.committed, r.start) for r in plan.resets] == [
        (T0, 2, 0), (T1, 3, None), (TopicPartition("orders", 2), 4, None)]
    txns = {t.app_id: t.version for t in identity_transactions(plan)}
    assert txns[partition_app_id("orders_raw", T1)] == 0 == txns[partition_app_id("orders_raw", TopicPartition("orders", 2))]


def test_where_kafka_reports_topic_ids_they_decide_and_no_record_is_read(tmp_path):
    kafka = kafka_with(10)
    kafka.ids["orders"] = "Mh1ZQ3UdQ6-uQ_sSkE2a3Q"
    kafka.produce(T0, BASE + 50)
    mark = Txn(topic_mark_app_id("orders_raw", "orders"), id_mark("Mh1ZQ3UdQ6-uQ_sSkE2a3Q"))
    plan = OffsetPlanner(config()).plan(RUN, committed(tmp_path / "same", 1, mark, p0=10), kafka)
    assert plan.ranges == (OffsetRange("orders", 0, 10, 11),) and plan.stamps == ()
    assert plan.topic_ids == (("orders", "Mh1ZQ3UdQ6-uQ_sSkE2a3Q"),)
    assert "records_at" not in kafka.asked and "last_records" not in kafka.asked
    kafka.ids["orders"] = "AQAAAAAAAAAAAAAAAAAAAA"  # deleted and created again: another id
    with pytest.raises(TopicRecreatedError, match=r"another topic id .*topic id AQAAAAAAAAAAAAAAAAAAAA"):
        OffsetPlanner(config()).plan(RUN, committed(tmp_path / "other", 1, mark, p0=10), kafka)


def test_reset_records_are_read_back_from_the_plan_log(tmp_path):
    from airflow_eo.core.planning import BatchPlan

    kafka, stamp = recreated_kafka()
    plan = OffsetPlanner(config(on_topic_recreated="reset")).plan(RUN, committed(tmp_path, 1, stamp, p0=10), kafka)
    again = BatchPlan.from_json(plan.to_json())
    assert again == plan and isinstance(again.resets[0], TopicReset)
