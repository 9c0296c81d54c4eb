"""Column mapping on every write path, without Spark: a table created with column mapping as delta-spark
creates one (tests/delta_tables.py: physical names ``col-<uuid>``, ids, nested fields too), batches staged
by the object-store writer (airflow_eo.driver.writer.task_writer, the executors' pyarrow writer), merge
and reprocess swaps (their copies of table files, statistics and partition values), airflow-eo's own
compaction; judged by DuckDB's delta extension and deltalake's QueryBuilder."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from airflow_eo.core.errors import CommitConflictError, TableFeatureError
from airflow_eo.core.planning import BatchPlan
from airflow_eo.core.offsets import OffsetRange, RunIdentity
from airflow_eo.spec import MergeSpec, WriteMode
from airflow_eo.sinks.append import BatchCommit, ReprocessCommit
from airflow_eo.sinks.merge import FileSwap, MergeCommit
from airflow_eo.table.commit import StagedBatch, commit
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.maintenance import MaintenancePlan, maintain
from airflow_eo.table.merge import DELETE_COLUMN, candidate_files, rewrite_file, with_key_stats
from airflow_eo.table.metadata import MergeInfo
from airflow_eo.table.staging import KEPT_SUFFIX, StagingArea, attempt_dir_name
from airflow_eo.table.storage import TableLocation
from tests.delta_tables import create_mapped_table, delete_rows, duckdb_rows, log_digest

INGEST = "events"
COMPACT = MaintenancePlan(compact=True, vacuum=False, checkpoint=False, cleanup_log=False, prune_orphans=False,
                          prune_records=False)


def plan(batch: int, start: int, end: int, attempt: str = "a") -> BatchPlan:
    r = OffsetRange("t", 0, start, end)
    return BatchPlan(INGEST, batch, (r,), RunIdentity(f"run-{batch}-{attempt}"),
                     new_partitions=(r.tp,) if batch == 1 else (), attempt_id=f"{attempt}{batch:015d}")


def stage_mapped(uri: str, p: BatchPlan, rows: pa.Table, partition_by: tuple[str, ...] = ()) -> StagedBatch:
    """``rows`` staged as an executor stages them on an object store: the table's physical names and ids."""
    from airflow_eo.driver.writer import staged_from_reports, task_writer

    ledger = Ledger.open(uri)
    staging = StagingArea(TableLocation.of(uri))
    target = staging.attempt_path(p)
    write = task_writer(uri, None, target, rows.schema, partition_by, ledger.features.names)
    reports = [r for b in write(iter(rows.to_batches()), task=0) for r in b.to_pylist()]
    files, per_partition = staged_from_reports(staging.loc, target, reports)
    return StagedBatch(p, tuple(files), per_partition, rows.schema, partition_by, ledger.features)


def offsets_rows(start: int, end: int, **columns) -> dict:
    n = end - start
    return {"topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(start, end), pa.int64()), **columns}


NESTED = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                    ("data", pa.struct([("a", pa.int64()), ("tags", pa.list_(pa.string())),
                                        ("items", pa.list_(pa.struct([("x", pa.string())])))])),
                    ("attrs", pa.map_(pa.string(), pa.struct([("v", pa.int64())]))), ("day", pa.string())])


@pytest.mark.parametrize("mode", ["id", "name"])
def test_the_object_store_writer_writes_lists_and_maps_nested_in_structs_by_physical_name(tmp_path, mode):
    """What was refused at staging before (a list or map column, a list inside a struct): written with every
    field's physical name and id, read back by DuckDB and deltalake."""
    uri = str(tmp_path / "t")
    create_mapped_table(uri, NESTED, mode, partition_by=["day"])
    rows = pa.table(offsets_rows(0, 4, data=[{"a": i, "tags": ["x"] * i, "items": [{"x": f"i{i}"}]} for i in range(4)],
                                 attrs=[[("k", {"v": i})] for i in range(4)], day=["d0", "d1", "d0", "d1"]),
                    schema=NESTED)
    staged = stage_mapped(uri, plan(1, 0, 4), rows, ("day",))
    assert commit(BatchCommit(staged, adopt_table=True), uri).status.value == "committed"
    names = Ledger.open(uri).features.names
    data = names.field("data")
    for f in staged.files:
        stored = pq.read_schema(f"{uri}/{f.path}")
        assert stored.names == [names.physical(c) for c in ("topic", "partition", "offset", "data", "attrs")]
        inner = stored.field(data.physical).type
        assert [inner.field(i).name for i in range(3)] == [data.child(n).physical for n in ("a", "tags", "items")]
        assert stored.field(data.physical).metadata[b"PARQUET:field_id"] == str(data.id).encode()
        assert f.path.split("/")[1].startswith(names.physical("day") + "=")
    got = duckdb_rows(uri, 'SELECT "offset", data.a, data.tags, data.items[1].x, attrs FROM t ORDER BY 1')
    assert got == [(i, i, ["x"] * i, f"i{i}", {"k": {"v": i}}) for i in range(4)]
    days = pa.table(QueryBuilder().register("t", DeltaTable(uri)).execute(
        'SELECT "offset", day FROM t ORDER BY 1').read_all()).to_pylist()
    assert [(r["offset"], r["day"]) for r in days] == [(0, "d0"), (1, "d1"), (2, "d0"), (3, "d1")]


FLAT = pa.schema([("id", pa.int64()), ("body", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
                  ("offset", pa.int64()), ("day", pa.string())])
KEY = ("id",)


def merge_batch(uri: str, p: BatchPlan, changes: dict[int, str | None]) -> MergeCommit:
    """A merge batch as the driver stages it (without Spark): the candidate files rewritten without the
    changed keys, the upserts staged, every file by the table's physical names."""
    ledger = Ledger.open(uri)
    names = ledger.features.names
    location = TableLocation.of(uri)
    keys = pa.table({"id": pa.array(list(changes), pa.int64()), DELETE_COLUMN: [v is None for v in changes.values()]})
    files, inside = candidate_files(ledger.add_actions(), keys, KEY, tuple(ledger.partition_columns))
    rewrites = [r for f in files
                if (r := rewrite_file(location, f, inside, KEY, attempt_dir_name(p) + KEPT_SUFFIX, (), names))]
    upserts = {k: v for k, v in changes.items() if v is not None}
    offsets = range(p.ranges[0].start, p.ranges[0].start + len(upserts))
    rows = pa.table({"id": pa.array(list(upserts), pa.int64()), "body": list(upserts.values()),
                     **offsets_rows(offsets.start, offsets.stop), "day": [f"d{k % 2}" for k in upserts]}, schema=FLAT)
    staged = stage_mapped(uri, p, rows, ("day",))
    staged = StagedBatch(p, tuple(with_key_stats(location, list(staged.files), KEY, names)), staged.rows_per_partition,
                         FLAT, ("day",), staged.features)
    updated = sum(r.updated for r in rewrites)
    info = MergeInfo(KEY, len(changes), len(upserts) - updated, updated, sum(r.deleted for r in rewrites), len(rewrites))
    return MergeCommit(staged, swap=FileSwap(tuple(rewrites), keys, KEY, frozenset(ledger.file_paths())), info=info,
                       merge=MergeSpec(WriteMode.MERGE, KEY), adopt_table=True)


@pytest.mark.parametrize("mode", ["id", "name"])
def test_a_merge_rewrites_files_of_a_mapped_table_by_physical_name(tmp_path, mode):
    """Files written by deltalake itself (random directories, partition values only in the log) and by
    airflow-eo: the merge finds the keys by the log's statistics and partition values, copies the files
    without them keeping their physical names and ids, removes them with the log's partition values."""
    uri = str(tmp_path / "t")
    create_mapped_table(uri, FLAT, mode, partition_by=["day"])
    write_deltalake(uri, pa.table({"id": pa.array([100, 101], pa.int64()), "body": ["x", "y"],
                                   **offsets_rows(900, 902), "day": ["d0", "d1"]}, schema=FLAT), mode="append")
    assert commit(merge_batch(uri, plan(1, 0, 4), {1: "a", 2: "b", 3: "c", 4: "d"}), uri).status.value == "committed"
    version = DeltaTable(uri).version()
    result = commit(merge_batch(uri, plan(2, 4, 8), {1: "A", 100: None, 4: None, 7: "g"}), uri)
    assert result.status.value == "committed"
    assert duckdb_rows(uri, "SELECT id, body FROM t ORDER BY id") == [(1, "A"), (2, "b"), (3, "c"), (7, "g"), (101, "y")]
    days = pa.table(QueryBuilder().register("t", DeltaTable(uri)).execute("SELECT id, day FROM t ORDER BY id")
                    .read_all()).to_pylist()
    assert [(r["id"], r["day"]) for r in days] == [(1, "d1"), (2, "d0"), (3, "d1"), (7, "d1"), (101, "d1")]
    names = Ledger.open(uri).features.names
    day = names.physical("day")
    log = [json.loads(line) for line in open(f"{uri}/_delta_log/{version + 1:020d}.json")]
    removes = [a["remove"] for a in log if "remove" in a]
    assert removes and all(set(r["partitionValues"]) == {day} for r in removes)
    copies = [a["add"] for a in log if "add" in a and KEPT_SUFFIX in a["add"]["path"]]
    assert copies and all(set(c["partitionValues"]) == {day} for c in copies)
    for c in copies:
        stats = json.loads(c["stats"])
        assert set(stats["minValues"]) >= {names.physical("id"), names.physical("offset")}
        stored = pq.read_schema(f"{uri}/{c['path']}")
        assert stored.field(names.physical("body")).metadata[b"PARQUET:field_id"] == str(names.field("body").id).encode()


def test_a_reprocess_replaces_a_batch_of_a_mapped_table_through_a_compacted_file(tmp_path):
    """Three batches, compacted by airflow-eo's own bin-packing (deltalake's OPTIMIZE refuses the table)
    into one file that mixes them; the reprocess of the middle batch copies that file without its rows."""
    uri = str(tmp_path / "t")
    schema = pa.schema([f for f in FLAT if f.name not in ("id", "day")])
    create_mapped_table(uri, schema, "name")
    for batch, (start, end) in enumerate(((0, 10), (10, 15), (15, 20)), start=1):
        rows = pa.table({"body": [f"v{o}" for o in range(start, end)], **offsets_rows(start, end)}, schema=schema)
        commit(BatchCommit(stage_mapped(uri, plan(batch, start, end), rows), adopt_table=True), uri)
    before = duckdb_rows(uri, 'SELECT "offset", body FROM t ORDER BY 1')
    done = maintain(uri, plan=COMPACT)["compaction"]
    assert (done["numFilesRemoved"], done["numFilesAdded"]) == (3, 1)
    assert duckdb_rows(uri, 'SELECT "offset", body FROM t ORDER BY 1') == before
    redo = pa.table({"body": [f"NEW{o}" for o in range(10, 15)], **offsets_rows(10, 15)}, schema=schema)
    staged = stage_mapped(uri, plan(2, 10, 15, attempt="r"), redo)
    assert commit(ReprocessCommit(staged, reprocess_from=0), uri).status.value == "committed"
    assert duckdb_rows(uri, 'SELECT "offset", body FROM t ORDER BY 1') == \
        [(o, f"NEW{o}" if 10 <= o < 15 else f"v{o}") for o in range(20)]


def test_compaction_of_a_mapped_table_leaves_files_with_deletion_vectors_and_refuses_z_order(tmp_path):
    from tests.delta_tables import add_features

    uri = str(tmp_path / "t")
    schema = pa.schema([f for f in FLAT if f.name != "id"])
    create_mapped_table(uri, schema, "id", partition_by=["day"])
    for batch in range(1, 5):
        start = (batch - 1) * 4
        rows = pa.table({"body": [f"v{o}" for o in range(start, start + 4)], **offsets_rows(start, start + 4),
                         "day": ["d0", "d0", "d1", "d1"]}, schema=schema)
        commit(BatchCommit(stage_mapped(uri, plan(batch, start, start + 4), rows, ("day",)), adopt_table=True), uri)
    add_features(uri, reader=("deletionVectors",), writer=("deletionVectors",),
                 configuration={"delta.enableDeletionVectors": "true"})
    first = sorted(Ledger.open(uri).file_paths())[0]
    delete_rows(uri, first, [0])
    before = log_digest(uri)
    with pytest.raises(TableFeatureError, match="column mapping.*compact without --z-order") as refused:
        maintain(uri, plan=MaintenancePlan(z_order=("offset",), vacuum=False, checkpoint=False, cleanup_log=False,
                                           prune_orphans=False, prune_records=False))
    assert "\n" not in str(refused.value) and log_digest(uri) == before
    rows_before = duckdb_rows(uri, 'SELECT "offset", body FROM t ORDER BY 1')
    assert len(rows_before) == 15
    done = maintain(uri, plan=COMPACT)["compaction"]
    assert (done["numFilesRemoved"], done["numFilesAdded"], done["skippedWithDeletionVectors"]) == (7, 2, 1)
    after = Ledger.open(uri)
    assert first in after.file_paths() and len(after.file_paths()) == 3
    assert duckdb_rows(uri, 'SELECT "offset", body FROM t ORDER BY 1') == rows_before
    log = [json.loads(line) for line in open(f"{uri}/_delta_log/{after.version:020d}.json")]
    assert all(not a[k]["dataChange"] for a in log for k in ("add", "remove") if k in a)
    from airflow_eo.audit.run import other_engines_changed_rows

    flagged = other_engines_changed_rows(after)  # what the audit names as other engines' row changes
    assert f"version {after.version - 1} (DELETE)" in flagged and not any(f"version {after.version} " in f
                                                                          for f in flagged)


def test_a_compaction_that_races_a_delete_of_one_of_its_files_commits_nothing(tmp_path, monkeypatch):
    """Another engine deletes a row (with a deletion vector) of a file the compaction packed, between its
    choice and its commit: the compaction gives up, so the deleted row does not come back."""
    import airflow_eo.table.compaction as compaction
    from tests.delta_tables import add_features

    uri = str(tmp_path / "t")
    schema = pa.schema([f for f in FLAT if f.name not in ("id", "day")])
    create_mapped_table(uri, schema, "name")
    for batch in (1, 2):
        rows = pa.table({"body": [f"v{o}" for o in range(batch * 5, batch * 5 + 5)],
                         **offsets_rows(batch * 5, batch * 5 + 5)}, schema=schema)
        commit(BatchCommit(stage_mapped(uri, plan(batch, batch * 5, batch * 5 + 5), rows), adopt_table=True), uri)
    add_features(uri, reader=("deletionVectors",), writer=("deletionVectors",),
                 configuration={"delta.enableDeletionVectors": "true"})
    write = compaction._write

    def deleted_meanwhile(location, files, names):
        written = write(location, files, names)
        delete_rows(uri, files[0].path, [0])
        return written

    monkeypatch.setattr(compaction, "_write", deleted_meanwhile)
    with pytest.raises(CommitConflictError, match="rows of 1 of its files were deleted meanwhile"):
        maintain(uri, plan=COMPACT)
    assert duckdb_rows(uri, "SELECT count(*) FROM t") == [(9,)]
    assert not [p for p in Ledger.open(uri).file_paths() if "compacted" in p]


@pytest.mark.parametrize("mode", ["id", "name"])
def test_deltalakes_merge_writes_physical_names_into_a_mapped_table(tmp_path, mode):
    """On a table with a change feed and deletion vectors, merge batches go through deltalake's MERGE: it
    writes the physical names, ids and partition values, and change files by physical name, keeping the
    rows another engine deleted deleted (verified here, not assumed)."""
    from tests.delta_tables import add_features

    uri = str(tmp_path / "t")
    create_mapped_table(uri, FLAT, mode, partition_by=["day"])
    commit(merge_batch(uri, plan(1, 0, 4), {1: "a", 2: "b", 3: "c", 4: "d"}), uri)
    add_features(uri, reader=("deletionVectors",), writer=("deletionVectors", "changeDataFeed"),
                 configuration={"delta.enableDeletionVectors": "true", "delta.enableChangeDataFeed": "true"})
    ledger = Ledger.open(uri)
    names = ledger.features.names
    holder = next(f for f in ledger.table_files().values() if f.partition_values == {"day": "d1"})
    ids = pq.read_table(f"{uri}/{holder.path}", columns=[names.physical("id")]).column(0).to_pylist()
    delete_rows(uri, holder.path, [ids.index(3)])  # id 3 deleted by another engine
    version = DeltaTable(uri).version()
    p = plan(2, 4, 7)
    staging = StagingArea(TableLocation.of(uri))
    target = staging.attempt_path(p)
    staging.loc.fs.create_dir(target, recursive=True)
    changes = {1: "A", 2: None, 5: "e"}  # the winners as the Spark path stages them for the MERGE (logical names)
    pq.write_table(pa.table({"id": pa.array(list(changes), pa.int64()), "body": list(changes.values()),
                             **offsets_rows(4, 7), "day": [f"d{k % 2}" for k in changes],
                             DELETE_COLUMN: [v is None for v in changes.values()]}), f"{target}/part-0.parquet")
    keys = pa.table({"id": pa.array(list(changes), pa.int64()), DELETE_COLUMN: [v is None for v in changes.values()]})
    staged = StagedBatch(p, tuple(staging.staged_files(target)), {"t[0]": 2}, FLAT, ("day",), Ledger.open(uri).features)
    rule = MergeCommit(staged, swap=FileSwap((), keys, KEY, frozenset()), info=MergeInfo(KEY, 3, engine=True),
                       merge=MergeSpec(WriteMode.MERGE, KEY), engine=True)
    assert commit(rule, uri).status.value == "committed"
    assert duckdb_rows(uri, "SELECT id, body FROM t ORDER BY id") == [(1, "A"), (4, "d"), (5, "e")]
    days = pa.table(QueryBuilder().register("t", DeltaTable(uri)).execute("SELECT id, day FROM t ORDER BY id")
                    .read_all()).to_pylist()
    assert [(r["id"], r["day"]) for r in days] == [(1, "d1"), (4, "d0"), (5, "d1")]
    log = [json.loads(line) for line in open(f"{uri}/_delta_log/{version + 1:020d}.json")]
    added = [a["add"] for a in log if "add" in a]
    assert added and all(set(a["partitionValues"]) == {names.physical("day")} for a in added)
    for a in added:
        stored = pq.read_schema(f"{uri}/{a['path']}")
        assert stored.names == [names.physical(c) for c in ("id", "body", "topic", "partition", "offset")]
        assert stored.field(0).metadata[b"PARQUET:field_id"] == str(names.field("id").id).encode()
    cdc = [a["cdc"]["path"] for a in log if "cdc" in a]
    changed = pa.concat_tables([pq.read_table(f"{uri}/{c}") for c in cdc])
    assert sorted(zip(changed["_change_type"].to_pylist(), changed[names.physical("id")].to_pylist())) == [
        ("delete", 2), ("insert", 5), ("update_postimage", 1), ("update_preimage", 1)]
