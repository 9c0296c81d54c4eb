"""Tables other Delta engines share (docs/how-to/shared-tables.md), end to end with the broker and Spark.

A table airflow-eo created is changed the way another engine changes it (a CHECK constraint and a NOT
NULL column in a metadata commit written per PROTOCOL.md, deltalake's alter API), then the next
ingest runs on spark-submit's in-process path, Spark Connect and the driver's own read; the table is
judged by DuckDB's delta extension (delta-kernel). The same records give the same result on every
path; each refusal is one line with the table's log unchanged.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from airflow_eo.core.errors import ConstraintViolationError, TableFeatureError
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.table.plan_log import PlanLog
from airflow_eo.table.storage import TableLocation
from tests.conftest import open_spark_path
from tests.delta_tables import add_features, duckdb_rows, log_digest
from tests.helpers import committed_offsets, new_topic

CHECK = "violates CHECK constraint offset_small: offset < 12"
NOT_NULL = "violates NOT NULL column key"


@pytest.fixture(params=["local", "connect", "driver"])
def path(request, spark):
    opened = open_spark_path(request, spark)
    yield opened
    opened.close()


class _SparkSubmit:
    """spark-submit as a path: each attempt a ``spark-submit`` of its own (``airflow-eo ingest``'s default)."""

    def submitter(self):
        from airflow_eo.submit.spark_submit import LocalSparkSubmit

        return LocalSparkSubmit("local[2]", conf={"spark.ui.enabled": "false"})


@pytest.fixture(params=["local", "connect", "driver", "spark-submit"])
def every_path(request, spark):
    """The paths the rules must hold on alike: spark-submit too."""
    if request.param == "spark-submit":
        yield _SparkSubmit()
        return
    opened = open_spark_path(request, spark)
    yield opened
    opened.close()


def produce(kafka_config: dict, topic: str, start: int, count: int, null_key_at: tuple[int, ...] = ()) -> None:
    """Records ``start``…: value ``v<i>``, key ``<i>`` (none for ``null_key_at``), partition ``i % 2``."""
    producer = Producer({**kafka_config, "enable.idempotence": True})
    for i in range(start, start + count):
        producer.produce(topic, key=None if i in null_key_at else str(i).encode(), value=f"v{i}".encode(),
                         partition=i % 2)
    producer.flush(30)


def constrained_table(kafka_config, tmp_path, path, ingestion, **options):
    """A table with one batch (offsets 0-9 of each partition), then a CHECK constraint ``offset < 12``
    and ``key`` NOT NULL added by another engine; 10 more records wait (offsets 10-14, one null key)."""
    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 0, 20)
    uri = str(tmp_path / "t")
    ing = ingestion(uri, [topic], kafka_config, path.submitter(), **options)
    assert ing.run(RunIdentity("first")).status is RunStatus.COMMITTED
    schema = json.loads(DeltaTable(uri).schema().to_json())
    for field in schema["fields"]:
        if field["name"] == "key":
            field["nullable"] = False
    add_features(uri, writer=("checkConstraints",), configuration={"delta.constraints.offset_small": "offset < 12"},
                 schema=schema)
    produce(kafka_config, topic, 20, 10, null_key_at=(21,))  # record 21: partition 1, offset 10
    return ing, uri, topic


def test_a_violating_record_fails_the_batch_naming_the_rule_and_offset(kafka_config, tmp_path, every_path, ingestion):
    ing, uri, topic = constrained_table(kafka_config, tmp_path, every_path, ingestion)
    before = log_digest(uri)
    with pytest.raises(ConstraintViolationError) as failed:
        ing.run(RunIdentity("second"))
    message = str(failed.value)
    assert f"record {topic}[0]@12 {CHECK}" in message and "(7 violating record(s) in all)" in message
    assert "\n" not in message and not failed.value.retryable
    assert log_digest(uri) == before and committed_offsets(uri, "test", topic, 2) == {0: 10, 1: 10}
    assert duckdb_rows(uri, "SELECT count(*) FROM t") == [(20,)]


def test_violating_records_go_to_the_dead_letter_table_with_the_rule(kafka_config, tmp_path, every_path, ingestion):
    dead_uri = str(tmp_path / "dead")
    ing, uri, topic = constrained_table(kafka_config, tmp_path, every_path, ingestion, dead_letter_table_uri=dead_uri)
    assert ing.run(RunIdentity("second")).status is RunStatus.COMMITTED
    assert committed_offsets(uri, "test", topic, 2) == {0: 15, 1: 15}
    kept = duckdb_rows(uri, 'SELECT "partition", "offset" FROM t WHERE "offset" >= 10 ORDER BY 1, 2')
    assert kept == [(0, 10), (0, 11), (1, 11)]
    assert duckdb_rows(uri, 'SELECT count(*) FROM t WHERE "offset" >= 12 OR key IS NULL') == [(0,)]
    dead = duckdb_rows(dead_uri, 'SELECT "partition", "offset", reason, CAST(value AS VARCHAR) FROM t ORDER BY 1, 2')
    assert dead == [(0, o, CHECK, f"v{20 + 2 * (o - 10)}") for o in (12, 13, 14)] + [(1, 10, NOT_NULL, "v21")] + \
        [(1, o, CHECK, f"v{21 + 2 * (o - 10)}") for o in (12, 13, 14)]


def test_merge_on_an_append_only_table_is_refused_before_spark(kafka_config, tmp_path, spark, ingestion):
    from airflow_eo.driver.main import InProcessSubmitter

    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 0, 4)
    uri = str(tmp_path / "t")
    sql = "SELECT topic, partition, offset, CAST(key AS STRING) AS id, CAST(value AS STRING) AS v FROM source"
    ing = ingestion(uri, [topic], kafka_config, InProcessSubmitter(spark), write_mode="merge", merge_key="id",
                    transform_sql=sql)
    assert ing.run(RunIdentity("first")).status is RunStatus.COMMITTED
    DeltaTable(uri).alter.set_table_properties({"delta.appendOnly": "true"})
    produce(kafka_config, topic, 4, 4)
    before = log_digest(uri)
    with pytest.raises(TableFeatureError, match="delta.appendOnly=true: a merge removes or rewrites rows") as refused:
        ing.run(RunIdentity("second"))
    assert "\n" not in str(refused.value) and not refused.value.retryable
    assert log_digest(uri) == before
    assert PlanLog(TableLocation.of(uri)).load(RunIdentity("second").run_key) is None  # refused before it planned


def test_a_generated_column_the_transform_leaves_out_is_computed(kafka_config, tmp_path, path, ingestion):
    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 0, 4)
    uri = str(tmp_path / "t")
    ing = ingestion(uri, [topic], kafka_config, path.submitter())
    assert ing.run(RunIdentity("first")).status is RunStatus.COMMITTED
    schema = json.loads(DeltaTable(uri).schema().to_json())
    schema["fields"].append({"name": "vlen", "type": "integer", "nullable": True,
                             "metadata": {"delta.generationExpression": "length(value)"}})
    add_features(uri, writer=("generatedColumns",), schema=schema)
    produce(kafka_config, topic, 4, 16)  # values v4…v19: 2 or 3 bytes
    assert ing.run(RunIdentity("second")).status is RunStatus.COMMITTED
    got = duckdb_rows(uri, 'SELECT vlen, length(CAST(value AS VARCHAR)) FROM t WHERE "offset" >= 2')
    assert len(got) == 16 and all(vlen == length for vlen, length in got)


def test_a_table_created_elsewhere_is_adopted_with_the_option(kafka_config, tmp_path, spark, ingestion):
    import pyarrow as pa
    from deltalake import write_deltalake

    from airflow_eo.driver.main import InProcessSubmitter
    from airflow_eo.core.errors import TableError

    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 0, 6)
    uri = str(tmp_path / "t")
    sql = "SELECT topic, partition, offset, CAST(value AS STRING) AS body FROM source"
    schema = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                        ("body", pa.string()), ("owner_note", pa.string())])
    write_deltalake(uri, pa.table({"topic": ["elsewhere"], "partition": pa.array([0], pa.int32()),
                                   "offset": pa.array([99], pa.int64()), "body": ["theirs"], "owner_note": ["kept"]},
                                  schema=schema))
    before = log_digest(uri)
    plain = ingestion(uri, [topic], kafka_config, InProcessSubmitter(spark), transform_sql=sql)
    with pytest.raises(TableError, match="not written by ingest_id 'test'.*adopt_table=True"):
        plain.run(RunIdentity("refused"))
    assert log_digest(uri) == before
    adopting = ingestion(uri, [topic], kafka_config, InProcessSubmitter(spark), transform_sql=sql, adopt_table=True,
                         starting_offsets="latest")
    first = adopting.run(RunIdentity("first"))  # offsets start at the latest: committed, no rows
    assert (first.status, first.rows) == (RunStatus.COMMITTED, 0)
    produce(kafka_config, topic, 6, 4)
    assert adopting.run(RunIdentity("second")).status is RunStatus.COMMITTED
    got = duckdb_rows(uri, 'SELECT topic, "offset", body, owner_note FROM t ORDER BY topic, "partition", "offset"')
    assert got[0] == ("elsewhere", 99, "theirs", "kept")
    assert sorted(r[2] for r in got[1:]) == [f"v{i}" for i in range(6, 10)] and all(r[3] is None for r in got[1:])
    assert plain.run(RunIdentity("later")).status is RunStatus.NOTHING_NEW  # now the ingest's own table


def test_a_merge_on_a_table_with_a_change_feed_and_deletion_vectors(kafka_config, tmp_path, path, ingestion):
    """Another engine turns the change feed on and deletes two keys with deletion vectors; the next merge
    batch (through deltalake's MERGE) keeps each key once, and the feed holds exactly its changes."""
    import pyarrow.parquet as pq

    from tests.changes import SQL, ChangeProducer
    from tests.delta_tables import delete_rows

    topic = new_topic(kafka_config, 2)
    changes = ChangeProducer(kafka_config, topic, partitions=2)
    uri = str(tmp_path / "t")
    ing = ingestion(uri, [topic], kafka_config, path.submitter(), write_mode="merge", merge_key="id", transform_sql=SQL)
    changes.write(range(20))
    changes.flush()
    assert ing.run(RunIdentity("b1")).status is RunStatus.COMMITTED
    add_features(uri, reader=("deletionVectors",), writer=("deletionVectors", "changeDataFeed"),
                 configuration={"delta.enableDeletionVectors": "true", "delta.enableChangeDataFeed": "true"})
    from airflow_eo.table.ledger import Ledger

    for rel in sorted(Ledger.open(uri).file_paths()):  # ids 0 and 1 deleted where they are, as a DELETE with vectors writes it
        ids = pq.read_table(f"{uri}/{rel}", columns=["id"])["id"].to_pylist()
        rows = [i for i, v in enumerate(ids) if v in ("0", "1")]
        if rows:
            delete_rows(uri, rel, rows)
    assert duckdb_rows(uri, "SELECT count(*) FROM t") == [(18,)]
    version = DeltaTable(uri).version()
    changes.write(range(5))  # 0 and 1 come back (inserts), 2-4 update
    changes.delete([10, 11])
    changes.write([30])
    changes.flush()
    result = ing.run(RunIdentity("b2"))
    assert (result.status, result.inserted, result.updated, result.deleted) == (RunStatus.COMMITTED, 3, 3, 2)
    ids = [r[0] for r in duckdb_rows(uri, "SELECT id FROM t ORDER BY CAST(id AS INT)")]
    assert ids == [str(i) for i in range(20) if i not in (10, 11)] + ["30"]  # each key once
    feed = pa.RecordBatchReader.from_stream(DeltaTable(uri).load_cdf(starting_version=version + 1)).read_all()
    got = sorted(zip(feed["_change_type"].to_pylist(), feed["id"].to_pylist()))
    assert got == sorted([("insert", "0"), ("insert", "1"), ("insert", "30"), ("delete", "10"), ("delete", "11"),
                          *[(k, str(i)) for i in (2, 3, 4) for k in ("update_preimage", "update_postimage")]])


def test_dedup_does_not_count_rows_another_engine_deleted(kafka_config, tmp_path, path, ingestion):
    """Keys 3 and 4 deleted with a deletion vector: their copies sent again are written (no longer in the
    table), key 5's is dropped as a duplicate."""
    import pyarrow.parquet as pq

    from airflow_eo.table.ledger import Ledger
    from tests.delta_tables import delete_rows

    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 0, 10)
    uri = str(tmp_path / "t")
    ing = ingestion(uri, [topic], kafka_config, path.submitter(), dedup_key="CAST(key AS STRING)")
    assert ing.run(RunIdentity("b1")).status is RunStatus.COMMITTED
    add_features(uri, reader=("deletionVectors",), writer=("deletionVectors",),
                 configuration={"delta.enableDeletionVectors": "true"})
    for rel in sorted(Ledger.open(uri).file_paths()):
        keys = pq.read_table(f"{uri}/{rel}", columns=["key"])["key"].to_pylist()
        rows = [i for i, k in enumerate(keys) if k in (b"3", b"4")]
        if rows:
            delete_rows(uri, rel, rows)
    producer = Producer({**kafka_config, "enable.idempotence": True})
    for i in (3, 4, 5):  # resent: the same keys at new offsets
        producer.produce(topic, key=str(i).encode(), value=f"again{i}".encode(), partition=i % 2)
    producer.flush(30)
    result = ing.run(RunIdentity("b2"))
    assert result.status is RunStatus.COMMITTED and result.duplicates == 1
    got = duckdb_rows(uri, "SELECT CAST(key AS VARCHAR), CAST(value AS VARCHAR) FROM t ORDER BY 1, 2")
    assert got == sorted([(str(i), f"v{i}") for i in range(10) if i not in (3, 4)] +
                         [("3", "again3"), ("4", "again4")])


def test_the_audit_names_rows_another_engine_deleted_with_the_commit(kafka_config, tmp_path, spark, ingestion):
    """The issue's case: a DELETE with deletion vectors on an append table, then `airflow-eo audit`: it reads
    the table as a Delta reader does (18 of 20 rows) and names the 2 deleted offsets with the commit, no drift."""
    import pyarrow.parquet as pq

    from airflow_eo.audit.findings import FindingKind
    from airflow_eo.audit.run import AuditRequest, Selection, run_audit
    from airflow_eo.driver.main import InProcessSubmitter
    from airflow_eo.table.ledger import Ledger
    from tests.delta_tables import delete_rows

    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 0, 20)
    uri = str(tmp_path / "t")
    ing = ingestion(uri, [topic], kafka_config, InProcessSubmitter(spark))
    assert ing.run(RunIdentity("b1")).status is RunStatus.COMMITTED
    add_features(uri, reader=("deletionVectors",), writer=("deletionVectors",),
                 configuration={"delta.enableDeletionVectors": "true"})
    deleted_at = None
    for rel in sorted(Ledger.open(uri).file_paths()):
        table = pq.read_table(f"{uri}/{rel}", columns=["partition", "offset"])
        rows = [i for i, (p, o) in enumerate(zip(table["partition"].to_pylist(), table["offset"].to_pylist()))
                if (p, o) in ((0, 3), (1, 4))]
        if rows:
            deleted_at = delete_rows(uri, rel, rows)
    assert duckdb_rows(uri, "SELECT count(*) FROM t") == [(18,)]
    report = run_audit(AuditRequest(uri, "test", kafka_config, selection=Selection.ALL, record=False))
    assert not report.drift, report.summary()
    deleted = sorted((f.tp.partition, f.offsets, f.detail) for f in report.findings if f.kind is FindingKind.DELETED)
    by = f"written by a batch, then deleted by version {deleted_at} (DELETE)"
    assert deleted == [(0, (3,), by), (1, (4,), by)]
    assert report.rows_read == 18


def test_a_column_renamed_under_column_mapping_keeps_its_values(kafka_config, tmp_path, path, ingestion):
    """The issue's case: column mapping turned on and ``v`` renamed ``payload`` by another engine; the next
    batch writes the physical name ``v`` with its field id, so every reader reads ``payload``; the audit
    reads the renamed table without drift."""
    import pyarrow.parquet as pq

    from airflow_eo.audit.run import AuditRequest, Selection, run_audit
    from airflow_eo.table.ledger import Ledger
    from tests.delta_tables import enable_column_mapping

    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 0, 6)
    uri = str(tmp_path / "t")
    base = "SELECT topic, partition, offset, CAST(value AS STRING) AS {} FROM source"
    assert ingestion(uri, [topic], kafka_config, path.submitter(), transform_sql=base.format("v")).run(
        RunIdentity("b1")).status is RunStatus.COMMITTED
    enable_column_mapping(uri, "name", rename={"v": "payload"})
    before = set(Ledger.open(uri).file_paths())
    produce(kafka_config, topic, 6, 6)
    ing = ingestion(uri, [topic], kafka_config, path.submitter(), transform_sql=base.format("payload"))
    assert ing.run(RunIdentity("b2")).status is RunStatus.COMMITTED
    got = duckdb_rows(uri, "SELECT payload FROM t ORDER BY payload")
    assert sorted(r[0] for r in got) == sorted(f"v{i}" for i in range(12))
    new = sorted(set(Ledger.open(uri).file_paths()) - before)
    assert new and all(pq.read_schema(f"{uri}/{p}").field("v").metadata[b"PARQUET:field_id"] == b"4" for p in new)
    report = run_audit(AuditRequest(uri, "test", kafka_config, selection=Selection.ALL, record=False))
    assert not report.drift and report.rows_read == 12, report.summary()


def test_an_adopted_table_in_column_mapping_id_mode_with_nested_and_partition_columns(kafka_config, tmp_path,
                                                                                       spark, ingestion):
    """A table another engine created in id mode (physical names col-…, nested fields mapped too,
    partitioned): adopted, its files get physical names and field ids everywhere, DuckDB (resolving by
    id) reads every value."""
    import uuid

    import pyarrow as pa
    from deltalake import write_deltalake

    from airflow_eo.driver.main import InProcessSubmitter
    from tests.delta_tables import metadata_action, write_commit

    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 0, 8)
    uri = str(tmp_path / "t")
    data = pa.struct([("a", pa.int64()), ("b", pa.string())])
    write_deltalake(uri, pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                                    ("data", data), ("day", pa.string())]).empty_table(), partition_by=["day"])
    ids = iter(range(1, 100))

    def mapped(field: dict) -> dict:
        field["metadata"] = {"delta.columnMapping.id": next(ids),
                             "delta.columnMapping.physicalName": f"col-{uuid.uuid4()}"}
        if isinstance(field["type"], dict):
            field["type"]["fields"] = [mapped(f) for f in field["type"]["fields"]]
        return field

    table = DeltaTable(uri)
    schema = json.loads(table.schema().to_json())
    schema["fields"] = [mapped(f) for f in schema["fields"]]
    config = {"delta.columnMapping.mode": "id", "delta.columnMapping.maxColumnId": str(next(ids) - 1)}
    write_commit(uri, [{"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["columnMapping"],
                                     "writerFeatures": ["columnMapping", "appendOnly", "invariants"]}},
                       metadata_action(table, config, schema)])
    sql = ("SELECT topic, partition, offset, named_struct('a', offset, 'b', CAST(value AS STRING)) AS data, "
           "CAST(partition AS STRING) AS day FROM source")
    ing = ingestion(uri, [topic], kafka_config, InProcessSubmitter(spark), transform_sql=sql, adopt_table=True,
                    partition_by=["day"])
    assert ing.run(RunIdentity("b1")).status is RunStatus.COMMITTED
    got = duckdb_rows(uri, 'SELECT "partition", "offset", data.a, data.b FROM t ORDER BY 1, 2')
    assert got == sorted((i % 2, i // 2, i // 2, f"v{i}") for i in range(8))
    # partition values: DuckDB's delta extension reads a partition column under column mapping as NULL
    # (duckdb/duckdb-delta#343: it looks the value up by the logical name; the protocol keys it by the
    # physical one, as here); deltalake's reader resolves it
    from deltalake import QueryBuilder

    days = QueryBuilder().register("t", DeltaTable(uri)).execute(
        'SELECT "partition", day, count(*) AS n FROM t GROUP BY 1, 2 ORDER BY 1').read_all()
    assert [tuple(r.values()) for r in pa.table(days).to_pylist()] == [(0, "0", 4), (1, "1", 4)]
    log = [json.loads(line) for line in open(f"{uri}/_delta_log/{DeltaTable(uri).version():020d}.json")]
    day = next(f for f in schema["fields"] if f["name"] == "day")["metadata"]["delta.columnMapping.physicalName"]
    assert all(set(a["add"]["partitionValues"]) == {day} for a in log if "add" in a)


def test_generated_columns_are_cast_to_their_type_and_nested_not_null_fields_are_checked(kafka_config, tmp_path,
                                                                                          path, ingestion):
    """Another engine adds a generated INT column from a BIGINT expression (delta-spark stores the value
    cast) and makes a field of a struct NOT NULL: the next batch computes the column in its type, and the
    record whose struct field is null goes to the dead letters naming the field."""
    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 0, 4)
    uri, dead_uri = str(tmp_path / "t"), str(tmp_path / "dead")
    sql = ("SELECT topic, partition, offset, named_struct('k', CAST(key AS STRING), 'v', CAST(value AS STRING)) "
           "AS meta FROM source")
    ing = ingestion(uri, [topic], kafka_config, path.submitter(), transform_sql=sql, dead_letter_table_uri=dead_uri)
    assert ing.run(RunIdentity("first")).status is RunStatus.COMMITTED
    schema = json.loads(DeltaTable(uri).schema().to_json())
    meta = next(f for f in schema["fields"] if f["name"] == "meta")
    next(f for f in meta["type"]["fields"] if f["name"] == "k")["nullable"] = False
    schema["fields"].append({"name": "o2", "type": "integer", "nullable": True,
                             "metadata": {"delta.generationExpression": "`offset` * 2"}})
    add_features(uri, writer=("generatedColumns",), schema=schema)
    produce(kafka_config, topic, 4, 6, null_key_at=(7,))  # record 7: partition 1, offset 3
    before = log_digest(uri)
    assert ing.run(RunIdentity("second")).status is RunStatus.COMMITTED
    assert log_digest(uri) != before
    got = duckdb_rows(uri, 'SELECT "partition", "offset", o2, typeof(o2), meta.k FROM t WHERE "offset" >= 2 ORDER BY 1, 2')
    assert got == [(p, o, o * 2, "INTEGER", str(2 * o + p)) for p, o in ((0, 2), (0, 3), (0, 4), (1, 2), (1, 4))]
    dead = duckdb_rows(dead_uri, 'SELECT "partition", "offset", reason FROM t')
    assert dead == [(1, 3, "violates NOT NULL column meta.k")]


def test_a_merge_and_its_reprocess_on_a_table_with_a_renamed_column(kafka_config, tmp_path, path, ingestion):
    """Another engine turns column mapping on and renames ``v`` to ``payload``; the next merge batch (its
    Spark tasks rewrite the files holding changed keys) and the reprocess of that batch keep the files'
    physical name ``v`` and its field id: every key once, with the value the Kafka model says, as DuckDB
    reads the table."""
    import pyarrow.parquet as pq

    from airflow_eo.loop.reprocess import Reprocessor
    from airflow_eo.table.ledger import Ledger
    from tests.changes import SQL, ChangeProducer, expected_rows
    from tests.delta_tables import enable_column_mapping

    topic = new_topic(kafka_config, 3)
    changes = ChangeProducer(kafka_config, topic)
    uri = str(tmp_path / "t")
    options = dict(write_mode="merge", merge_key="id")
    changes.write(range(20))
    changes.flush()
    first = ingestion(uri, [topic], kafka_config, path.submitter(), transform_sql=SQL, **options)
    assert first.run(RunIdentity("b1")).status is RunStatus.COMMITTED
    enable_column_mapping(uri, "name", rename={"v": "payload"})
    before = set(Ledger.open(uri).file_paths())
    ing = ingestion(uri, [topic], kafka_config, path.submitter(), transform_sql=SQL.replace(" AS v,", " AS payload,"),
                    **options)
    changes.write(range(5))
    changes.delete([10, 11])
    changes.write([30])
    changes.flush()
    result = ing.run(RunIdentity("b2"))
    assert (result.status, result.inserted, result.updated, result.deleted) == (RunStatus.COMMITTED, 1, 5, 2)
    assert result.files_rewritten >= 1

    def table() -> dict:
        got = duckdb_rows(uri, 'SELECT id, payload, topic, "partition", "offset" FROM t')
        assert len({r[0] for r in got}) == len(got), "a key held twice"
        return {r[0]: tuple(r[1:]) for r in got}

    expected = expected_rows(uri, "test", kafka_config["bootstrap.servers"], topic)
    assert table() == expected and len(expected) == 19
    new = sorted(set(Ledger.open(uri).file_paths()) - before)  # the upserts (field ids) and the copies (as were)
    assert new and all("v" in pq.read_schema(f"{uri}/{p}").names and "payload" not in pq.read_schema(f"{uri}/{p}").names
                       for p in new)
    upserts = [p for p in new if "-kept/" not in p]
    assert upserts and all(pq.read_schema(f"{uri}/{p}").field("v").metadata[b"PARQUET:field_id"] == b"2"
                           for p in upserts)
    assert Reprocessor(ing).run(RunIdentity("again"), target_run_key="b2").status == "reprocessed"
    assert table() == expected
