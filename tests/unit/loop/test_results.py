"""Every kind of run result built one way, from the committed record: ingest and reprocess on a
real Delta table with synthetic staged Parquet (no Spark, Kafka in memory), and a table written
in the previous version's shape (commit metadata and plan logs) continued by this code."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake.transaction import AddAction, CommitProperties, Transaction, create_table_with_add_actions

from airflow_eo.driver.batch import commit_staged
from airflow_eo.core.errors import SparkJobError
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.core.offsets import RunIdentity, TopicPartition
from airflow_eo.loop.reprocess import Reprocessor
from airflow_eo.sinks.dead_letters import ensure_table
from airflow_eo.table.commit import StagedBatch
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.metadata import METADATA_KEY, BatchFindings, BatchMetadata, CommitKind, DeadLetterManifest
from airflow_eo.table.app_ids import batch_app_id, partition_app_id
from airflow_eo.table.schema import delta_schema_of
from airflow_eo.table.staging import StagingArea, attempt_dir_name
from airflow_eo.table.storage import TableLocation
from tests.unit.fakes import FakeKafka

T0 = TopicPartition("orders", 0)
SCHEMA = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                    ("timestamp", pa.timestamp("us", tz="UTC")), ("value", pa.binary())])
BASE_MS = 1_767_225_600_000


def records(offsets, topic: str = "orders", partition: int = 0) -> pa.Table:
    offsets = list(offsets)
    return pa.table({"topic": [topic] * len(offsets), "partition": pa.array([partition] * len(offsets), pa.int32()),
                     "offset": pa.array(offsets, pa.int64()),
                     "timestamp": pa.array([(BASE_MS + o) * 1000 for o in offsets], pa.timestamp("us", tz="UTC")),
                     "value": [b"v%d" % o for o in offsets]}, schema=SCHEMA)


class FakeDriver:
    """The driver without Spark: stages the plan's records as Parquet (every fifth one "undecodable",
    to the dead-letter table when the ingest has one), then commits through the driver's own step 5."""

    def __init__(self):
        self.attempts = []

    def submit(self, attempt, secrets) -> None:
        self.attempts.append(attempt)
        plan = attempt.plan
        staging = StagingArea(TableLocation.of(attempt.table_uri, secrets.storage_options))
        staging.driver_started(attempt.attempt_id)
        offsets = [o for r in plan.data_ranges for o in range(r.start, r.end)]
        dlq = attempt.dead_letters.table_uri
        good = [o for o in offsets if not (dlq and o % 5 == 4)]
        target = staging.attempt_path(plan)
        os.makedirs(target)
        pq.write_table(records(good), os.path.join(target, "part-00000.parquet"))
        files = staging.staged_files(target)
        manifest = None
        if dlq:
            where = TableLocation.of(dlq)
            os.makedirs(where.join(attempt_dir_name(plan)))
            pq.write_table(records(o for o in offsets if o % 5 == 4),
                           os.path.join(where.join(attempt_dir_name(plan)), "part-00000.parquet"))
            ensure_table(dlq, SCHEMA)
            dead = StagingArea(where).staged_files(where.join(attempt_dir_name(plan)))
            manifest = DeadLetterManifest(dlq, tuple(f for f in dead if f.num_records))
        batch = StagedBatch(plan, tuple(files), staging.rows_per_partition(files), SCHEMA, attempt.partition_by)
        commit_staged(attempt, staging, batch, BatchFindings.of(attempt, manifest), secrets.storage_options)


@pytest.fixture
def kafka():
    fake = FakeKafka(orders=1)
    fake.produce(T0, *(BASE_MS + o for o in range(15)))
    return fake


@pytest.fixture
def make(ingestion, tmp_path, kafka):
    """An ingestion of ``orders`` into a table under tmp_path, its Spark a :class:`FakeDriver`."""
    def build(**options):
        driver = FakeDriver()
        base = ingestion(str(tmp_path / "orders"), "orders", dict(kafka.config), driver, ingest_id="orders_raw",
                         **options)
        return Ingestion(base.config, driver, kafka=kafka), driver
    return build


def captured_metrics(monkeypatch) -> dict[str, object]:
    """What ``metrics.emit_run_metrics`` sends to Airflow's Stats, by metric name (the Stats
    boundary replaced)."""
    from airflow_eo.operators import metrics

    emitted: dict[str, object] = {}

    class Stats:
        def __getattr__(self, kind):
            return lambda name, value, tags=None: emitted.setdefault(name, value)

    monkeypatch.setattr(metrics, "_stats", Stats)
    return emitted


def summary_fields(result) -> tuple:
    return result.files, result.bytes > 0, result.rows, result.dead_letters


def test_every_result_kind_carries_the_commit_fields(make, tmp_path, kafka):
    ing, driver = make(dead_letter_table_uri=str(tmp_path / "dlq"), value_schema="id INT", max_records_per_run=10)
    first = ing.run(RunIdentity("run-1"))
    assert first.status is RunStatus.COMMITTED and first.spark_started
    assert summary_fields(first) == (1, True, 8, 2) and first.seconds > 0  # offsets 4 and 9 are dead letters
    again = ing.run(RunIdentity("run-1"))
    assert again.status is RunStatus.ALREADY_COMMITTED and not again.spark_started
    assert summary_fields(again) == summary_fields(first) and again.version == first.version
    assert Ledger.open(str(tmp_path / "dlq")).transaction("airflow-eo:orders_raw:dlq") == 1  # followed the commit
    assert first.lag == {"orders[0]": 5}

    redo = Reprocessor(ing).run(RunIdentity("fix-1"), "run-1")
    assert redo.status is RunStatus.REPROCESSED and redo.spark_started and redo.batch == first.batch
    assert summary_fields(redo) == (1, True, 8, 2) and redo.seconds > 0 and redo.version > first.version
    requests = Reprocessor(ing).requests  # the retry of a task that died before it noted the request done:
    requests.record(replace(requests.load("fix-1"), done=False))
    retry = Reprocessor(ing).run(RunIdentity("fix-1"), "run-1")
    assert retry.status is RunStatus.ALREADY_REPROCESSED and not retry.spark_started
    assert summary_fields(retry) == summary_fields(redo) and len(driver.attempts) == 2
    assert ing.run(RunIdentity("run-2")).status is RunStatus.COMMITTED
    nothing = ing.run(RunIdentity("run-3"))
    assert nothing.status is RunStatus.NOTHING_NEW and nothing.batch is None and summary_fields(nothing) == (0, False, 0, 0)
    assert json.loads(json.dumps(redo.to_dict()))["status"] == "reprocessed"  # XCom keeps the plain string


def test_a_reprocess_result_counts_in_metrics_and_lineage(make, monkeypatch):
    from airflow_eo.operators import lineage, metrics

    ing, _ = make()
    ing.run(RunIdentity("run-1"))
    summary = Reprocessor(ing).run(RunIdentity("fix-1"), "run-1").to_dict()
    emitted = captured_metrics(monkeypatch)
    metrics.emit_run_metrics(summary)
    for name in ("records_committed", "bytes_committed", "batch_duration"):
        assert emitted[f"airflow_eo.{name}"], name
    out = lineage.table_dataset(ing.config.table_uri, [], summary)
    stats = out.outputFacets["outputStatistics"]
    assert (stats.rowCount, stats.fileCount) == (15, 1) and stats.size > 0


def test_a_reprocess_that_did_not_land_fails_and_changes_nothing(make):
    ing, driver = make()
    ing.run(RunIdentity("run-1"))
    before = Ledger.open(ing.config.table_uri).version

    class Dies(FakeDriver):
        def submit(self, attempt, secrets):
            raise RuntimeError("executor lost")

    broken = Ingestion(ing.config, Dies(), kafka=ing.kafka())
    with pytest.raises(SparkJobError, match="reprocess of batch 1 ended without committing"):
        Reprocessor(broken).run(RunIdentity("fix-1"), "run-1")
    assert Ledger.open(ing.config.table_uri).version == before


# -- tables written by the previous version (9e4587e) ---------------------------------------------

OLD_RUN = {"dag_id": "orders", "run_id": "manual__1", "run_key": "orders/manual__1/ingest/-1", "task_id": "ingest",
           "try_number": 1}


def old_plan_log(run: dict, batch: int, start: int, end: int, attempt_id: str = "") -> str:
    """BatchPlan.to_json() as 9e4587e wrote it (asdict, sorted keys) into the plan log."""
    return json.dumps({"attempt_id": attempt_id, "batch": batch, "closed_idle": [], "ingest_id": "orders_raw",
                       "interval": None, "new_partitions": [{"partition": 0, "topic": "orders"}] if start == 0 else [],
                       "planned_at": "2026-11-24T10:00:00+00:00",
                       "ranges": [{"end": end, "partition": 0, "start": start, "topic": "orders"}],
                       "run": run, "skipped": []}, sort_keys=True)


def write_old_table(uri: str) -> dict:
    """Batch 1 (offsets 0-10 of orders[0]) committed as 9e4587e's driver committed it; returns its metadata."""
    attempt_dir = "b00000001-4f1c2a9e0b7d"
    os.makedirs(os.path.join(uri, attempt_dir))
    path = f"{attempt_dir}/part-00000-old.snappy.parquet"
    pq.write_table(records(range(10)), os.path.join(uri, path))
    size = os.path.getsize(os.path.join(uri, path))
    stats = {"numRecords": 10, "minValues": {"topic": "orders", "partition": 0, "offset": 0},
             "maxValues": {"topic": "orders", "partition": 0, "offset": 9}, "nullCount": {}}
    meta = {  # batch_metadata(...) then the driver's extras, key for key
        "files": 1, "bytes": size, "ingest_id": "orders_raw", "batch": 1, "attempt_id": "4f1c2a9e0b7d",
        "operation": "ingest", "run": OLD_RUN, "planned_at": "2026-11-24T10:00:00+00:00",
        "ranges": [{"topic": "orders", "partition": 0, "start": 0, "end": 10}], "rows": 10,
        "rows_per_partition": {"orders[0]": 10}, "skipped": [],
    }
    create_table_with_add_actions(
        uri, delta_schema_of(SCHEMA), [AddAction(path, size, {}, int(time.time() * 1000), True, json.dumps(stats))],
        mode="error", commit_properties=CommitProperties(
            custom_metadata={METADATA_KEY: json.dumps(meta)},
            app_transactions=[Transaction(partition_app_id("orders_raw", T0), 10),
                              Transaction(batch_app_id("orders_raw"), 1)]))
    plans = os.path.join(uri, "_airflow_eo", "plans")
    os.makedirs(plans)
    digest = hashlib.sha256(OLD_RUN["run_key"].encode()).hexdigest()[:32]
    with open(os.path.join(plans, f"{digest}.json"), "w") as f:
        f.write(old_plan_log(OLD_RUN, 1, 0, 10))
    return meta


def test_a_table_of_the_previous_version_is_read_and_continued(make, tmp_path):
    old = write_old_table(str(tmp_path / "orders"))
    ing, driver = make()
    record = Ledger.open(ing.config.table_uri).find_batch("orders_raw", batch=1)
    assert record.meta.to_dict() == old and record.meta.run_key == OLD_RUN["run_key"]

    replay = ing.run(RunIdentity(**OLD_RUN))  # the old run's retry: its logged plan is committed
    assert replay.status is RunStatus.ALREADY_COMMITTED and not driver.attempts
    assert (replay.batch, replay.files, replay.bytes, replay.rows) == (1, 1, old["bytes"], 10)

    follow = ing.run(RunIdentity("orders/manual__2/ingest/-1"))
    assert follow.status is RunStatus.COMMITTED and follow.batch == 2 and follow.rows == 5
    assert follow.ranges == [{"topic": "orders", "partition": 0, "start": 10, "end": 15}]

    redo = Reprocessor(ing).run(RunIdentity("orders/manual__3/fix/-1"), OLD_RUN["run_key"])
    assert redo.status is RunStatus.REPROCESSED and (redo.batch, redo.rows, redo.files) == (1, 10, 1)
    ledger = Ledger.open(ing.config.table_uri)
    assert ledger.committed_offsets("orders_raw", [T0]) == {T0: 15} and ledger.last_batch("orders_raw") == 2
    assert not any(p.startswith("b00000001-4f1c2a9e0b7d/") for p in ledger.file_paths())  # its rows replaced


OLD_DOCUMENTS = [  # commit metadata as 9e4587e wrote it, one per kind (plus the oldest, before files/bytes)
    {"files": 2, "bytes": 2048, "ingest_id": "o", "batch": 3, "attempt_id": "ab12", "operation": "ingest",
     "run": OLD_RUN, "planned_at": "2026-11-24T10:00:00+00:00",
     "ranges": [{"topic": "orders", "partition": 0, "start": 5, "end": 9}], "rows": 3,
     "rows_per_partition": {"orders[0]": 3},
     "skipped": [{"topic": "orders", "partition": 1, "start": 0, "end": 4, "reason": "retention"}],
     "dead_letters": {"uri": "/t/dlq", "files": [{"path": "b00000003-ab12/p.parquet", "size": 10,
                                                  "modification_time": 1, "num_records": 1, "stats": "{}",
                                                  "partition_values": {}}]},
     "duplicates": {"records": 2, "to_dead_letters": False}, "late": {"records": 1, "oldest_ms": 1000}},
    {"files": 1, "bytes": 10, "ingest_id": "o", "batch": 3, "attempt_id": "cd34", "operation": "reprocess",
     "run": OLD_RUN, "planned_at": "", "ranges": [], "rows": 0, "rows_per_partition": {}, "skipped": [],
     "reprocess": {"from_version": 0, "removed_files": 2, "rewritten_shared_files": 0,
                   "requested_by": {"run_key": "r", "dag_id": None, "run_id": None, "task_id": None,
                                    "try_number": None}}},
    {"ingest_id": "o", "batch": 3, "operation": "dead_letters", "files": 1},
    {"ingest_id": "o", "batch": 3, "operation": "add_columns", "added": ["extra"]},
]


@pytest.mark.parametrize("document", OLD_DOCUMENTS, ids=lambda d: d["operation"])
def test_commit_metadata_of_the_previous_version_reads_and_writes_back_the_same(document):
    assert BatchMetadata.from_json(json.dumps(document)).to_dict() == document


def test_the_oldest_commit_metadata_reads_with_nothing_recorded():
    oldest = BatchMetadata.from_json('{"ingest_id": "o", "batch": 1, "attempt_id": "x", "run": {"run_key": "k"}, '
                                     '"ranges": [], "rows": 4, "rows_per_partition": {"orders[0]": 4}}')
    assert (oldest.operation, oldest.files, oldest.bytes, oldest.dead_letter_records, oldest.run_key) == \
        (CommitKind.BATCH, 0, 0, 0, "k")


def test_a_merge_result_reports_its_counts_in_the_summary_metrics_and_lineage(monkeypatch):
    from types import SimpleNamespace

    from airflow_eo.operators import lineage, metrics
    from airflow_eo.core.planning import BatchPlan
    from airflow_eo.loop.result import build_result
    from airflow_eo.table.ledger import BatchRecord
    from airflow_eo.table.metadata import MergeInfo

    meta = BatchMetadata("orders_raw", 2, files=1, bytes=10, rows=5,
                         merge=MergeInfo(("id",), changes=9, inserted=3, updated=2, deleted=4, files_rewritten=1))
    plan = BatchPlan("orders_raw", 2, (), RunIdentity("r"))
    summary = build_result(RunStatus.COMMITTED, plan, BatchRecord(7, None, meta), table_uri="/t", lag={}).to_dict()
    assert {k: summary[k] for k in ("write_mode", "rows", "inserted", "updated", "deleted", "files_rewritten")} == \
        {"write_mode": "merge", "rows": 5, "inserted": 3, "updated": 2, "deleted": 4, "files_rewritten": 1}
    appended = build_result(RunStatus.COMMITTED, plan, BatchRecord(7, None, replace(meta, merge=None)),
                            table_uri="/t", lag={}).to_dict()
    assert appended["write_mode"] == "append" and appended["deleted"] == 0
    emitted = captured_metrics(monkeypatch)
    metrics.emit_run_metrics(summary)
    assert [emitted[f"airflow_eo.{m}"] for m in ("rows_inserted", "rows_updated", "rows_deleted",
                                                "files_rewritten")] == [3, 2, 4, 1]
    source = SimpleNamespace(table_uri="/t", ingest_id="orders_raw", topics=("orders",), bootstrap_servers=None,
                             columns=())
    facet = lineage.ingest_lineage(summary, source).run_facets["airflow_eo"]
    assert facet.merge == {"inserted": 3, "updated": 2, "deleted": 4, "files_rewritten": 1}
    assert lineage.ingest_lineage(appended, source).run_facets["airflow_eo"].merge is None
