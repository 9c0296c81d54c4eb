"""Compare-and-set commit: staged files + offsets + batch metadata in one Delta commit.

The offsets of a batch are Delta ``txn`` actions in the same commit as its data files,
so readers see both or neither. Before committing, the table's offsets must equal the
plan's starts (compare); the commit then sets them to the plan's ends (set).

What deltalake's conflict detection adds (verified in ``tests/integration/test_race.py``):
two commits that both carry ``txn`` actions for the same appId from the same snapshot
conflict, and the second fails with ``CommitFailedError``; commits with *disjoint* appIds
are rebased and both land. Because every batch of one ingest writes the ``txn`` of every
partition it planned (and the batch counter), two batches of one ingest always conflict.
delta-rs does not itself refuse a ``txn`` version that is already committed, which is why
the compare step is ours.

Example::

    >>> outcome = commit_batch(table_uri, plan, staged, rows, schema)   # doctest: +SKIP
    >>> outcome.status, outcome.version
    ('committed', 12)
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field

import pyarrow as pa
from deltalake import Schema
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, CommitProperties, Transaction, create_table_with_add_actions

from airflow_eo.errors import CommitConflictError, TableError
from airflow_eo.faults import failpoint
from airflow_eo.ledger import (
    METADATA_KEY, Ledger, batch_app_id, partition_app_id,
)
from airflow_eo.planning import BatchPlan, CommitCheck, compare_offsets, describe_mismatch
from airflow_eo.staging import StagedFile

log = logging.getLogger(__name__)

COMMITTED = "committed"
ALREADY_COMMITTED = "already_committed"


@dataclass(frozen=True)
class CommitOutcome:
    status: str
    batch: int
    version: int | None
    rows: int = 0
    rows_per_partition: dict[str, int] = field(default_factory=dict)


def batch_metadata(plan: BatchPlan, rows_per_partition: dict[str, int], operation: str = "ingest") -> dict:
    """commitInfo metadata of a batch: lineage only, never credentials or client config."""
    return {
        "ingest_id": plan.ingest_id,
        "batch": plan.batch,
        "attempt_id": plan.attempt_id,
        "operation": operation,
        "run": asdict(plan.run),
        "planned_at": plan.planned_at,
        "ranges": [asdict(r) for r in plan.ranges],
        "rows": sum(rows_per_partition.values()),
        "rows_per_partition": rows_per_partition,
        "skipped": [asdict(s) for s in plan.skipped],
    }


def offset_transactions(plan: BatchPlan) -> list[Transaction]:
    """The ``set`` half: one txn per planned partition (version = next offset) + batch counter."""
    txns = [Transaction(partition_app_id(plan.ingest_id, r.tp), r.end) for r in plan.ranges]
    txns.append(Transaction(batch_app_id(plan.ingest_id), plan.batch))
    return txns


def add_actions(files: list[StagedFile]) -> list[AddAction]:
    return [AddAction(f.path, f.size, {}, f.modification_time, True, f.stats) for f in files]


def delta_schema_of(arrow_schema: pa.Schema) -> Schema:
    return Schema.from_arrow(arrow_schema)


def _field_types(schema: Schema) -> dict[str, str]:
    return {f["name"]: json.dumps(f["type"], sort_keys=True) for f in json.loads(schema.to_json())["fields"]}


def check_schema(ledger: Ledger, incoming: Schema, schema_evolution: bool = False) -> list[str]:
    """Refuse a batch whose columns differ from the table's, before anything is committed.

    With ``schema_evolution`` new columns are allowed (they are returned so the caller
    can add them); a dropped column or a changed type is refused either way.

    >>> check_schema(Ledger(None, "/t"), delta_schema_of(pa.schema([("a", pa.int64())])))
    []
    """
    if ledger.table is None:
        return []
    have, want = _field_types(ledger.table.schema()), _field_types(incoming)
    if have == want:
        return []
    missing = sorted(set(have) - set(want))
    extra = sorted(set(want) - set(have))
    changed = sorted(k for k in set(have) & set(want) if have[k] != want[k])
    if schema_evolution and not missing and not changed:
        return extra
    fix = ("schema evolution adds new columns only: restore the dropped or retyped columns in the "
           "transform, or write to a new table" if schema_evolution else
           "change the transform back, set schema_evolution=True to add new columns, or write to "
           "a new table")
    raise TableError(
        f"the transform's output does not match the table schema at {ledger.table_uri} "
        f"(missing columns: {missing or 'none'}; new columns: {extra or 'none'}; "
        f"changed types: {changed or 'none'}): {fix}; nothing was committed"
    )


def add_columns(ledger: Ledger, incoming: Schema, names: list[str], plan: BatchPlan) -> None:
    """Schema evolution: add ``names`` (nullable) to the table in a commit of their own.

    The data commit that follows re-checks offsets on the new snapshot, so a run that dies
    in between leaves only nullable columns behind, and its retry finds them in place.
    """
    from deltalake import Field

    fields = [Field(f.name, f.type, nullable=True) for f in incoming.fields if f.name in names]
    log.info("schema evolution: adding columns %s to %s", names, ledger.table_uri)
    ledger.table.alter.add_columns(fields, commit_properties=CommitProperties(
        custom_metadata={"airflow_eo.schema_evolution": json.dumps(
            {"ingest_id": plan.ingest_id, "batch": plan.batch, "added": names})},
    ))


def commit_batch(
    table_uri: str,
    plan: BatchPlan,
    staged: list[StagedFile],
    rows_per_partition: dict[str, int],
    arrow_schema: pa.Schema,
    storage_options: dict[str, str] | None = None,
    schema_evolution: bool = False,
    extra_metadata: dict | None = None,
) -> CommitOutcome:
    """Commit a batch's staged files and offsets atomically, if the table is where the plan began.

    ``extra_metadata`` is merged into the batch's commit metadata (e.g. the dead-letter
    files that follow this commit: :mod:`airflow_eo.dead_letters`).
    """
    ledger = Ledger.open(table_uri, storage_options)
    ledger.check_owner(plan.ingest_id)
    rows = sum(rows_per_partition.values())
    check = _compare(ledger, plan)
    if check is CommitCheck.ALREADY_COMMITTED:
        log.info("batch %s was committed before: committing nothing", plan.batch)
        return CommitOutcome(ALREADY_COMMITTED, plan.batch, ledger.version)
    schema = delta_schema_of(arrow_schema)
    new_columns = check_schema(ledger, schema, schema_evolution)
    if new_columns:
        add_columns(ledger, schema, new_columns, plan)
        ledger = Ledger.open(table_uri, storage_options)
        _compare(ledger, plan)
    properties = CommitProperties(
        custom_metadata={METADATA_KEY: json.dumps({**batch_metadata(plan, rows_per_partition),
                                                   **(extra_metadata or {})})},
        app_transactions=offset_transactions(plan),
    )
    read_version = ledger.version
    failpoint("during_commit")  # compare done, Delta write not yet issued: the narrowest window
    try:
        if ledger.table is None:
            create_table_with_add_actions(
                ledger.table_uri, schema, add_actions(staged), mode="error",
                storage_options=storage_options, commit_properties=properties,
            )
        else:
            ledger.table.create_write_transaction(
                add_actions(staged), mode="append", schema=ledger.table.schema(),
                commit_properties=properties,
            )
    except (CommitFailedError, DeltaError) as exc:
        if not _lost_race(exc):
            raise TableError(
                f"committing batch {plan.batch} to {ledger.table_uri} failed: {exc}. Nothing was "
                "committed; fix the cause and retry the run"
            ) from exc
        # Lost a race (or the table appeared meanwhile): decide from the table, not the error.
        after = Ledger.open(table_uri, storage_options)
        if _compare(after, plan) is CommitCheck.ALREADY_COMMITTED:
            return CommitOutcome(ALREADY_COMMITTED, plan.batch, after.version)
        raise CommitConflictError(
            f"batch {plan.batch} of {plan.ingest_id} lost a race with another commit to "
            f"{ledger.table_uri} ({exc.__class__.__name__}: {exc}); nothing of this batch was "
            "committed and its files stay invisible. Run again: the next run plans from the "
            "new offsets"
        ) from exc
    return verify_commit(table_uri, plan, rows_per_partition, read_version, storage_options)


def _lost_race(exc: Exception) -> bool:
    return isinstance(exc, CommitFailedError) or "already exists" in str(exc).lower()


def _compare(ledger: Ledger, plan: BatchPlan) -> CommitCheck:
    committed = ledger.committed_offsets(plan.ingest_id, plan.starts)
    check = compare_offsets(plan, committed)
    last = ledger.last_batch(plan.ingest_id)
    if check is CommitCheck.READY and last != plan.batch - 1:
        check = CommitCheck.CONFLICT
    if check is CommitCheck.CONFLICT:
        raise CommitConflictError(
            f"batch {plan.batch} of {plan.ingest_id} was planned from offsets the table no longer "
            f"has ({describe_mismatch(plan, committed)}; last batch in table {last}): another "
            "run committed in between. Nothing was committed; run again to plan from the "
            "table's current offsets"
        )
    return check


def verify_commit(
    table_uri: str, plan: BatchPlan, rows_per_partition: dict[str, int],
    read_version: int | None, storage_options: dict[str, str] | None = None,
) -> CommitOutcome:
    """Re-read the log: the plan's ends are committed and the commit is this attempt's."""
    ledger = Ledger.open(table_uri, storage_options)
    committed = ledger.committed_offsets(plan.ingest_id, plan.ends)
    if committed != plan.ends:
        raise CommitConflictError(
            f"after committing batch {plan.batch} the table's offsets are {committed}, not the "
            f"plan's ends {plan.ends}: another writer changed the table. Inspect it with "
            "`airflow-eo status`"
        )
    record = ledger.find_batch(
        plan.ingest_id, attempt_id=plan.attempt_id, since_version=(read_version or -1) + 1
    )
    version = record.version if record else ledger.version
    log.info("committed batch %s as table version %s", plan.batch, version)
    return CommitOutcome(COMMITTED, plan.batch, version, sum(rows_per_partition.values()), rows_per_partition)
