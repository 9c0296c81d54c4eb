"""The audit on a real table and a real broker: clean after ingest runs over committed, aborted and
open transactions, dead letters and a skipped retention gap; each damage done with deltalake
directly reported by offset; retention that deleted audited offsets reported as unverifiable;
the same findings whether the slices are compared in process or as Spark tasks, on the local
session and on the Spark Connect server, in one slice or many.

One table is ingested per module and copied for each damage, so Spark runs only three batches.
"""

from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pytest
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as KTP
from confluent_kafka.admin import AdminClient
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from airflow_eo.spec import Transform
from airflow_eo.audit.run import AuditRequest, Selection, run_audit
from airflow_eo.cli import main
from airflow_eo.driver.main import InProcessSubmitter
from airflow_eo.core.offsets import OffsetRange, TopicPartition, RunIdentity
from airflow_eo.status import table_status
from airflow_eo.submit.audit import SparkSlices
from airflow_eo.table.metadata import METADATA_KEY, BatchMetadata
from airflow_eo.table.app_ids import partition_app_id
from tests.conftest import build_ingestion
from tests.helpers import new_topic, transactional_producer

INGEST_ID = "audited"
SQL = "SELECT topic, partition, offset, data.id AS id FROM source"


@dataclass(frozen=True)
class Ingested:
    table: str
    dlq: str
    topic: str
    bootstrap: str
    p0_end: int  # the table's txn offset of partition 0 (the end of its last committed range)
    aborted: tuple[int, ...]  # offsets of partition 0's aborted records
    dead: int  # the dead letter's offset on partition 0
    late: int  # the offset of a record batch 2 wrote on partition 0


class Offsets:
    """Delivery reports: the offset Kafka gave each value (markers take offsets too, so none is guessed)."""

    def __init__(self):
        self.of: dict[bytes, int] = {}

    def __call__(self, err, msg):
        assert err is None, err
        self.of[msg.value()] = msg.offset()


def plain(config: dict, topic: str, partition: int, values: list[bytes], offsets: Offsets) -> None:
    producer = Producer({**config, "enable.idempotence": True})
    for v in values:
        producer.produce(topic, value=v, partition=partition, on_delivery=offsets)
    producer.flush(30)


@pytest.fixture(scope="module")
def ingested(tmp_path_factory, broker, kafka_config, spark) -> Ingested:
    root = tmp_path_factory.mktemp("audit")
    topic, offsets = new_topic(kafka_config, 2), Offsets()
    tx = transactional_producer(kafka_config)
    tx.begin_transaction()
    for i in range(4):
        tx.produce(topic, value=json.dumps({"id": i}).encode(), partition=0, on_delivery=offsets)
    tx.commit_transaction()
    tx.begin_transaction()
    aborted = [json.dumps({"id": 100 + i}).encode() for i in range(3)]
    for v in aborted:
        tx.produce(topic, value=v, partition=0, on_delivery=offsets)
    tx.flush(30)  # on the broker before the abort (an abort drops what is still queued)
    tx.abort_transaction()
    open_tx = transactional_producer(kafka_config)
    open_tx.begin_transaction()
    open_tx.produce(topic, value=b'{"id": 9}', partition=0, on_delivery=offsets)  # open during batch 1
    open_tx.flush(30)
    plain(kafka_config, topic, 0, [b'{"id": 10}', b"not json"], offsets)  # "not json": a dead letter
    plain(kafka_config, topic, 1, [json.dumps({"id": 20 + i}).encode() for i in range(5)] + [b"[]"], offsets)
    ing = build_ingestion(str(root / "table"), topic, kafka_config, InProcessSubmitter(spark), ingest_id=INGEST_ID,
                          transform=Transform(sql=SQL), value_schema="id INT", dead_letter_table_uri=str(root / "dlq"),
                          on_data_loss="skip")
    assert ing.run(RunIdentity("b1")).rows == 4 + 5  # p0 up to the open transaction, p1 without its dead letter
    open_tx.commit_transaction()
    plain(kafka_config, topic, 0, [b'{"id": 13}'], offsets)
    assert ing.run(RunIdentity("b2")).rows == 3  # p0: 9, 10, 13; "not json" is a dead letter
    plain(kafka_config, topic, 1, [json.dumps({"id": 26 + i}).encode() for i in range(4)], offsets)  # p1 6-9
    admin = AdminClient(kafka_config)
    for f in admin.delete_records([KTP(topic, 1, 8)]).values():  # retention took p1 6, 7 before they were read
        f.result()
    assert ing.run(RunIdentity("b3")).rows == 2
    table = str(root / "table")
    p0_end = DeltaTable(table).transaction_version(partition_app_id(INGEST_ID, TopicPartition(topic, 0)))
    assert p0_end == offsets.of[b'{"id": 13}'] + 1
    assert (offsets.of[b"[]"], offsets.of[json.dumps({"id": 26}).encode()]) == (5, 6)  # p1 has no markers
    return Ingested(table, str(root / "dlq"), topic, broker.bootstrap_servers, p0_end,
                    tuple(offsets.of[v] for v in aborted), offsets.of[b"not json"], offsets.of[b'{"id": 10}'])


def audit(capsys, ingested: Ingested, table: str | None = None, *options: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["audit", table or ingested.table, "--ingest-id", INGEST_ID, "--bootstrap-servers", ingested.bootstrap,
                 "--dead-letter-table", ingested.dlq, "--json", *options])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # the report: one line, last


def found(report: dict, drift_only: bool = False) -> list[tuple]:
    drift = {"lost", "duplicated", "stray", "overlap", "gap", "txn_mismatch"}
    return sorted((f["kind"], f["partition"], f["count"], tuple(f["offsets"]), f["start"], f["end"])
                  for f in report["findings"] if not drift_only or f["kind"] in drift)


def damaged(ingested: Ingested, tmp_path) -> str:
    copy = str(tmp_path / "copy")
    shutil.copytree(ingested.table, copy)
    return copy


def p0_row(table: str, offset: int) -> pa.Table:
    data = pads.dataset(DeltaTable(table).file_uris(), format="parquet").to_table()
    return data.filter(pc.and_(pc.equal(data["partition"], 0), pc.equal(data["offset"], offset)))


def test_ingested_table_is_clean_and_lists_the_skip_and_what_kafka_no_longer_holds(capsys, ingested):
    code, report = audit(capsys, ingested, None, "--all")
    assert code == 0 and not report["drift"], report
    assert found(report) == sorted([
        ("dead_lettered", 0, 1, (ingested.dead,), None, None),  # p1's dead letter is below its log start now
        ("skipped", 1, 2, (), 6, 8),  # on_data_loss="skip", recorded by batch 3
        ("unverifiable", 1, 6, (), 0, 6),  # batch 1's p1 range: below the log start now
    ])
    assert report["batches"] == [1, 2, 3] and report["checked_offsets"] == ingested.p0_end + 2
    # the result is recorded: status shows it, and the next default audit starts after it
    assert table_status(ingested.table, INGEST_ID, None).last_audit.through_version == report["through_version"]
    code, again = audit(capsys, ingested)
    assert code == 0 and again["batches"] == [] and again["checked_offsets"] == 0
    code, named = audit(capsys, ingested, None, "--since-last-audit")  # the default, by its name
    assert code == 0 and named["batches"] == [] and named["engine"] == "in_process"


def test_record_batch_headers_give_the_offsets_a_read_committed_consumer_is_delivered(ingested):
    """The audit's two Kafka reads agree, from each start and to each end, over committed, aborted
    and once-open transactions, their markers and an idempotent producer's batches (a fetch's first
    batch may begin before the start; a span may end inside a batch or at a marker)."""
    from airflow_eo.audit.coordinates import KafkaCoordinates

    with KafkaCoordinates({"bootstrap.servers": ingested.bootstrap}) as kafka:
        assert kafka.batches is not None  # a plain connection: the batch read is the one used
        for partition, low, high in ((0, 0, ingested.p0_end + 1), (1, 8, 11)):  # p1: 8 to its end, 10
            tp = TopicPartition(ingested.topic, partition)
            spans = [(start, high) for start in range(low, high)] + [(low, end) for end in range(low + 1, high)]
            for start, end in spans:
                got = kafka.batches.offsets(tp, start, end)  # NeedRecords here would fail the test
                assert got.tolist() == kafka.records.offsets(tp, start, end).tolist(), (partition, start, end)
        p0 = kafka.batches.offsets(TopicPartition(ingested.topic, 0), 0, ingested.p0_end).tolist()
        # 0-3 committed, 4 its marker, 5-7 aborted, 8 the abort marker, 9 the once-open transaction's
        # record, 10 and 11 plain, 12 that transaction's marker, 13 plain
        assert ingested.aborted == (5, 6, 7) and p0 == [0, 1, 2, 3, 9, 10, 11, 13]


def test_human_report_and_errors_exit_2(capsys, ingested, tmp_path):
    code = main(["audit", ingested.table, "--ingest-id", INGEST_ID, "--bootstrap-servers", ingested.bootstrap,
                 "--batches", "1"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and out[-1].startswith("audit clean:") and "batches 3..3" in out[-1]
    assert len(out) == 2 and out[0].startswith(f"{ingested.topic}[1]: ok: skipped 2 6..8 (batch 3)")
    assert main(["audit", str(tmp_path / "none"), "--ingest-id", INGEST_ID, "--bootstrap-servers",
                 ingested.bootstrap]) == 2
    assert "no Delta table" in capsys.readouterr().err


def test_row_appended_twice_removed_and_at_an_aborted_offset_are_reported_by_offset(capsys, ingested, tmp_path):
    table = damaged(ingested, tmp_path)
    write_deltalake(table, p0_row(table, 2), mode="append")  # offset 2 twice
    stray = p0_row(table, 3)
    aborted = ingested.aborted[1]
    stray = stray.set_column(stray.schema.get_field_index("offset"), "offset", pa.array([aborted], stray["offset"].type))
    write_deltalake(table, stray, mode="append")  # a row at an aborted record's offset
    gone = ingested.late
    DeltaTable(table).delete(f'"partition" = 0 AND "offset" = {gone}')  # rewrites the file without it
    code, report = audit(capsys, ingested, table, "--all")
    assert code == 1 and report["drift"]
    assert found(report, drift_only=True) == [
        ("duplicated", 0, 1, (2,), None, None), ("lost", 0, 1, (gone,), None, None),
        ("stray", 0, 1, (aborted,), None, None)]
    lost = next(f for f in report["findings"] if f["kind"] == "lost")
    assert lost["batch"] == 2


def commit_metadata_only(table: str, meta: BatchMetadata | None = None, txn: tuple[str, int] | None = None) -> None:
    dt = DeltaTable(table)
    dt.create_write_transaction([], mode="append", schema=dt.schema(), partition_by=dt.metadata().partition_columns,
                                commit_properties=CommitProperties(
                                    custom_metadata={METADATA_KEY: meta.to_json()} if meta else None,
                                    app_transactions=[Transaction(*txn)] if txn else None))


def test_overlapping_batch_and_txn_past_the_last_range(capsys, ingested, tmp_path):
    table = damaged(ingested, tmp_path)
    end = ingested.p0_end
    commit_metadata_only(table, BatchMetadata(INGEST_ID, 4, attempt_id=uuid.uuid4().hex[:16],
                                              ranges=(OffsetRange(ingested.topic, 0, end - 2, end),)))
    commit_metadata_only(table, txn=(partition_app_id(INGEST_ID, TopicPartition(ingested.topic, 0)), end + 3))
    code, report = audit(capsys, ingested, table, "--all")
    assert code == 1
    assert found(report, drift_only=True) == [
        ("overlap", 0, 2, (), end - 2, end), ("txn_mismatch", 0, 3, (), end, end + 3)]


def test_retention_that_deleted_the_start_of_an_audited_range_is_unverifiable_not_lost(capsys, ingested,
                                                                                        kafka_config, tmp_path):
    table = damaged(ingested, tmp_path)
    admin = AdminClient(kafka_config)
    for f in admin.delete_records([KTP(ingested.topic, 1, 9)]).values():  # batch 3's p1 range is 8..10
        f.result()
    code, report = audit(capsys, ingested, table, "--since-version", "0")
    assert code == 0 and not report["drift"]
    unverifiable = [(f["start"], f["end"], f["count"], f["batch"]) for f in report["findings"]
                    if f["kind"] == "unverifiable"]
    assert unverifiable == [(0, 6, 6, 1), (8, 9, 1, 3)]


def request(ingested: Ingested, table: str, **options) -> AuditRequest:
    return AuditRequest(table, INGEST_ID, {"bootstrap.servers": ingested.bootstrap}, selection=Selection.ALL,
                        dead_letter_table=ingested.dlq, record=False, **options)


def damage_p0(ingested: Ingested, table: str) -> tuple[int, int]:
    """Offset 2 of partition 0 twice, a row at an aborted record's offset, the late row removed."""
    write_deltalake(table, p0_row(table, 2), mode="append")
    stray = p0_row(table, 3)
    stray = stray.set_column(stray.schema.get_field_index("offset"), "offset",
                             pa.array([ingested.aborted[1]], stray["offset"].type))
    write_deltalake(table, stray, mode="append")
    DeltaTable(table).delete(f'"partition" = 0 AND "offset" = {ingested.late}')
    return ingested.aborted[1], ingested.late


def test_spark_tasks_on_either_path_find_what_this_process_finds(ingested, tmp_path, spark_path):
    table = damaged(ingested, tmp_path)
    aborted, gone = damage_p0(ingested, table)
    whole = run_audit(request(ingested, table))  # one slice per partition, in this process
    sliced = run_audit(request(ingested, table, slice_offsets=2))  # slices of 2 offsets: a row in each
    spark = SparkSlices(spark=spark_path.spark) if spark_path.name == "local" else SparkSlices(remote=spark_path.url)
    on_spark = run_audit(request(ingested, table, slice_offsets=2, spark_threshold=0), spark=spark)
    assert (whole.engine, sliced.engine, on_spark.engine) == ("in_process", "in_process", "spark")
    drift = [(f.kind.value, f.tp.partition, f.count, f.offsets) for f in whole.findings if f.drift]
    assert drift == [("duplicated", 0, 1, (2,)), ("lost", 0, 1, (gone,)), ("stray", 0, 1, (aborted,))]
    for other in (sliced, on_spark):
        assert other.findings == whole.findings
        assert (other.checked_offsets, other.rows_read) == (whole.checked_offsets, whole.rows_read)
        assert other.exit_code == 1


def test_a_small_audit_starts_no_spark_even_when_given_one(ingested, tmp_path):
    spark = SparkSlices(master="local[1]")  # would start a JVM in this process if it were used
    report = run_audit(request(ingested, ingested.table), spark=spark)  # 16 offsets, far below the threshold
    assert report.engine == "in_process" and report.exit_code == 0 and not spark.started


def test_the_command_and_the_operator_run_large_audits_on_the_spark_connect_server(capsys, ingested, connect_server,
                                                                                   monkeypatch):
    """`airflow-eo audit --remote` and the operator's `spark_conn_id` of the `spark_connect` type: the
    slices run as tasks on that server (a threshold of 0 makes this small table "large")."""
    from airflow_eo.operators.delta_kafka_audit import DeltaKafkaAuditOperator

    code, report = audit(capsys, ingested, None, "--all", "--remote", connect_server.url, "--spark-threshold", "0")
    _, here = audit(capsys, ingested, None, "--all", "--in-process")  # what Kafka holds now (other tests delete)
    assert code == 0 and report["engine"] == "spark" and here["engine"] == "in_process"
    assert report["findings"] == here["findings"] and report["checked_offsets"] == here["checked_offsets"] > 0
    host, port = connect_server.url.removeprefix("sc://").split(":")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_AUDIT", json.dumps({"conn_type": "spark_connect", "host": host,
                                                                "port": int(port)}))
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_AUDIT", json.dumps({"conn_type": "kafka",
                                                                "extra": {"bootstrap.servers": ingested.bootstrap}}))
    op = DeltaKafkaAuditOperator(task_id="audit", table_uri=ingested.table, ingest_id=INGEST_ID, audit_all=True,
                                 dead_letter_table_uri=ingested.dlq, kafka_conn_id="kafka_audit",
                                 spark_conn_id="spark_audit", spark_threshold=0)
    returned = op.execute({})
    assert returned["engine"] == "spark" and not returned["drift"] and returned["findings"] == report["findings"]
    small = DeltaKafkaAuditOperator(task_id="audit2", table_uri=ingested.table, ingest_id=INGEST_ID, audit_all=True,
                                    dead_letter_table_uri=ingested.dlq, kafka_conn_id="kafka_audit",
                                    spark_conn_id="spark_audit")  # 16 offsets, below the warm default of 1M
    assert small.execute({})["engine"] == "in_process"
