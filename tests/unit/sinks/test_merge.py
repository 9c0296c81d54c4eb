"""The merge sink's commit (airflow_eo.sinks.merge.MergeCommit / MergeReprocessCommit) on temporary Delta
tables, with the batch's files written by pyarrow instead of Spark; races with a compaction; the
write mode a table keeps; and what deltalake itself does (not) detect, which the rule relies on."""

import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction

from airflow_eo.core.errors import CommitConflictError, ConfigError
from airflow_eo.core.planning import BatchPlan
from airflow_eo.core.offsets import OffsetRange, RunIdentity
from airflow_eo.spec import MergeSpec, WriteMode
from airflow_eo.sinks import table_sink
from airflow_eo.sinks.append import AppendSink, BatchCommit
from airflow_eo.sinks.base import check_mark
from airflow_eo.sinks.merge import FileSwap, MergeCommit, MergeReprocessCommit, MergeSink
from airflow_eo.table.commit import ALREADY_COMMITTED, COMMITTED, StagedBatch, commit
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.app_ids import merge_app_id, merge_mark
from airflow_eo.table.maintenance import MaintenancePlan, maintain
from airflow_eo.table.merge import DELETE_COLUMN, candidate_files, rewrite_file, with_key_stats
from airflow_eo.table.metadata import CommitKind, MergeInfo
from airflow_eo.table.staging import KEPT_SUFFIX, StagingArea, attempt_dir_name
from airflow_eo.table.storage import TableLocation

INGEST = "customers"
KEY = ("id",)
MERGE = MergeSpec(WriteMode.MERGE, KEY)
SCHEMA = pa.schema([("id", pa.int64()), ("body", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
                    ("offset", pa.int64())])


# -- what deltalake does underneath ------------------------------------------------------------------
def four_files(uri: str) -> list[dict]:
    for i in range(4):
        write_deltalake(uri, pa.table({"id": pa.array(range(i * 10, i * 10 + 10), pa.int64())}), mode="append")
    return pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()


def swap_first(table: DeltaTable, uri: str, files: list[dict], retries=None) -> None:
    """Remove the first file, add a new one (what a merge commit does), from ``table``'s snapshot."""
    name = f"new-{time.monotonic_ns()}.parquet"
    pq.write_table(pa.table({"id": pa.array([1], pa.int64())}), os.path.join(uri, name))
    now = int(time.time() * 1000)
    table.create_write_transaction(
        [RemoveAction(files[0]["path"], True, now, files[0]["size_bytes"], {}),
         AddAction(name, os.path.getsize(os.path.join(uri, name)), {}, now, True, None)],
        mode="append", schema=table.schema(), commit_properties=CommitProperties(max_commit_retries=retries))


def test_deltalake_rebases_a_remove_over_a_compaction_of_the_same_file_unless_told_not_to(tmp_path):
    """Why merge commits use max_commit_retries=0 and compare the files themselves (deltalake 1.6):
    a commit that removes a file a compaction already replaced lands (the compacted copy of its
    rows would stay), and so does a remove of a file no longer in the table; with no retries, a
    commit lands only on the snapshot it was made from."""
    uri = str(tmp_path / "rebased")
    files = four_files(uri)
    stale = DeltaTable(uri)
    DeltaTable(uri).optimize.compact()
    swap_first(stale, uri, files)  # no conflict
    assert DeltaTable(uri).version() == 5
    uri = str(tmp_path / "exact")
    files = four_files(uri)
    stale = DeltaTable(uri)
    DeltaTable(uri).optimize.compact()
    with pytest.raises(CommitFailedError):
        swap_first(stale, uri, files, retries=0)
    swap_first(DeltaTable(uri), uri, files, retries=0)  # removes a file the table no longer has: accepted
    assert DeltaTable(uri).version() == 5


def test_deltalake_refuses_a_compaction_after_a_commit_that_removed_a_file_it_read(tmp_path):
    uri = str(tmp_path / "t")
    files = four_files(uri)
    compaction = DeltaTable(uri)
    swap_first(DeltaTable(uri), uri, files)
    with pytest.raises(CommitFailedError):
        compaction.optimize.compact()


# -- merge batches by hand: what the driver does, without Spark --------------------------------------
def plan(batch: int, start: int, end: int, attempt: str = "a") -> BatchPlan:
    r = OffsetRange("cdc", 0, start, end)
    return BatchPlan(INGEST, batch, (r,), RunIdentity(f"run-{batch}-{attempt}"),
                     new_partitions=(r.tp,) if batch == 1 else (), attempt_id=f"{attempt}{batch:015d}")


def prepare(uri: str, p: BatchPlan, changes: dict[int, str | None], merge: MergeSpec = MERGE,
            reprocess_from: int | None = None) -> MergeCommit | MergeReprocessCommit:
    """The merge of ``changes`` (id → body, None: delete), one record each at the plan's offsets."""
    location = TableLocation.of(uri)
    staging = StagingArea(location)
    ledger = Ledger.open(uri)
    keys = pa.table({"id": pa.array(list(changes), pa.int64()), DELETE_COLUMN: [v is None for v in changes.values()]})
    files, inside = [], keys.slice(0, 0)
    if ledger.table is not None:
        files, inside = candidate_files(pa.table(ledger.table.get_add_actions(flatten=True)), keys, KEY)
    ranges = p.ranges if reprocess_from is not None else ()
    if ranges:
        whole, mixed = ledger.files_of_batch(p.batch, ranges)
        named = {f.path for f in files}
        files += [f for f in candidate_files(pa.table(ledger.table.get_add_actions(flatten=True)).filter(
            pa.array([path in {**whole, **mixed} and path not in named for path in
                      pa.table(ledger.table.get_add_actions(flatten=True))["path"].to_pylist()])),
            keys.slice(0, 0), KEY)[0]]
        inside = keys
    rewrites = [r for f in files if (r := rewrite_file(location, f, inside, KEY, attempt_dir_name(p) + KEPT_SUFFIX,
                                                       ranges))]
    upserts = [(k, v) for k, v in changes.items() if v is not None]
    offsets = dict(zip(changes, range(p.ranges[0].start, p.ranges[0].end)))
    target = staging.attempt_path(p)
    staging.loc.fs.create_dir(target, recursive=True)
    if upserts:
        pq.write_table(pa.table({"id": pa.array([k for k, _ in upserts], pa.int64()), "body": [v for _, v in upserts],
                                 "topic": ["cdc"] * len(upserts), "partition": pa.array([0] * len(upserts), pa.int32()),
                                 "offset": pa.array([offsets[k] for k, _ in upserts], pa.int64())}, schema=SCHEMA),
                       f"{target}/part-0.parquet")
    staged = with_key_stats(location, staging.staged_files(target), KEY)
    batch = StagedBatch(p, tuple(staged), {"cdc[0]": len(upserts)}, SCHEMA)
    swap = FileSwap(tuple(rewrites), keys, KEY, frozenset(ledger.file_paths()))
    info = MergeInfo(KEY, len(changes), len(upserts) - sum(r.updated for r in rewrites),
                     sum(r.updated for r in rewrites), sum(r.deleted for r in rewrites), len(rewrites))
    if reprocess_from is not None:
        return MergeReprocessCommit(batch, swap=swap, info=info, merge=merge, reprocess_from=reprocess_from)
    return MergeCommit(batch, swap=swap, info=info, merge=merge)


def table_rows(uri: str) -> list[tuple[int, str]]:
    out = []
    for path in DeltaTable(uri).file_uris():
        t = pq.read_table(path)
        out += zip(t["id"].to_pylist(), t["body"].to_pylist())
    return sorted(out)


def test_merge_batches_keep_one_row_per_key_and_record_what_they_did(tmp_path):
    uri = str(tmp_path / "t")
    assert commit(prepare(uri, plan(1, 0, 4), {1: "a", 2: "b", 3: "c", 4: "d"}), uri).status == COMMITTED
    table = DeltaTable(uri)
    assert table.transaction_version(merge_app_id(INGEST)) == merge_mark(KEY)
    outcome = commit(prepare(uri, plan(2, 4, 8), {2: "B", 3: None, 5: "e", 9: None}), uri)
    assert outcome.status == COMMITTED
    assert table_rows(uri) == [(1, "a"), (2, "B"), (4, "d"), (5, "e")]
    record = Ledger.open(uri).find_batch(INGEST, batch=2)
    assert record.meta.operation is CommitKind.BATCH and record.meta.ranges == plan(2, 4, 8).ranges
    merge = record.meta.merge
    assert (merge.key, merge.inserted, merge.updated, merge.deleted, merge.files_rewritten) == (KEY, 1, 1, 1, 1)
    assert Ledger.open(uri).committed_offsets(INGEST, [plan(2, 4, 8).ranges[0].tp]) == {plan(1, 0, 1).ranges[0].tp: 8}


def test_a_replayed_merge_commits_nothing_twice(tmp_path):
    uri = str(tmp_path / "t")
    first = prepare(uri, plan(1, 0, 2), {1: "a", 2: "b"})
    assert commit(first, uri).status == COMMITTED
    again = prepare(uri, plan(1, 0, 2), {1: "a", 2: "b"})
    assert commit(again, uri).status == ALREADY_COMMITTED
    assert table_rows(uri) == [(1, "a"), (2, "b")]


def test_a_compaction_between_reading_and_committing_makes_the_merge_fail_retryably(tmp_path):
    uri = str(tmp_path / "t")
    for b in range(1, 4):  # three files, one per batch
        commit(prepare(uri, plan(b, (b - 1) * 2, b * 2), {b * 10: "x", b * 10 + 1: "y"}), uri)
    pending = prepare(uri, plan(4, 6, 8), {10: "changed", 30: None})
    before = DeltaTable(uri).version()
    maintain(uri, plan=MaintenancePlan(vacuum=False, checkpoint=False, cleanup_log=False, prune_orphans=False,
                                       prune_records=False))
    assert DeltaTable(uri).version() == before + 1
    with pytest.raises(CommitConflictError, match="removed meanwhile") as raised:
        commit(pending, uri)
    assert raised.value.retryable
    assert table_rows(uri) == [(10, "x"), (11, "y"), (20, "x"), (21, "y"), (30, "x"), (31, "y")]
    assert Ledger.open(uri).last_batch(INGEST) == 3
    # the retry reads the compacted table and lands
    assert commit(prepare(uri, plan(4, 6, 8, "b"), {10: "changed", 30: None}), uri).status == COMMITTED
    assert table_rows(uri) == [(10, "changed"), (11, "y"), (20, "x"), (21, "y"), (31, "y")]


def test_a_merge_compares_again_when_the_table_moved_while_it_committed(tmp_path, monkeypatch):
    uri = str(tmp_path / "t")
    commit(prepare(uri, plan(1, 0, 2), {1: "a", 100: "z"}), uri)
    pending = prepare(uri, plan(2, 2, 3), {1: "A"})
    other = plan(1, 0, 1)  # another ingest appends to the same table: a file far from key 1
    other = BatchPlan("other", 1, other.ranges, other.run, new_partitions=other.new_partitions, attempt_id="o" * 16)
    staging = StagingArea(TableLocation.of(uri))
    staging.loc.fs.create_dir(staging.attempt_path(other), recursive=True)
    pq.write_table(pa.table({"id": pa.array([500], pa.int64()), "body": ["o"], "topic": ["cdc"],
                             "partition": pa.array([0], pa.int32()), "offset": pa.array([0], pa.int64())}, schema=SCHEMA),
                   f"{staging.attempt_path(other)}/part-0.parquet")
    files = with_key_stats(staging.loc, staging.staged_files(staging.attempt_path(other)), KEY)
    windows = []

    def other_commit_lands(name):  # in the window between the compare and the Delta write
        windows.append(name)
        if len(windows) == 1:
            DeltaTable(uri).create_write_transaction(
                [AddAction(f.path, f.size, {}, f.modification_time, True, f.stats) for f in files], mode="append",
                schema=DeltaTable(uri).schema())

    monkeypatch.setattr("airflow_eo.table.commit.failpoint", other_commit_lands)
    assert commit(pending, uri).status == COMMITTED
    assert windows == ["during_commit", "during_commit"]  # compared twice, committed on the second snapshot
    assert table_rows(uri) == [(1, "A"), (100, "z"), (500, "o")]


def test_a_file_added_meanwhile_that_may_hold_a_changed_key_is_a_conflict(tmp_path):
    uri = str(tmp_path / "t")
    commit(prepare(uri, plan(1, 0, 2), {1: "a", 2: "b"}), uri)
    pending = prepare(uri, plan(2, 2, 3), {7: "new"})  # a new key: no file to rewrite
    # a reprocess of batch 1 lands meanwhile, and its new file may hold key 7 (its ids span 1..7)
    assert commit(prepare(uri, plan(1, 0, 2, "r"), {1: "a2", 7: "b2"}, reprocess_from=0), uri).status == COMMITTED
    with pytest.raises(CommitConflictError, match="added since it read the table may hold keys"):
        commit(pending, uri)
    assert table_rows(uri) == [(1, "a2"), (7, "b2")]


def test_only_the_newest_batch_of_a_merge_table_is_reprocessed(tmp_path):
    uri = str(tmp_path / "t")
    commit(prepare(uri, plan(1, 0, 2), {1: "a", 2: "b"}), uri)
    commit(prepare(uri, plan(2, 2, 4), {2: "B", 3: "c"}), uri)
    with pytest.raises(ConfigError, match="reprocess of batch 1 refused: .* newest batch is 2"):
        commit(prepare(uri, plan(1, 0, 2, "r"), {1: "a2", 2: "b2"}, reprocess_from=0), uri)
    outcome = commit(prepare(uri, plan(2, 2, 4, "r"), {2: "B2", 3: None}, reprocess_from=0), uri)
    assert outcome.status == COMMITTED
    # batch 2's own rows go (by offset) and its changes apply again; batch 1's key 1 stays
    assert table_rows(uri) == [(1, "a"), (2, "B2")]
    record = Ledger.open(uri).find_batch(INGEST, batch=2, operation=CommitKind.REPROCESS)
    assert record.meta.reprocess.from_version == 0 and record.meta.merge.key == KEY


def test_a_table_keeps_its_write_mode_and_merge_key(tmp_path):
    merged, appended = str(tmp_path / "m"), str(tmp_path / "a")
    commit(prepare(merged, plan(1, 0, 1), {1: "a"}), merged)
    ledger = Ledger.open(merged)
    check_mark(ledger, INGEST, KEY)
    with pytest.raises(ConfigError, match="is a merge table .* keep write_mode='merge'"):
        check_mark(ledger, INGEST, None)
    with pytest.raises(ConfigError, match=r"merge_key \['id', 'tenant'\] is not the key .* \(it is \['id'\]\)"):
        check_mark(ledger, INGEST, ("id", "tenant"))
    p = plan(1, 0, 1)
    staging = StagingArea(TableLocation.of(appended))
    staging.loc.fs.create_dir(staging.attempt_path(p), recursive=True)
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "body": ["a"], "topic": ["cdc"],
                             "partition": pa.array([0], pa.int32()), "offset": pa.array([0], pa.int64())}, schema=SCHEMA),
                   f"{staging.attempt_path(p)}/part-0.parquet")
    commit(BatchCommit(StagedBatch(p, tuple(staging.staged_files(staging.attempt_path(p))), {"cdc[0]": 1}, SCHEMA)),
           appended)
    check_mark(Ledger.open(appended), INGEST, None)
    assert table_sink(Ledger.open(appended), INGEST) is AppendSink and table_sink(ledger, INGEST) is MergeSink
    with pytest.raises(ConfigError, match="holds appended batches .* needs a new table"):
        check_mark(Ledger.open(appended), INGEST, KEY)
    with pytest.raises(ConfigError, match="holds appended batches"):  # at commit time too
        commit(prepare(appended, plan(2, 1, 2), {1: "b"}), appended)
