"""The second way to make a merge or reprocess commit: deltalake's own MERGE (delta-rs, in Rust).

airflow-eo's own merge and reprocess commits (:mod:`airflow_eo.table.commit`) swap files through
``create_write_transaction``, whose Python ``RemoveAction`` cannot name a file's deletion vector
and which writes no ``cdc`` files. On a table where either matters, a row-removing commit goes
through deltalake's MERGE instead (verified with deltalake 1.6: its ``remove`` actions carry the
files' deletion-vector descriptors, rows deleted by a vector stay deleted, and with
``delta.enableChangeDataFeed`` it writes the change files of exactly its inserts, update pre/post
images and deletes), in the same one commit as the batch's ``txn`` offsets and its metadata:

* the source is what the attempt staged: a merge batch's winners (one row per key, with their
  delete flag :data:`~airflow_eo.table.merge.DELETE_COLUMN`), or a reprocessed batch's new rows;
* rows match on the merge key (a reprocess of an appended batch: on ``topic, partition, offset``);
  a winner that deletes removes its key's row, the others update or insert it;
* a reprocess also deletes the rows of its batch's offset ranges that no new row matched;
* the compare-and-set stays the rule's: the offsets (or reprocess counter) are compared on the
  snapshot the MERGE runs on, and the MERGE commits with ``max_commit_retries=0``, so a table that
  moved meanwhile is a conflict the rule compares again, never a silent rebase.

The MERGE counts its own rows: the commit records ``engine=True`` in its
:class:`~airflow_eo.table.metadata.MergeInfo` and the counts come from the commit's
``operationMetrics`` (:meth:`airflow_eo.table.ledger.BatchRecord.from_commit_info`).

Example::

    >>> EngineMerge(("id",), delete_column=DELETE_COLUMN).predicate()
    't."id" = s."id"'
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Iterable, Iterator

import pyarrow as pa

from airflow_eo.core.offsets import OffsetRange
from airflow_eo.table.files import StagedFile, TableFile, read_columns
from airflow_eo.table.merge import DELETE_COLUMN
from airflow_eo.table.storage import TableLocation

log = logging.getLogger(__name__)

OFFSET_KEY = ("topic", "partition", "offset")  # how a reprocess of appended rows matches them


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value) -> str:
    return str(int(value)) if isinstance(value, int) else "'" + str(value).replace("'", "''") + "'"


@dataclass(frozen=True)
class EngineMerge:
    """How deltalake's MERGE applies a staged source: the columns rows match on, the source's delete
    flag (None: every source row upserts), and the offset ranges whose unmatched rows it deletes."""

    on: tuple[str, ...]
    delete_column: str | None = None
    ranges: tuple[OffsetRange, ...] = ()

    def predicate(self) -> str:
        return " AND ".join(f"t.{_quote(c)} = s.{_quote(c)}" for c in self.on)

    def ranges_predicate(self) -> str | None:
        """The target rows of :attr:`ranges` (Delta SQL over ``t``), or None."""
        parts = [f"(t.{_quote('topic')} = {_literal(r.topic)} AND t.{_quote('partition')} = {_literal(r.partition)} "
                 f"AND t.{_quote('offset')} >= {_literal(r.start)} AND t.{_quote('offset')} < {_literal(r.end)})"
                 for r in self.ranges if r.size]
        return " OR ".join(parts) or None

    def source_schema(self, schema: pa.Schema) -> pa.Schema:
        if self.delete_column is None or self.delete_column in schema.names:
            return schema
        return schema.append(pa.field(self.delete_column, pa.bool_()))

    def write(self, table, location: TableLocation, files: Iterable[StagedFile], schema: pa.Schema,
              properties) -> dict:
        """Run the MERGE of the staged ``files`` (rows of ``schema``) into ``table`` (a
        ``deltalake.DeltaTable`` at the compared snapshot), committing with ``properties``. Returns
        deltalake's metrics."""
        source_schema = self.source_schema(schema)
        table_columns = {f["name"] for f in json.loads(table.schema().to_json())["fields"]}
        columns = [n for n in schema.names if n != self.delete_column and n in table_columns]
        values = {c: f"s.{_quote(c)}" for c in columns}
        reader = pa.RecordBatchReader.from_batches(source_schema, _rows(location, tuple(files), source_schema))
        merger = table.merge(reader, self.predicate(), source_alias="s", target_alias="t",
                             commit_properties=properties)
        upserts = None
        if self.delete_column is not None:
            flag = f"s.{_quote(self.delete_column)}"
            merger = merger.when_matched_delete(flag)
            upserts = f"NOT {flag}"
        merger = merger.when_matched_update(values, upserts).when_not_matched_insert(values, upserts)
        ranges = self.ranges_predicate()
        if ranges is not None:
            merger = merger.when_not_matched_by_source_delete(ranges)
        metrics = merger.execute()
        log.info("deltalake MERGE: %s inserted, %s updated, %s deleted, %s file(s) rewritten",
                 metrics.get("num_target_rows_inserted"), metrics.get("num_target_rows_updated"),
                 metrics.get("num_target_rows_deleted"), metrics.get("num_target_files_removed"))
        return metrics


def _rows(location: TableLocation, files: tuple[StagedFile, ...], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The staged files' rows as ``schema`` says (partition columns from their directories)."""
    for f in files:
        yield from read_columns(location, TableFile(f.path, f.size, dict(f.partition_values)), schema)


__all__ = ["DELETE_COLUMN", "OFFSET_KEY", "EngineMerge"]
