"""The plugin's assertions fail on a damaged table: a duplicate, a missing record, a record of an
aborted transaction, a row past the offsets, offsets behind the topic, a merge table's stale or
doubled key — each named in the failure. And they pass on the same table undamaged.

The tables are written here with deltalake, rows and offsets (``txn`` actions) in one commit as
airflow-eo commits them, so each damage is exactly the one the test makes (no Spark needed).
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from airflow_eo.core.offsets import TopicPartition
from airflow_eo.table.app_ids import partition_app_id
from airflow_eo.table.metadata import METADATA_KEY
from airflow_eo.testing import (
    assert_exactly_once, assert_last_write_per_key, assert_no_aborted_records, assert_offsets_at_end,
)

INGEST = "orders"


def commit(table, records, offsets: dict, metadata: str | None = None) -> None:
    """``records`` as rows (coordinates, key, value) and the partitions' offsets in one commit."""
    rows = [{"topic": r.topic, "partition": r.partition, "offset": r.offset,
             "key": r.key.decode() if r.key else None, "value": r.value.decode() if r.value else None}
            for r in records]
    schema = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                        ("key", pa.string()), ("value", pa.string())])
    txns = [Transaction(partition_app_id(INGEST, TopicPartition(t, p)), end) for (t, p), end in offsets.items()]
    write_deltalake(table.uri, pa.Table.from_pylist(rows, schema), mode="append", commit_properties=CommitProperties(
        app_transactions=txns, custom_metadata={METADATA_KEY: metadata} if metadata else None))


@pytest.fixture
def topic_with_an_aborted_transaction(kafka_broker, kafka_topic):
    kafka_broker.produce(kafka_topic, [f"v{i}" for i in range(9)], keys=[f"k{i % 4}" for i in range(9)])
    kafka_broker.produce_transaction(kafka_topic, ["aborted"] * 3, partition=0, abort=True)
    kafka_broker.produce_transaction(kafka_topic, ["committed"], keys=["k9"], partition=1)
    return kafka_topic


def ends_of(kafka_broker, topic) -> dict:
    return {(topic, p): end for p, end in kafka_broker.end_offsets(topic).items()}


def test_a_whole_table_passes(kafka_broker, topic_with_an_aborted_transaction, delta_table):
    topic = topic_with_an_aborted_transaction
    records = kafka_broker.records(topic)
    commit(delta_table, records, ends_of(kafka_broker, topic))
    check = assert_exactly_once(delta_table, kafka_broker, [topic], ingest_id=INGEST, caught_up=True)
    assert check.rows == check.records == len(records) == 10
    assert assert_no_aborted_records(delta_table, kafka_broker, [topic]) == 10


def test_a_duplicate_fails(kafka_broker, topic_with_an_aborted_transaction, delta_table):
    topic = topic_with_an_aborted_transaction
    records = kafka_broker.records(topic)
    commit(delta_table, records + records[3:4], ends_of(kafka_broker, topic))
    with pytest.raises(AssertionError, match=rf"1 record\(s\) held more than once: {topic}\[{records[3].partition}\]"
                                             rf"@{records[3].offset}"):
        assert_exactly_once(delta_table, kafka_broker, [topic], ingest_id=INGEST)


def test_a_missing_record_fails(kafka_broker, topic_with_an_aborted_transaction, delta_table):
    topic = topic_with_an_aborted_transaction
    records = kafka_broker.records(topic)
    commit(delta_table, records, ends_of(kafka_broker, topic))
    gone = records[5]
    DeltaTable(delta_table.uri).delete(f"\"partition\" = {gone.partition} AND \"offset\" = {gone.offset}")
    with pytest.raises(AssertionError, match=rf"1 committed record\(s\) missing: {topic}\[{gone.partition}\]"
                                             rf"@{gone.offset}"):
        assert_exactly_once(delta_table, kafka_broker, [topic], ingest_id=INGEST)


def test_a_record_of_an_aborted_transaction_fails(kafka_broker, topic_with_an_aborted_transaction, delta_table):
    topic = topic_with_an_aborted_transaction
    aborted = [r for r in kafka_broker.records(topic, read_committed=False) if r.value == b"aborted"]
    assert len(aborted) == 3
    commit(delta_table, kafka_broker.records(topic) + aborted[:1], ends_of(kafka_broker, topic))
    with pytest.raises(AssertionError, match=r"1 row\(s\) of aborted transactions"):
        assert_exactly_once(delta_table, kafka_broker, [topic], ingest_id=INGEST)
    with pytest.raises(AssertionError, match=rf"holds 1 row\(s\) of aborted transactions: {topic}\[0\]"):
        assert_no_aborted_records(delta_table, kafka_broker, [topic])


def test_rows_past_the_offsets_and_offsets_behind_the_topic_fail(kafka_broker, topic_with_an_aborted_transaction,
                                                                  delta_table):
    topic = topic_with_an_aborted_transaction
    records = kafka_broker.records(topic)
    ends = ends_of(kafka_broker, topic)
    last = max(r.offset for r in records if r.partition == 1)
    behind = {tp: (last if tp == (topic, 1) else end) for tp, end in ends.items()}
    commit(delta_table, records, behind)  # partition 1's last record is a row, its offset not committed
    with pytest.raises(AssertionError, match=r"1 row\(s\) no committed offset covers"):
        assert_exactly_once(delta_table, kafka_broker, [topic], ingest_id=INGEST)
    with pytest.raises(AssertionError, match=rf"not the topics' ends \(committed, end\): {topic}\[1\]"):
        assert_offsets_at_end(delta_table, kafka_broker, [topic], ingest_id=INGEST)


def key_of(record):
    return record.key.decode()


def row_of(record):
    return {"key": record.key.decode(), "value": record.value.decode()}


def merged(records) -> list:
    """The last change per key of one batch (the records hold each key in one partition)."""
    last = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        last[r.key] = r
    return list(last.values())


def test_a_merge_table_passes_and_fails_on_a_stale_or_doubled_key(kafka_broker, kafka_topic, delta_table):
    kafka_broker.produce_keyed(kafka_topic, [("a", "1"), ("b", "1"), ("a", "2"), ("c", "1"), ("b", "2")])
    records = kafka_broker.records(kafka_topic)
    ends = ends_of(kafka_broker, kafka_topic)
    write_batch_log(delta_table, merged(records), ends)
    assert assert_last_write_per_key(delta_table, kafka_broker, [kafka_topic], ingest_id=INGEST, key_columns=["key"],
                                     key_of=key_of, row_of=row_of) == 3
    stale = next(r for r in records if r.key == b"a" and r.value == b"1")
    commit(delta_table, [stale], ends)  # key a twice, one row of them stale
    with pytest.raises(AssertionError, match=r"1 key\(s\) with more than one row: \['a'\]"):
        assert_last_write_per_key(delta_table, kafka_broker, [kafka_topic], ingest_id=INGEST, key_columns=["key"],
                                  key_of=key_of, row_of=row_of)
    DeltaTable(delta_table.uri).delete("key = 'a' AND value = '2'")  # now only the stale row of a is left
    with pytest.raises(AssertionError, match=r"1 key\(s\) whose row is not their last change: a: has"):
        assert_last_write_per_key(delta_table, kafka_broker, [kafka_topic], ingest_id=INGEST, key_columns=["key"],
                                  key_of=key_of, row_of=row_of)


def write_batch_log(table, rows, ends) -> None:
    """A merge table's first batch as airflow-eo logs it: its rows, its offsets and, in commitInfo,
    the batch's ranges (what the assertion's model applies, batch by batch)."""
    from airflow_eo.core.planning import BatchPlan
    from airflow_eo.core.offsets import OffsetRange, RunIdentity
    from airflow_eo.table.metadata import BatchMetadata, CommitKind

    plan = BatchPlan(INGEST, 1, tuple(OffsetRange(t, p, 0, end) for (t, p), end in ends.items()), RunIdentity("r1"))
    commit(table, rows, ends, metadata=BatchMetadata.of(CommitKind.BATCH, plan).to_json())
