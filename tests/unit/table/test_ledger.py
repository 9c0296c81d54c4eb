"""The ledger read from Delta logs written here without Spark: offsets and counters in ``txn``
actions, batch records in commitInfo as the previous versions wrote them, and ``state_of``."""

from __future__ import annotations

import json
from dataclasses import asdict

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from airflow_eo.core.errors import ConfigError, TableError
from airflow_eo.core.planning import BatchPlan, CommitCheck
from airflow_eo.core.offsets import OffsetRange, RunIdentity, TopicPartition
from airflow_eo.table.ledger import Ledger, batch_of_path
from airflow_eo.table.app_ids import batch_app_id, partition_app_id, reprocess_app_id
from airflow_eo.table.metadata import METADATA_KEY
from tests.unit.fakes import Txn, ledger_table

INGEST = "orders_raw"
A, B = TopicPartition("orders", 0), TopicPartition("orders", 1)
RUN = RunIdentity("dag/run-1/ingest/-1", dag_id="dag", run_id="run-1", task_id="ingest", try_number=1)


def plan(batch: int, *ranges: OffsetRange, run: RunIdentity = RUN, attempt_id: str = "a1") -> BatchPlan:
    """``batch`` over ``ranges``; the first batch reads its partitions for the first time."""
    new = tuple(r.tp for r in ranges) if batch == 1 else ()
    return BatchPlan(INGEST, batch, ranges, run, new_partitions=new, planned_at="2026-11-24T00:00:00+00:00",
                     attempt_id=attempt_id)


def old_metadata(p: BatchPlan, rows: int, operation: str = "ingest") -> str:
    """commitInfo metadata exactly as the previous main wrote it (table/commit.py batch_metadata)."""
    return json.dumps({"files": 1, "bytes": 100, "ingest_id": p.ingest_id, "batch": p.batch,
                       "attempt_id": p.attempt_id, "operation": operation, "run": asdict(p.run),
                       "planned_at": p.planned_at, "ranges": [asdict(r) for r in p.ranges], "rows": rows,
                       "rows_per_partition": {"orders[0]": rows}, "skipped": []})


def commit_batch(uri: str, p: BatchPlan, rows: int) -> None:
    """A batch commit: its rows, the offsets at the plan's ends, the batch counter, its metadata."""
    data = pa.table({"topic": ["orders"] * rows, "partition": pa.array([0] * rows, pa.int32()),
                     "offset": pa.array(range(p.ranges[0].start, p.ranges[0].start + rows), pa.int64())})
    txns = [Transaction(partition_app_id(INGEST, r.tp), r.end) for r in p.ranges]
    write_deltalake(uri, data, mode="append", commit_properties=CommitProperties(
        app_transactions=[*txns, Transaction(batch_app_id(INGEST), p.batch)],
        custom_metadata={METADATA_KEY: old_metadata(p, rows)}))


def test_a_path_without_a_table_is_an_empty_ledger(tmp_path):
    ledger = Ledger.open(str(tmp_path / "new"))
    assert not ledger.exists and ledger.version is None and ledger.partition_columns == []
    assert ledger.committed_offsets(INGEST, [A]) == {A: None}
    assert ledger.last_batch(INGEST) == 0 and ledger.batches(INGEST) == [] and ledger.file_paths() == set()
    assert ledger.find_batch(INGEST, batch=1) is None
    ledger.check_writable(INGEST, ["date"])  # nothing to refuse yet


def test_offsets_and_counters_come_from_txn_actions(tmp_path):
    uri = str(tmp_path / "t")
    ledger_table(uri, Txn(partition_app_id(INGEST, A), 42), Txn(batch_app_id(INGEST), 7),
                 Txn(reprocess_app_id(INGEST, 3), 2))
    ledger = Ledger.open(uri)
    assert ledger.committed_offsets(INGEST, [A, B]) == {A: 42, B: None}
    assert ledger.committed_offsets("other", [A]) == {A: None}  # offsets are per ingest id
    assert (ledger.last_batch(INGEST), ledger.reprocess_count(INGEST, 3), ledger.reprocess_count(INGEST, 4)) == (7, 2, 0)
    ledger.check_owner(INGEST)


def test_a_table_another_ingest_wrote_is_refused(tmp_path):
    uri = str(tmp_path / "t")
    ledger_table(uri, Txn(batch_app_id("someone_else"), 1))
    with pytest.raises(TableError, match=f"was not written by ingest_id '{INGEST}'"):
        Ledger.open(uri).check_writable(INGEST)


def test_a_table_whose_txn_actions_expire_is_refused(tmp_path):
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"x": [1]}), configuration={"delta.setTransactionRetentionDuration": "interval 1 days"},
                    commit_properties=CommitProperties(app_transactions=[Transaction(batch_app_id(INGEST), 1)]))
    with pytest.raises(ConfigError, match="setTransactionRetentionDuration.*UNSET TBLPROPERTIES"):
        Ledger.open(uri).check_writable(INGEST)


def test_a_folder_of_other_files_is_not_taken_for_a_new_table(tmp_path):
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "orders.csv").write_text("id\n1\n")
    with pytest.raises(TableError, match="is not a Delta table .*orders.csv"):
        Ledger.open(str(tmp_path / "csv"))
    (tmp_path / "ours" / "_airflow_eo").mkdir(parents=True)  # a first attempt's own files are fine
    (tmp_path / "ours" / "b00000001-3f2a9c0d").mkdir()
    assert not Ledger.open(str(tmp_path / "ours")).exists


def test_an_unreadable_log_is_a_table_error(tmp_path):
    log = tmp_path / "t" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text("{not json\n")
    with pytest.raises(TableError, match="has a Delta log that cannot be read"):
        Ledger.open(str(tmp_path / "t"))


def test_state_of_a_plan_ready_committed_by_its_own_run_or_overtaken(tmp_path):
    uri = str(tmp_path / "t")
    first = plan(1, OffsetRange("orders", 0, 0, 10))
    assert Ledger.open(uri).state_of(first) is CommitCheck.READY
    commit_batch(uri, first, 10)
    ledger = Ledger.open(uri)
    assert ledger.state_of(first) is CommitCheck.ALREADY_COMMITTED
    assert ledger.state_of(first.with_attempt("a2")) is CommitCheck.ALREADY_COMMITTED  # a retry of the run
    other_run = plan(1, OffsetRange("orders", 0, 0, 10), run=RunIdentity("dag/run-2/ingest/-1"))
    assert ledger.state_of(other_run) is CommitCheck.CONFLICT  # same range, another run committed it
    assert ledger.state_of(plan(2, OffsetRange("orders", 0, 10, 20))) is CommitCheck.READY
    assert ledger.state_of(plan(2, OffsetRange("orders", 0, 5, 20))) is CommitCheck.CONFLICT  # a stale plan


def test_batch_records_read_what_the_previous_version_wrote(tmp_path):
    uri = str(tmp_path / "t")
    first, second = plan(1, OffsetRange("orders", 0, 0, 10)), plan(2, OffsetRange("orders", 0, 10, 15), attempt_id="a2")
    commit_batch(uri, first, 10)
    commit_batch(uri, second, 5)
    ledger = Ledger.open(uri)
    records = ledger.batches(INGEST)
    assert [(r.meta.batch, r.meta.rows, r.meta.attempt_id) for r in records] == \
        [(2, 5, "a2"), (1, 10, "a1")]  # newest first
    assert records[1].meta.ranges == (OffsetRange("orders", 0, 0, 10),) and records[1].meta.run_key == RUN.run_key
    assert ledger.find_batch(INGEST, attempt_id="a1").meta.batch == 1
    assert ledger.find_batch(INGEST, run_key=RUN.run_key, batch=2).version == ledger.version
    assert ledger.find_batch(INGEST, batch=3) is None and ledger.batches("other") == []
    assert len(ledger.file_paths()) == 2


def test_files_are_owned_by_the_batch_whose_attempt_directory_holds_them():
    assert batch_of_path("b00000012-3f2a9c0d1e6b4a52/part-0.parquet") == 12
    assert batch_of_path("date=2026-01-01/part-0.parquet") is None  # compacted: outside any attempt directory
    assert batch_of_path("part-0.parquet") is None


def test_a_snapshot_stays_pinned_while_others_commit(tmp_path):
    uri = str(tmp_path / "t")
    commit_batch(uri, plan(1, OffsetRange("orders", 0, 0, 10)), 10)
    pinned = Ledger.open(uri)
    commit_batch(uri, plan(2, OffsetRange("orders", 0, 10, 12)), 2)
    assert pinned.last_batch(INGEST) == 1 and pinned.committed_offsets(INGEST, [A]) == {A: 10}
    assert Ledger.open(uri).last_batch(INGEST) == 2 and DeltaTable(uri).version() == pinned.version + 1
