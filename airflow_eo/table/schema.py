"""The table's columns: compare a batch's schema with the table's, and add new columns.

A batch whose columns differ from the table's is refused before anything is committed;
with schema evolution on, new columns are added (nullable) in a commit of their own.

Example::

    >>> check_schema(Ledger(None, "/t"), delta_schema_of(pa.schema([("a", pa.int64())])))
    []
"""

from __future__ import annotations

import json
import logging

import pyarrow as pa
from deltalake import Schema
from deltalake.transaction import CommitProperties

from airflow_eo.core.errors import TableError
from airflow_eo.core.planning import BatchPlan
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.metadata import METADATA_KEY, BatchMetadata, CommitKind

log = logging.getLogger(__name__)


def delta_schema_of(arrow_schema: pa.Schema) -> Schema:
    return Schema.from_arrow(arrow_schema)


def _field_types(schema: Schema) -> dict[str, str]:
    return {f["name"]: json.dumps(_shape(f["type"]), sort_keys=True)
            for f in json.loads(schema.to_json())["fields"]}


def _shape(kind):
    """A type's JSON as batches must match it: not its nested fields' metadata (column mapping's physical
    names and ids are the table's, which the transform's output has no part in), nor their nullability (a
    NOT NULL field is a rule on the rows, checked as the table's constraints are, as at the top level)."""
    if isinstance(kind, dict):
        return {k: _shape(v) for k, v in kind.items()
                if k not in ("metadata", "nullable", "containsNull", "valueContainsNull")}
    if isinstance(kind, list):
        return [_shape(v) for v in kind]
    return kind


def check_schema(ledger: Ledger, incoming: Schema, schema_evolution: bool = False, replacing: bool = False,
                 adopted: bool = False) -> list[str]:
    """Refuse a batch whose columns differ from the table's, before anything is committed.

    With ``schema_evolution`` new columns are allowed (they are returned so the caller
    can add them); a dropped column or a changed type is refused either way. ``replacing``
    (a reprocess, replacing one past batch's rows) may lack nullable columns: its rows read them
    as null, like the batch's rows written before schema evolution added them — a batch is
    decoded with the reader schema pinned in its plan, older than the fields added since.
    ``adopted`` (a table created elsewhere, ``adopt_table``) may have nullable columns the
    transform does not produce: the batch's rows read them as null.
    """
    if ledger.table is None:
        return []
    have, want = _field_types(ledger.table.schema()), _field_types(incoming)
    if have == want:
        return []
    missing = sorted(set(have) - set(want))
    extra = sorted(set(want) - set(have))
    changed = sorted(k for k in set(have) & set(want) if have[k] != want[k])
    if (replacing or adopted) and missing and not changed and (adopted or not extra):
        nullable = {f["name"] for f in json.loads(ledger.table.schema().to_json())["fields"] if f.get("nullable", True)}
        if set(missing) <= nullable:
            log.info("the reprocessed rows have no %s (null, as in rows written before these columns were added)"
                     if replacing else "the batch's rows have no %s (null: columns of the adopted table the transform "
                     "does not produce)", ", ".join(missing))
            missing = []
            if not extra:
                return []
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
    assert ledger.table is not None, "columns are added to an existing table"  # a first batch creates it whole
    ledger.table.alter.add_columns(fields, commit_properties=CommitProperties(
        custom_metadata={METADATA_KEY: BatchMetadata(plan.ingest_id, plan.batch, CommitKind.ADD_COLUMNS,
                                                     added_columns=tuple(names)).to_json()},
    ))
