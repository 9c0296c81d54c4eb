"""A table's Delta features (airflow_eo.table.features) on temporary tables changed the way other
engines change them (tests/delta_tables.py): each claim of the docs' feature matrix checked against
the installed deltalake, with DuckDB's delta extension as the independent reader; the refusals
before planning and at the commit, one line each, with the table's log unchanged."""

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, Transaction

from airflow_eo.core.errors import CommitConflictError, TableError, TableFeatureError
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.sinks.append import BatchCommit
from airflow_eo.table.commit import commit, refused_by_engine
from airflow_eo.table.features import SUPPORT, Support, TableFeatures, TableUse
from airflow_eo.table.ledger import Ledger
from tests.delta_tables import add_features, delete_rows, duckdb_rows, log_digest
from tests.unit.table.test_commit import INGEST, RUN2, batch_plan, stage

PAGE = Path(__file__).parents[3] / "docs" / "how-to" / "shared-tables.md"
# PROTOCOL.md's appendix "Valid Feature Names in Table Features", and the features described after it
PROTOCOL_FEATURES = (
    "appendOnly", "invariants", "checkConstraints", "generatedColumns", "allowColumnDefaults", "changeDataFeed",
    "columnMapping", "identityColumns", "deletionVectors", "rowTracking", "timestampNtz", "domainMetadata",
    "v2Checkpoint", "catalogManaged", "icebergCompatV1", "icebergCompatV2", "clustering", "vacuumProtocolCheck",
    "inCommitTimestamp", "typeWidening", "variantType", "variantShredding",
)


def test_every_protocol_feature_is_in_the_matrix_and_the_docs_page_is_the_matrix():
    assert set(PROTOCOL_FEATURES) <= set(SUPPORT)
    text = PAGE.read_text()
    section = text[text.index("<!-- matrix:"):text.index("<!-- /matrix -->")]
    rows = re.findall(r"^\| `([\w-]+)` \| (\w+) \| (.*) \|$", section, re.M)
    assert [(name, support) for name, support, _ in rows] == [(f.name, f.support.value) for f in SUPPORT.values()]
    assert all(how == SUPPORT[name].how for name, _, how in rows)


def first_batch(uri: str) -> None:
    commit(BatchCommit(stage(uri, batch_plan(1, 0, 10))), uri)


def second_batch(uri: str):
    staged = stage(uri, batch_plan(2, 10, 15, run=RUN2))
    return commit(BatchCommit(staged), uri)


# what turns each supported feature on (a property or a column's metadata), per PROTOCOL.md
ACTIVATION = {
    "appendOnly": {"delta.appendOnly": "true"},
    "changeDataFeed": {"delta.enableChangeDataFeed": "true"},
    "deletionVectors": {"delta.enableDeletionVectors": "true"},
    "columnMapping": {"delta.columnMapping.mode": "none"},
}
READER_FEATURES = {"columnMapping", "deletionVectors", "timestampNtz", "v2Checkpoint", "catalogManaged",
                   "catalogOwned-preview", "vacuumProtocolCheck", "typeWidening", "typeWidening-preview",
                   "variantType", "variantType-preview", "variantShredding", "variantShredding-preview"}


@pytest.mark.parametrize("name", list(SUPPORT))
def test_the_matrix_claim_holds_against_the_installed_deltalake(tmp_path, name):
    """Supported: a batch appends and DuckDB reads it. Refused: refused before planning in one line with
    the log unchanged, and deltalake itself would not commit to it (catalog-managed: not even open it)."""
    uri = str(tmp_path / "t")
    first_batch(uri)
    reader = (name,) if name in READER_FEATURES else ()
    add_features(uri, reader=reader, writer=(name,), configuration=ACTIVATION.get(name))
    before = log_digest(uri)
    claim = SUPPORT[name].support
    if name in ("catalogManaged", "catalogOwned-preview") and claim is Support.REFUSED:
        with pytest.raises(TableError, match="catalog"):
            Ledger.open(uri).check_writable(INGEST, use=TableUse.APPEND)
        assert log_digest(uri) == before
        return
    ledger = Ledger.open(uri)
    if claim is Support.REFUSED:
        with pytest.raises(TableFeatureError, match=re.escape(name)) as refused:
            ledger.check_writable(INGEST, use=TableUse.APPEND)
        assert "\n" not in str(refused.value) and "nothing was changed" in str(refused.value)
        with pytest.raises(TableFeatureError):  # the commit checks again on its own snapshot
            second_batch(uri)
        assert log_digest(uri) == before
        engine_refuses = "deltalake" in SUPPORT[name].how
        if engine_refuses:  # the claim "deltalake cannot write it", on deltalake directly
            table = DeltaTable(uri)
            with pytest.raises(CommitFailedError, match="Unsupported table features"):
                table.create_write_transaction([], "append", table.schema(), commit_properties=CommitProperties(
                    app_transactions=[Transaction("probe", 1)]))
        return
    ledger.check_writable(INGEST, use=TableUse.APPEND)
    assert second_batch(uri).version == DeltaTable(uri).version()
    assert duckdb_rows(uri, "SELECT count(*), min(\"offset\"), max(\"offset\") FROM t") == [(15, 0, 14)]


def test_an_unknown_feature_and_a_newer_protocol_are_refused(tmp_path):
    uri = str(tmp_path / "t")
    first_batch(uri)
    add_features(uri, writer=("someFutureFeature",))
    with pytest.raises(TableFeatureError, match="'someFutureFeature' is unknown"):
        Ledger.open(uri).check_writable(INGEST, use=TableUse.APPEND)
    assert "newer than the Delta protocol" in TableFeatures(reader_version=4).refusal(TableUse.APPEND)


def test_append_only_refuses_what_removes_rows_and_allows_appends(tmp_path):
    uri = str(tmp_path / "t")
    first_batch(uri)
    DeltaTable(uri).alter.set_table_properties({"delta.appendOnly": "true"})
    ledger = Ledger.open(uri)
    for use in (TableUse.MERGE, TableUse.REPROCESS):
        with pytest.raises(TableFeatureError, match=f"delta.appendOnly=true: a {use.value} removes"):
            ledger.check_writable(INGEST, use=use)
    for use in (TableUse.APPEND, TableUse.DEDUP, TableUse.MAINTAIN):
        ledger.check_writable(INGEST, use=use)
    assert second_batch(uri).status.value == "committed"


def test_change_data_feed_sends_merge_and_reprocess_through_deltalakes_merge(tmp_path):
    uri = str(tmp_path / "t")
    first_batch(uri)
    DeltaTable(uri).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    ledger = Ledger.open(uri)
    for use in TableUse:
        ledger.check_writable(INGEST, use=use)
        assert ledger.features.engine_for(use) is use.removes_rows
    assert second_batch(uri).status.value == "committed"  # an append needs no change files
    inserted = pa.RecordBatchReader.from_stream(DeltaTable(uri).load_cdf(starting_version=2)).read_all()
    assert sorted(inserted["offset"].to_pylist()) == list(range(10, 15))
    assert set(inserted["_change_type"].to_pylist()) == {"insert"}


def test_constraints_invariants_not_null_and_generated_columns_are_read(tmp_path):
    uri = str(tmp_path / "t")
    first_batch(uri)
    DeltaTable(uri).alter.add_constraint({"offset_small": "`offset` < 150"})
    schema = json.loads(DeltaTable(uri).schema().to_json())
    for f in schema["fields"]:
        if f["name"] == "body":
            f["nullable"] = False
            f["metadata"] = {"delta.invariants": json.dumps({"expression": {"expression": "length(body) > 0"}})}
    schema["fields"].append({"name": "o2", "type": "long", "nullable": True,
                             "metadata": {"delta.generationExpression": "`offset` * 2"}})
    add_features(uri, writer=("checkConstraints", "invariants", "generatedColumns"), schema=schema)
    features = Ledger.open(uri).features
    assert [(c.kind.value, c.name) for c in features.constraints] == [
        ("CHECK constraint", "offset_small"), ("invariant", "body"), ("NOT NULL column", "body")]
    assert [(g.name, g.expression, g.type) for g in features.generated] == [("o2", "`offset` * 2", '"long"')]
    assert features.enforced and features.constraints[0].reason == "violates CHECK constraint offset_small: offset < 150"


def test_not_null_fields_and_invariants_inside_structs_are_read_as_delta_spark_reads_them():
    """Through structs only (a NOT NULL field inside an array's element is no column delta-spark checks); a
    nested field's rule names its path, and a null struct fails its NOT NULL field (delta-spark's rule)."""
    invariant = {"delta.invariants": json.dumps({"expression": {"expression": "`a b`.c.d > 0"}})}
    inner = {"type": "struct", "fields": [{"name": "d", "type": "long", "nullable": False, "metadata": invariant}]}
    fields = [{"name": "a b", "type": {"type": "struct", "fields": [
        {"name": "c", "type": inner, "nullable": True, "metadata": {}},
        {"name": "e", "type": "string", "nullable": False, "metadata": {}},
        {"name": "l", "type": {"type": "array", "containsNull": True, "elementType": {"type": "struct", "fields": [
            {"name": "x", "type": "string", "nullable": False, "metadata": {}}]}}, "nullable": True, "metadata": {}},
    ]}, "nullable": True, "metadata": {}}]
    features = TableFeatures.of_parts(1, 2, (), (), {}, fields)
    assert [(c.kind.value, c.name, c.expression) for c in features.constraints] == [
        ("invariant", "a b.c.d", "`a b`.c.d > 0"),
        ("NOT NULL column", "a b.c.d", "`a b`.`c`.`d` IS NOT NULL"),
        ("NOT NULL column", "a b.e", "`a b`.`e` IS NOT NULL")]


def test_the_features_an_attempt_carries_are_the_tables_as_read(tmp_path):
    """Pinned at plan time, through the attempt's JSON (its marker), typed again in the driver."""
    from airflow_eo.attempt import Attempt
    from airflow_eo.core.planning import BatchPlan
    from airflow_eo.spec import IngestSpec
    from tests.delta_tables import enable_column_mapping

    uri = str(tmp_path / "t")
    first_batch(uri)
    DeltaTable(uri).alter.add_constraint({"offset_small": "`offset` < 150"})
    enable_column_mapping(uri, rename={"body": "payload"})
    features = Ledger.open(uri).features
    spec = IngestSpec.of(table_uri=uri, ingest_id=INGEST, topics="orders")
    attempt = Attempt(BatchPlan(INGEST, 2, (), RunIdentity("r"), attempt_id="a" * 16), spec,
                      features=features.pinned())
    back = TableFeatures.of_pinned(Attempt.from_json(attempt.to_json()).features)
    assert back == features and back.names.physical("payload") == "body"
    assert [c.name for c in back.constraints] == ["offset_small"] and back.names.field("payload").id == 4


def with_deletion_vectors(uri: str, rows: list[int]) -> str:
    """The table, upgraded to deletion vectors, with ``rows`` of its first file deleted by one (as a
    DELETE on Databricks writes it); returns that file's path."""
    add_features(uri, reader=("deletionVectors",), writer=("deletionVectors",),
                 configuration={"delta.enableDeletionVectors": "true"})
    path = sorted(Ledger.open(uri).file_paths())[0]
    delete_rows(uri, path, rows)
    return path


def test_deletion_vectors_are_applied_by_reads_until_compacted(tmp_path):
    from airflow_eo.table.files import read_columns, snapshot_files
    from airflow_eo.table.storage import TableLocation

    uri = str(tmp_path / "t")
    first_batch(uri)
    path = with_deletion_vectors(uri, [0, 2])
    ledger = Ledger.open(uri)
    assert ledger.features.files_with_deletion_vectors == 1 and ledger.deleted_rows() == {path: (0, 2)}
    files = snapshot_files(ledger.add_actions(), ledger.deleted_rows())
    offsets = sorted(o for f in files for b in read_columns(TableLocation.of(uri), f, pa.schema([("offset", pa.int64())]),
                                                            batch_rows=1) for o in b["offset"].to_pylist())
    assert [(o,) for o in offsets] == duckdb_rows(uri, 'SELECT "offset" FROM t ORDER BY 1') and len(offsets) == 8
    for use in (TableUse.MERGE, TableUse.REPROCESS):  # through deltalake's MERGE
        ledger.check_writable(INGEST, use=use)
        assert ledger.features.engine_for(use)
    for use in (TableUse.DEDUP, TableUse.AUDIT, TableUse.MAINTAIN):  # they read without the deleted rows
        ledger.check_writable(INGEST, use=use)
    assert second_batch(uri).status.value == "committed"  # appends proceed
    DeltaTable(uri).optimize.compact()  # what `airflow-eo maintain --compact` runs
    after = Ledger.open(uri)
    assert after.features.files_with_deletion_vectors == 0
    assert duckdb_rows(uri, "SELECT count(*) FROM t") == [(13,)]


def test_a_reprocess_on_a_table_with_deletion_vectors_and_a_change_feed_goes_through_deltalakes_merge(tmp_path):
    """The old file with a deletion vector is removed with its descriptor (no row twice), and the
    change feed holds exactly the reprocess's update images."""
    from airflow_eo.sinks.append import ReprocessCommit

    uri = str(tmp_path / "t")
    first_batch(uri)
    second_batch(uri)
    with_deletion_vectors(uri, [0])
    DeltaTable(uri).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    version = DeltaTable(uri).version()
    redo = stage(uri, batch_plan(1, 0, 10, attempt_id="r1"), body="NEW", files=1)
    outcome = commit(ReprocessCommit(redo, reprocess_from=0, engine=True), uri)
    assert outcome.status.value == "committed"
    got = duckdb_rows(uri, 'SELECT "offset", body FROM t ORDER BY 1')
    assert got == [(o, f"NEW{o}") for o in range(10)] + [(o, f"v{o}") for o in range(10, 15)]
    changes = pa.RecordBatchReader.from_stream(DeltaTable(uri).load_cdf(starting_version=version + 1)).read_all()
    kinds = sorted(zip(changes["_change_type"].to_pylist(), changes["offset"].to_pylist()))
    # offset 0 was deleted by the vector: the reprocess (from Kafka) inserts it again; the others update
    assert kinds == sorted([("insert", 0), *[(k, o) for o in range(1, 10) for k in ("update_postimage",
                                                                                  "update_preimage")]])
    assert Ledger.open(uri).reprocess_count(INGEST, 1) == 1


def test_a_commit_the_engine_refuses_is_not_a_lost_race(tmp_path, monkeypatch):
    """rowTracking turned on between the plan's check and the commit's write: deltalake refuses the
    commit, which fails without retry instead of reading as a lost race."""
    uri = str(tmp_path / "t")
    first_batch(uri)
    staged = stage(uri, batch_plan(2, 10, 15, run=RUN2))
    monkeypatch.setattr("airflow_eo.sinks.append.check_features", lambda *a: None)  # the window after the check
    add_features(uri, writer=("rowTracking", "domainMetadata"))
    before = log_digest(uri)
    with pytest.raises(TableFeatureError, match="refused batch 2's commit.*Unsupported table features"):
        commit(BatchCommit(staged), uri)
    assert log_digest(uri) == before
    assert refused_by_engine(CommitFailedError("The transaction includes Remove action with data change but "
                                               "Delta table is append-only"))
    assert not refused_by_engine(CommitFailedError("Tried committing existing table version: 3"))


def test_a_constraint_added_while_the_batch_ran_makes_the_commit_a_conflict(tmp_path):
    uri = str(tmp_path / "t")
    first_batch(uri)
    from dataclasses import replace

    staged = replace(stage(uri, batch_plan(2, 10, 15, run=RUN2)), features=Ledger.open(uri).features)
    DeltaTable(uri).alter.add_constraint({"offset_small": "`offset` < 150"})
    before = log_digest(uri)
    with pytest.raises(CommitConflictError, match="constraints, generated columns, .* changed while batch 2 ran"):
        commit(BatchCommit(staged), uri)
    assert log_digest(uri) == before


def test_a_table_created_elsewhere_is_adopted_only_when_asked(tmp_path):
    uri = str(tmp_path / "t")
    foreign = pa.table({"topic": ["other"], "partition": pa.array([0], pa.int32()), "offset": pa.array([7], pa.int64()),
                        "body": ["theirs"], "note": pa.array([None], pa.string())})
    write_deltalake(uri, foreign)
    before = log_digest(uri)
    with pytest.raises(TableError, match="not written by ingest_id .* adopt_table=True"):
        commit(BatchCommit(stage(uri, batch_plan(1, 0, 10))), uri)
    assert log_digest(uri) == before
    outcome = commit(BatchCommit(stage(uri, batch_plan(1, 0, 10)), adopt_table=True), uri)
    assert outcome.status.value == "committed"
    ledger = Ledger.open(uri)
    ledger.check_owner(INGEST)  # the first batch made it this ingest's
    assert ledger.last_batch(INGEST) == 1
    got = duckdb_rows(uri, "SELECT topic, \"offset\", body, note FROM t ORDER BY topic, \"offset\"")
    assert got[-1] == ("other", 7, "theirs", None) and [r[1] for r in got[:-1]] == list(range(10))
    assert all(r[3] is None for r in got)  # the column the batch lacks reads as null


def test_a_merge_on_a_table_with_deletion_vectors_and_a_change_feed_goes_through_deltalakes_merge(tmp_path):
    """Winners staged with their delete flag, applied by deltalake's MERGE in one commit with the offsets:
    rows another engine deleted stay deleted, the change feed holds the batch's changes, the counts come
    from the MERGE, and the compare-and-set holds (a replay commits nothing, a stale plan conflicts)."""
    import pyarrow.parquet as pq

    from airflow_eo.sinks.merge import FileSwap, MergeCommit
    from airflow_eo.table.commit import StagedBatch
    from airflow_eo.table.merge import DELETE_COLUMN
    from airflow_eo.table.staging import StagingArea
    from airflow_eo.table.storage import TableLocation
    from tests.unit.sinks.test_merge import INGEST as CUSTOMERS, KEY, MERGE, SCHEMA, plan, prepare

    uri = str(tmp_path / "t")
    commit(prepare(uri, plan(1, 0, 4), {1: "a", 2: "b", 3: "c", 4: "d"}), uri)
    with_deletion_vectors(uri, [3])  # id 4's row, deleted by another engine
    DeltaTable(uri).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    version = DeltaTable(uri).version()

    def engine_merge(p, changes: dict):
        staging = StagingArea(TableLocation.of(uri))
        target = staging.attempt_path(p)
        staging.loc.fs.create_dir(target, recursive=True)
        offsets = range(p.ranges[0].start, p.ranges[0].end)
        pq.write_table(pa.table({"id": pa.array(list(changes), pa.int64()), "body": list(changes.values()),
                                 "topic": ["cdc"] * len(changes), "partition": pa.array([0] * len(changes), pa.int32()),
                                 "offset": pa.array(list(offsets)[:len(changes)], pa.int64()),
                                 DELETE_COLUMN: [v is None for v in changes.values()]}),
                       f"{target}/part-0.parquet")
        keys = pa.table({"id": pa.array(list(changes), pa.int64()), DELETE_COLUMN: [v is None for v in changes.values()]})
        staged = StagedBatch(p, tuple(staging.staged_files(target)), {"cdc[0]": 2}, SCHEMA,
                             features=Ledger.open(uri).features)
        return MergeCommit(staged, swap=FileSwap((), keys, KEY, frozenset()), info=MergeInfo(KEY, len(changes),
                           engine=True), merge=MERGE, engine=True)

    from airflow_eo.table.metadata import MergeInfo

    outcome = commit(engine_merge(plan(2, 4, 7), {2: "B", 3: None, 5: "e"}), uri)
    assert outcome.status.value == "committed"
    assert duckdb_rows(uri, "SELECT id, body FROM t ORDER BY id") == [(1, "a"), (2, "B"), (5, "e")]
    changes = pa.RecordBatchReader.from_stream(DeltaTable(uri).load_cdf(starting_version=version + 1)).read_all()
    assert sorted(zip(changes["_change_type"].to_pylist(), changes["id"].to_pylist(), changes["body"].to_pylist())) == [
        ("delete", 3, "c"), ("insert", 5, "e"), ("update_postimage", 2, "B"), ("update_preimage", 2, "b")]
    merged = Ledger.open(uri).find_batch(CUSTOMERS, batch=2).meta.merge
    assert (merged.engine, merged.inserted, merged.updated, merged.deleted) == (True, 1, 1, 1)
    assert commit(engine_merge(plan(2, 4, 7), {2: "B", 3: None, 5: "e"}), uri).status.value == "already_committed"
    before = log_digest(uri)
    with pytest.raises(CommitConflictError):  # planned from offsets the table no longer has
        commit(engine_merge(plan(2, 4, 7, attempt="other"), {2: "X"}), uri)
    assert log_digest(uri) == before


def test_column_mapping_appends_with_physical_names_and_reads_map_them_back(tmp_path):
    """Another engine turns column mapping on and renames body → payload: the next batch's files carry the
    physical name "body" and field ids, its stats are by physical name, DuckDB reads payload, airflow-eo's
    own reads map the names back; schema evolution, which deltalake cannot do on such a table, is refused."""
    import pyarrow.parquet as pq

    from airflow_eo.table.files import read_columns, snapshot_files
    from airflow_eo.table.staging import StagingArea
    from airflow_eo.table.storage import TableLocation
    from tests.delta_tables import enable_column_mapping
    from tests.unit.table.test_commit import SCHEMA

    uri = str(tmp_path / "t")
    first_batch(uri)
    enable_column_mapping(uri, rename={"body": "payload"})
    ledger = Ledger.open(uri)
    names = ledger.features.names
    assert names.active and names.physical("payload") == "body" and names.field("payload").id == 4
    for use in TableUse:
        ledger.check_writable(INGEST, use=use)
    # the next batch, staged as the writer stages it under column mapping
    p = batch_plan(2, 10, 15, run=RUN2)
    staging = StagingArea(TableLocation.of(uri))
    target = staging.attempt_path(p)
    staging.loc.fs.create_dir(target, recursive=True)
    logical = pa.schema([f if f.name != "body" else pa.field("payload", pa.string()) for f in SCHEMA])
    rows = pa.table({"topic": ["orders"] * 5, "partition": pa.array([0] * 5, pa.int32()),
                     "offset": pa.array(range(10, 15), pa.int64()), "payload": [f"p{o}" for o in range(10, 15)]},
                    schema=logical)
    physical = names.physical_arrow_schema(logical)
    pq.write_table(pa.Table.from_batches([b for b in rows.to_batches()], schema=logical).rename_columns(
        physical.names).cast(physical), f"{target}/part-0.parquet")
    staged = staging.staged_files(target, names=names)
    assert json.loads(staged[0].stats)["minValues"] == {"topic": "orders", "partition": 0, "offset": 10}
    from airflow_eo.table.commit import StagedBatch

    commit(BatchCommit(StagedBatch(p, tuple(staged), staging.rows_per_partition(staged, names), logical)), uri)
    assert pq.read_schema(f"{target}/part-0.parquet").field("body").metadata[b"PARQUET:field_id"] == b"4"
    got = duckdb_rows(uri, 'SELECT "offset", payload FROM t ORDER BY 1')
    assert got == [(o, f"v{o}") for o in range(10)] + [(o, f"p{o}") for o in range(10, 15)]
    after = Ledger.open(uri)
    actions = after.add_actions()
    assert "min.offset" in actions.column_names  # the log's physical names, read back as logical
    files = snapshot_files(actions)
    read = sorted(v for f in files for b in read_columns(after.location(), f, pa.schema([("payload", pa.string())]),
                                                        names=after.features.names.as_dict())
                  for v in b["payload"].to_pylist())
    assert read == sorted([f"v{o}" for o in range(10)] + [f"p{o}" for o in range(10, 15)])
    before = log_digest(uri)
    with pytest.raises(TableFeatureError, match="schema evolution cannot add \\['note'\\].*delta-rs#930") as refused:
        wider = pa.schema([*logical, pa.field("note", pa.string())])
        commit(BatchCommit(StagedBatch(batch_plan(3, 15, 16, run=RunIdentity("r3")), (), {}, wider),
                           schema_evolution=True), uri)
    assert "\n" not in str(refused.value) and log_digest(uri) == before


def test_the_reprocess_of_a_merge_tables_newest_batch_goes_through_deltalakes_merge(tmp_path):
    """On a table with the change data feed: the batch's new winners replace its keys' rows, the rows the
    batch wrote that no new winner matches are deleted (by offset), other batches' rows stay."""
    import pyarrow.parquet as pq

    from airflow_eo.sinks.merge import FileSwap, MergeReprocessCommit
    from airflow_eo.table.commit import StagedBatch
    from airflow_eo.table.merge import DELETE_COLUMN
    from airflow_eo.table.metadata import MergeInfo
    from airflow_eo.table.staging import StagingArea
    from airflow_eo.table.storage import TableLocation
    from tests.unit.sinks.test_merge import INGEST as CUSTOMERS, KEY, MERGE, SCHEMA, plan, prepare

    uri = str(tmp_path / "t")
    commit(prepare(uri, plan(1, 0, 3), {1: "a", 2: "b", 3: "c"}), uri)
    commit(prepare(uri, plan(2, 3, 5), {4: "d", 5: "e"}), uri)  # offsets 3 (id 4) and 4 (id 5)
    DeltaTable(uri).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    version = DeltaTable(uri).version()
    p = plan(2, 3, 5, attempt="r")
    staging = StagingArea(TableLocation.of(uri))
    target = staging.attempt_path(p)
    staging.loc.fs.create_dir(target, recursive=True)
    # replayed: offset 3 now changes id 4 to "D"; offset 4 became a dead letter (no winner for id 5)
    pq.write_table(pa.table({"id": pa.array([4], pa.int64()), "body": ["D"], "topic": ["cdc"],
                             "partition": pa.array([0], pa.int32()), "offset": pa.array([3], pa.int64()),
                             DELETE_COLUMN: [False]}), f"{target}/part-0.parquet")
    keys = pa.table({"id": pa.array([4], pa.int64()), DELETE_COLUMN: [False]})
    staged = StagedBatch(p, tuple(staging.staged_files(target)), {"cdc[0]": 1}, SCHEMA,
                         features=Ledger.open(uri).features)
    rule = MergeReprocessCommit(staged, swap=FileSwap((), keys, KEY, frozenset()), info=MergeInfo(KEY, 1, engine=True),
                                merge=MERGE, reprocess_from=0, engine=True)
    assert commit(rule, uri).status.value == "committed"
    assert duckdb_rows(uri, "SELECT id, body FROM t ORDER BY id") == [(1, "a"), (2, "b"), (3, "c"), (4, "D")]
    changes = pa.RecordBatchReader.from_stream(DeltaTable(uri).load_cdf(starting_version=version + 1)).read_all()
    assert sorted(zip(changes["_change_type"].to_pylist(), changes["id"].to_pylist())) == [
        ("delete", 5), ("update_postimage", 4), ("update_preimage", 4)]
    assert Ledger.open(uri).reprocess_count(CUSTOMERS, 2) == 1


def test_a_dead_letter_table_with_rules_or_column_mapping_is_refused_before_planning(tmp_path):
    from airflow_eo.loop.ingest import Ingestion
    from airflow_eo.loop.config import IngestConfig
    from tests.delta_tables import enable_column_mapping

    dlq = str(tmp_path / "dlq")
    write_deltalake(dlq, pa.table({"topic": ["t"], "offset": pa.array([1], pa.int64())}))
    config = IngestConfig(table_uri=str(tmp_path / "t"), ingest_id=INGEST, topics=["orders"],
                          kafka_config={"bootstrap.servers": "127.0.0.1:9"}, dead_letter_table_uri=dlq)
    Ingestion(config, submitter=None).check_dead_letter_table()  # a plain one takes dead letters
    DeltaTable(dlq).alter.add_constraint({"small": "offset < 10"})
    with pytest.raises(TableFeatureError, match="has constraints or generated columns"):
        Ingestion(config, submitter=None).check_dead_letter_table()
    other = str(tmp_path / "dlq2")
    write_deltalake(other, pa.table({"topic": ["t"]}))
    enable_column_mapping(other)
    with pytest.raises(TableFeatureError, match="has column mapping"):
        Ingestion(config.replace(dead_letter_table_uri=other), submitter=None).check_dead_letter_table()


def test_a_refused_table_names_every_feature_that_stops_it_and_what_turned_it_on(tmp_path):
    """Row tracking needs domain metadata: the refusal names both, the property that turned row tracking on,
    and why domain metadata is there (not only the first feature in alphabetical order)."""
    uri = str(tmp_path / "t")
    first_batch(uri)
    add_features(uri, writer=("rowTracking", "domainMetadata"), configuration={"delta.enableRowTracking": "true"})
    with pytest.raises(TableFeatureError) as raised:
        Ledger.open(uri).check_features(TableUse.APPEND)
    message = str(raised.value)
    assert "\n" not in message
    assert "table features 'domainMetadata' (needed by 'rowTracking'), 'rowTracking' (turned on by " \
           "delta.enableRowTracking=true) are not supported" in message
