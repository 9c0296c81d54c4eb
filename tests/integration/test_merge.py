"""Merge by key (write_mode="merge") through the whole loop: real broker, both Spark paths, real Delta.

The table is checked after every batch against a plain-Python model of the broker's visible
records (tests/changes.py): last change per key wins, a tombstone removes it, aborted
transactions never count. Also: Debezium envelopes (JSON, both shapes; Avro through the
registry double), a compaction racing a merge, a partitioned table, reprocess, bad input.
"""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable, write_deltalake

from airflow_eo.audit.findings import FindingKind
from airflow_eo.audit.run import AuditRequest, Selection, run_audit
from airflow_eo.driver.main import InProcessSubmitter
from airflow_eo.core.errors import CommitConflictError, ConfigError, MergeKeyError
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.loop.config import IngestConfig
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.loop.reprocess import Reprocessor
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.maintenance import MaintenancePlan, maintain
from tests.changes import SQL, ChangeProducer, assert_model_holds, expected_rows, table_rows
from tests.helpers import new_topic, read_table
from airflow_eo.testing.registry import RegistryDouble

INGEST = "test"
# compaction only; it does not wait for the table's lease: it runs inside a batch's commit window, as one that
# stopped waiting (or an earlier version, which takes no lease) may
COMPACT = MaintenancePlan(vacuum=False, checkpoint=False, cleanup_log=False, prune_orphans=False, prune_records=False,
                          table_wait_timeout=0)


def merging(ingestion, table_uri, topic, kafka_config, submitter, **options):
    return ingestion(table_uri, topic, kafka_config, submitter, write_mode="merge", merge_key="id",
                     transform_sql=options.pop("transform_sql", SQL), **options)


def diff(before: dict, after: dict) -> tuple[int, int, int]:
    """(inserted, updated, deleted) between two states of the model."""
    inserted = len(set(after) - set(before))
    deleted = len(set(before) - set(after))
    updated = sum(1 for k in set(before) & set(after) if before[k][1:] != after[k][1:])
    return inserted, updated, deleted


def test_the_table_follows_the_model_batch_after_batch(broker, kafka_config, spark_path, tmp_path, ingestion):
    bootstrap = kafka_config["bootstrap.servers"]
    topic = new_topic(kafka_config, 3)
    changes = ChangeProducer(kafka_config, topic)
    ing = merging(ingestion, str(tmp_path / "t"), topic, kafka_config, spark_path.submitter())
    uri = str(tmp_path / "t")
    model: dict = {}

    def batch(run_key: str):
        nonlocal model
        result = ing.run(RunIdentity(run_key))
        assert result.status == "committed"
        assert_model_holds(uri, INGEST, bootstrap, topic)
        now = expected_rows(uri, INGEST, bootstrap, topic)
        assert (result.inserted, result.updated, result.deleted) == diff(model, now)
        assert result.rows == result.inserted + result.updated and result.write_mode == "merge"
        model = now
        return result

    # 1: 2,000 keys inserted (some twice), an aborted transaction that would have deleted some
    changes.write(range(2000))
    changes.write(range(0, 2000, 7))
    changes.transaction(writes=range(5000, 5050), deletes=range(100, 150), abort=True)
    changes.flush()
    first = batch("b1")
    assert first.inserted == 2000 and first.files_rewritten == 0
    # 2: updates, tombstones, a committed transaction of both, another aborted one
    changes.write(range(0, 2000, 3))
    changes.delete(range(1000, 1200))
    changes.transaction(writes=range(1100, 1120), deletes=range(10, 30))
    changes.transaction(writes=range(1300, 1400), deletes=range(1400, 1500), abort=True)
    changes.write(range(0, 2000, 5))
    changes.flush()
    second = batch("b2")
    assert second.deleted > 100 and second.updated > 500 and second.files_rewritten > 0
    # 3: deleted keys come back, and keys move partition (a changed partitioner): the later change wins
    changes.write(range(1000, 1100))
    for key in range(1500, 1520):
        changes.write([key])
        changes.moved[key] = (key + 1) % 3
        changes.write([key])
    changes.delete([1600])
    changes.flush()
    third = batch("b3")
    assert third.inserted >= 50 and {r[2] for k, r in model.items() if 1500 <= int(k) < 1520} == {0, 1, 2}
    assert ing.run(RunIdentity("b4")).status == "nothing_new"


def test_a_clear_replays_and_a_racing_run_is_refused(broker, kafka_config, spark, tmp_path, ingestion):
    bootstrap = kafka_config["bootstrap.servers"]
    topic = new_topic(kafka_config, 3)
    changes = ChangeProducer(kafka_config, topic)
    uri = str(tmp_path / "t")
    ing = merging(ingestion, uri, topic, kafka_config, InProcessSubmitter(spark))
    changes.write(range(300))
    changes.flush()
    assert ing.run(RunIdentity("r1")).status == "committed"
    version = DeltaTable(uri).version()
    # a clear reruns the same run key: its batch is found, nothing runs again
    again = ing.run(RunIdentity("r1"))
    assert again.status == "already_committed" and DeltaTable(uri).version() == version
    # a racing run planned from the same table state loses at the compare-and-set, changing nothing
    changes.write(range(0, 300, 2))
    changes.delete(range(250, 300))
    changes.flush()
    loser = ing.plan(RunIdentity("loser"))
    ing.plans.record(loser)
    assert ing.run(RunIdentity("winner")).status == "committed"
    with pytest.raises(CommitConflictError):
        ing.execute(loser)
    assert_model_holds(uri, INGEST, bootstrap, topic)
    # the audit of a merge table: the ranges tile, and the rows are what the merge commits recorded
    audit = AuditRequest(uri, INGEST, kafka_config, selection=Selection.ALL, record=False)
    clean = run_audit(audit)
    assert not clean.drift and "merge mode" in clean.note, clean.lines()
    # a row written again by another engine: its commit is named, and the rows are not counted against
    # the merge commits (another engine's writes are the table's to keep, not drift)
    row = read_table(uri).slice(0, 1)
    write_deltalake(uri, row, mode="append")
    shared = run_audit(audit)
    foreign = DeltaTable(uri).version()
    assert not shared.drift and shared.exit_code == 0, shared.lines()
    assert f"other engines changed rows (version {foreign} (WRITE))" in shared.note, shared.note
    assert not [f for f in shared.findings if f.kind is FindingKind.ROW_COUNT]


def test_a_compaction_racing_a_merge_fails_it_retryably_and_the_retry_lands(broker, kafka_config, spark, tmp_path,
                                                                            ingestion, monkeypatch):
    bootstrap = kafka_config["bootstrap.servers"]
    topic = new_topic(kafka_config, 3)
    changes = ChangeProducer(kafka_config, topic)
    uri = str(tmp_path / "t")
    ing = merging(ingestion, uri, topic, kafka_config, InProcessSubmitter(spark), max_offsets_per_task=100)
    for b in range(2):  # several batches (and tasks): several files
        changes.write(range(b * 200, b * 200 + 200))
        changes.flush()
        ing.run(RunIdentity(f"b{b}"))
    changes.write(range(0, 400, 4))
    changes.delete(range(1, 400, 9))
    changes.flush()
    compacted = []

    def compaction_in_the_window(name):
        if name == "during_commit" and not compacted:
            compacted.append(maintain(uri, plan=COMPACT)["compaction"])

    monkeypatch.setattr("airflow_eo.table.commit.failpoint", compaction_in_the_window)
    last = Ledger.open(uri).last_batch(INGEST)
    with pytest.raises(CommitConflictError, match="removed meanwhile") as raised:
        ing.run(RunIdentity("merge"))
    assert raised.value.retryable and compacted[0]["numFilesRemoved"] > 1
    assert Ledger.open(uri).last_batch(INGEST) == last
    assert_model_holds(uri, INGEST, bootstrap, topic)  # the compacted table, the batch not in it
    result = ing.run(RunIdentity("merge"))  # the retry: planned again from the compacted table
    assert result.status == "committed" and result.deleted > 0
    assert_model_holds(uri, INGEST, bootstrap, topic)


def test_a_partitioned_table_moves_a_row_between_partitions(broker, kafka_config, spark, tmp_path, ingestion):
    bootstrap = kafka_config["bootstrap.servers"]
    topic = new_topic(kafka_config, 3)
    changes = ChangeProducer(kafka_config, topic)
    uri = str(tmp_path / "t")
    sql = SQL.replace(" FROM source", ", CAST(get_json_object(CAST(value AS STRING), '$.v') AS BIGINT) % 2 AS parity "
                                      "FROM source")
    ing = merging(ingestion, uri, topic, kafka_config, InProcessSubmitter(spark), transform_sql=sql,
                  partition_by=["parity"])
    changes.write(range(100))
    changes.flush()
    ing.run(RunIdentity("p1"))
    changes.write(range(0, 100, 3))  # a new v: about half the rows change parity, i.e. partition
    changes.delete(range(50, 60))
    changes.flush()
    result = ing.run(RunIdentity("p2"))
    assert result.files_rewritten >= 1 and result.deleted == 10
    assert DeltaTable(uri).metadata().partition_columns == ["parity"]
    assert_model_holds(uri, INGEST, bootstrap, topic)
    parity = read_table(uri, ["v", "parity"])
    assert all(v % 2 == p for v, p in zip(parity["v"].to_pylist(), parity["parity"].to_pylist()))


def test_only_the_newest_batch_is_reprocessed(broker, kafka_config, spark, tmp_path, ingestion):
    bootstrap = kafka_config["bootstrap.servers"]
    topic = new_topic(kafka_config, 3)
    changes = ChangeProducer(kafka_config, topic)
    uri = str(tmp_path / "t")
    ing = merging(ingestion, uri, topic, kafka_config, InProcessSubmitter(spark))
    changes.write(range(50))
    changes.flush()
    ing.run(RunIdentity("r1"))
    changes.write(range(0, 50, 2))
    changes.delete([1, 3])
    changes.flush()
    ing.run(RunIdentity("r2"))
    with pytest.raises(ConfigError, match="reprocess of batch 1 refused: .* merge table and its newest batch is 2"):
        Reprocessor(ing).run(RunIdentity("again"), target_run_key="r1")
    before = table_rows(uri)
    result = Reprocessor(ing).run(RunIdentity("again"), target_run_key="r2")
    assert result.status == "reprocessed" and result.write_mode == "merge"
    assert table_rows(uri) == before  # the same records merged again: the same table
    assert_model_holds(uri, INGEST, bootstrap, topic)
    from airflow_eo.status import table_status

    status = table_status(uri, INGEST, kafka_config)
    assert status.write_mode.value == "merge" and status.to_dict()["write_mode"] == "merge"
    newest = status.batches[0]
    counts = newest.to_dict()
    assert newest.operation == "reprocess" and counts["updated"] == 25 and counts["deleted"] == 0
    assert "25 updated, 0 deleted" in newest.counts_text
    assert status.to_dict()["batches"][0]["updated"] == 25


def test_interval_mode_merges_intervals_oldest_first(broker, kafka_config, spark, tmp_path, ingestion):
    import time

    from airflow_eo.core.offsets import Interval

    hour = 3_600_000
    base = (int(time.time() * 1000) // hour - 5) * hour
    bootstrap = kafka_config["bootstrap.servers"]
    topic = new_topic(kafka_config, 3)
    changes = ChangeProducer(kafka_config, topic)
    changes.clock = base
    changes.write(range(60))
    changes.clock = base + hour
    changes.write(range(0, 60, 2))
    changes.delete(range(1, 60, 5))
    changes.clock = base + 2 * hour
    changes.write(range(3))
    changes.clock = base + 3 * hour + 60_000  # closes the third hour in every partition
    changes.write(range(3))
    changes.flush()
    uri = str(tmp_path / "t")
    ing = merging(ingestion, uri, topic, kafka_config, InProcessSubmitter(spark), mode="interval")

    def hour_of(i: int) -> Interval:
        return Interval(base + i * hour, base + (i + 1) * hour)

    assert ing.run(RunIdentity("h0"), hour_of(0)).inserted == 60
    assert ing.run(RunIdentity("h2"), hour_of(2)).updated == 3
    assert_model_holds(uri, INGEST, bootstrap, topic)
    with pytest.raises(ConfigError, match="starts before the end of its committed intervals"):
        ing.run(RunIdentity("h1"), hour_of(1))  # a backfill behind a later hour would undo its changes
    assert_model_holds(uri, INGEST, bootstrap, topic)


# -- Debezium ----------------------------------------------------------------------------------------
ROW_DDL = "id INT, name STRING"
DEBEZIUM_SQL = "SELECT id, name, op, ts_ms, topic, partition, offset FROM source"


def event(op: str, before: dict | None, after: dict | None, wrapped: bool) -> bytes:
    payload = {"before": before, "after": after, "op": op, "ts_ms": 1_767_225_600_000,
               "source": {"connector": "postgresql", "table": "customers"}}
    if wrapped:  # value.converter.schemas.enable=true
        return json.dumps({"schema": {"type": "struct", "name": "customers.Envelope"}, "payload": payload}).encode()
    return json.dumps(payload).encode()


def key_of(i: int, wrapped: bool) -> bytes:
    return json.dumps({"schema": {"type": "struct"}, "payload": {"id": i}} if wrapped else {"id": i}).encode()


def test_debezium_json_of_both_shapes_upserts_deletes_and_skips_tombstones(broker, kafka_config, spark_path, tmp_path,
                                                                           ingestion):
    topic = new_topic(kafka_config, 3)
    producer = Producer(kafka_config)
    sent = []
    for wrapped in (False, True):
        base = 10 if wrapped else 0
        sent += [
            (base + 1, event("r", None, {"id": base + 1, "name": "snapshot"}, wrapped)),
            (base + 1, event("u", {"id": base + 1, "name": "snapshot"}, {"id": base + 1, "name": "updated"}, wrapped)),
            (base + 2, event("c", None, {"id": base + 2, "name": "created"}, wrapped)),
            (base + 3, event("c", None, {"id": base + 3, "name": "gone"}, wrapped)),
            (base + 3, event("d", {"id": base + 3, "name": "gone"}, None, wrapped)),
            (base + 3, None),  # the tombstone Debezium writes after a delete: a no-op
            (base + 4, event("c", None, {"id": base + 4, "name": "keyed"}, wrapped)),
            (base + 4, event("d", None, None, wrapped)),  # no `before` (REPLICA IDENTITY off): the key says which
            (base + 5, event("t", None, None, wrapped)),  # truncate: not applied
        ]
    for key, value in sent:
        producer.produce(topic, key=key_of(key, key >= 10), value=value, partition=key % 3)
    producer.produce(topic, key=key_of(9, False), value=b'{"hello": 1}', partition=0)  # no change event
    producer.produce(topic, key=key_of(9, False), value=b"{not json", partition=0)
    producer.flush(30)
    uri, dlq = str(tmp_path / "customers"), str(tmp_path / "dlq")
    ing = ingestion(uri, topic, kafka_config, spark_path.submitter(), write_mode="merge", merge_key="id",
                    cdc_format="debezium", value_schema=ROW_DDL, key_format="json", key_schema="id INT",
                    dead_letter_table_uri=dlq, transform_sql=DEBEZIUM_SQL)
    result = ing.run(RunIdentity("cdc"))
    assert result.status == "committed" and result.dead_letters == 2
    rows = sorted((r["id"], r["name"], r["op"]) for r in read_table(uri, ["id", "name", "op"]).to_pylist())
    assert rows == [(1, "updated", "u"), (2, "created", "c"), (11, "updated", "u"), (12, "created", "c")]
    reasons = sorted(read_table(dlq, ["reason"])["reason"].to_pylist())
    assert reasons[0].startswith("value does not match value_schema") and \
        reasons[1] == "value is not a Debezium change event (op missing; expected c, u, d, r, t or m)"
    # a later delete of a key from an earlier batch, and its tombstone
    producer.produce(topic, key=key_of(2, False), value=event("d", {"id": 2, "name": "created"}, None, False),
                     partition=2)
    producer.produce(topic, key=key_of(2, False), value=None, partition=2)
    producer.flush(30)
    later = ing.run(RunIdentity("cdc-2"))
    assert (later.deleted, later.inserted, later.updated) == (1, 0, 0)
    assert sorted(read_table(uri, ["id"])["id"].to_pylist()) == [1, 11, 12]


ENVELOPE = json.dumps({"type": "record", "name": "Envelope", "namespace": "dbserver.inventory.customers", "fields": [
    {"name": "before", "type": ["null", {"type": "record", "name": "Value", "fields": [
        {"name": "id", "type": "int"}, {"name": "email", "type": "string"}]}], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "source", "type": {"type": "record", "name": "Source", "namespace": "io.debezium.connector.mysql",
                                "fields": [{"name": "db", "type": "string"}, {"name": "table", "type": "string"}]}},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": ["null", "long"], "default": None},
]})


def test_debezium_avro_through_the_registry(broker, kafka_config, spark, tmp_path, ingestion):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    registry = RegistryDouble().start()
    try:
        topic = new_topic(kafka_config, 3)
        serialize = AvroSerializer(SchemaRegistryClient({"url": registry.url}), ENVELOPE)
        context = SerializationContext(topic, MessageField.VALUE)
        source = {"db": "inventory", "table": "customers"}

        def change(op, before, after):
            return serialize({"before": before, "after": after, "source": source, "op": op, "ts_ms": 1}, context)

        producer = Producer(kafka_config)
        for key, value in [
            (1, change("r", None, {"id": 1, "email": "a@x"})),
            (2, change("c", None, {"id": 2, "email": "b@x"})),
            (1, change("u", {"id": 1, "email": "a@x"}, {"id": 1, "email": "a@y"})),
            (2, change("d", {"id": 2, "email": "b@x"}, None)),
            (2, None),
            (3, change("c", None, {"id": 3, "email": "c@x"})),
        ]:
            producer.produce(topic, key=str(key).encode(), value=value, partition=key % 3)
        producer.flush(30)
        uri = str(tmp_path / "customers")
        config = IngestConfig(table_uri=uri, ingest_id=INGEST, topics=[topic], kafka_config=kafka_config,
                              schema_registry={"url": registry.url}, value_format="avro", write_mode="merge",
                              merge_key="id", cdc_format="debezium", dead_letter_table_uri=str(tmp_path / "dlq"),
                              transform_sql="SELECT id, email, op, topic, partition, offset FROM source")
        result = Ingestion(config, InProcessSubmitter(spark)).run(RunIdentity("avro"))
        assert result.status == "committed" and result.dead_letters == 0
        rows = sorted((r["id"], r["email"], r["op"]) for r in read_table(uri, ["id", "email", "op"]).to_pylist())
        assert rows == [(1, "a@y", "u"), (3, "c@x", "c")]
    finally:
        registry.stop()


# -- bad input: one line, the table as it was --------------------------------------------------------
@pytest.fixture(scope="module")
def seeded_merge(tmp_path_factory, kafka_config, spark):
    """A merge table with one batch, the topic holding more; and an append table of the same topic."""
    topic = new_topic(kafka_config, 3)
    changes = ChangeProducer(kafka_config, topic)
    changes.write(range(20))
    changes.flush()
    base = tmp_path_factory.mktemp("seeded")
    merge_config = IngestConfig(table_uri=str(base / "merge"), ingest_id=INGEST, topics=[topic],
                                kafka_config=kafka_config, write_mode="merge", merge_key="id", transform_sql=SQL)
    append_config = IngestConfig(table_uri=str(base / "append"), ingest_id=INGEST, topics=[topic],
                                 kafka_config=kafka_config, transform_sql=SQL)
    for config in (merge_config, append_config):
        assert Ingestion(config, InProcessSubmitter(spark)).run(RunIdentity("seed")).status == "committed"
    changes.write(range(10, 30))
    changes.delete([0])
    changes.flush()
    return merge_config, append_config


@pytest.mark.parametrize("table, changes, error, message", [
    ("merge", {"transform_sql": "SELECT CAST(key AS STRING) AS other, topic, partition, offset FROM source"},
     ConfigError, "lacks the merge_key column(s) ['id']"),
    ("merge", {"transform_sql": SQL.replace("CAST(key AS STRING) AS id", "CAST(NULL AS STRING) AS id")},
     MergeKeyError, "have a null merge_key ['id']"),
    ("merge", {"delete_when": "value IS NUL L"}, ConfigError, "delete_when 'value IS NUL L' does not parse"),
    ("merge", {"delete_when": "length(value)"}, ConfigError, "is a integer, not a condition"),
    ("merge", {"write_mode": "append", "merge_key": None}, ConfigError, "is a merge table"),
    ("merge", {"merge_key": "id,v"}, ConfigError, "is not the key"),
    ("append", {"write_mode": "merge", "merge_key": "id"}, ConfigError, "holds appended batches"),
], ids=["key-not-produced", "null-key", "delete-when-parse", "delete-when-not-boolean", "append-on-merge-table",
        "other-key", "merge-on-append-table"])
def test_bad_input_fails_in_one_line_and_leaves_the_table(seeded_merge, spark, tmp_path, table, changes, error,
                                                          message):
    import dataclasses
    import shutil

    config = seeded_merge[0] if table == "merge" else seeded_merge[1]
    shutil.copytree(config.table_uri, tmp_path / "t")
    config = dataclasses.replace(config, table_uri=str(tmp_path / "t"))
    before = (DeltaTable(config.table_uri).version(), sorted(DeltaTable(config.table_uri).file_uris()))
    with pytest.raises(error) as failed:
        Ingestion(config.replace(**changes), InProcessSubmitter(spark)).run(RunIdentity("bad"))
    assert message in str(failed.value) and "\n" not in str(failed.value).strip()
    assert (DeltaTable(config.table_uri).version(), sorted(DeltaTable(config.table_uri).file_uris())) == before


def test_dedup_key_beside_a_merge_key_is_refused_before_anything_runs(kafka_config, tmp_path):
    with pytest.raises(ConfigError, match="dedup_key and merge_key do not go together"):
        IngestConfig(table_uri=str(tmp_path / "t"), ingest_id=INGEST, topics=["t"], kafka_config=kafka_config,
                     write_mode="merge", merge_key="id", dedup_key="CAST(key AS STRING)")
