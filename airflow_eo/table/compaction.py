"""Compaction of a column-mapped table: airflow-eo's own bin-packing, where deltalake's OPTIMIZE refuses.

deltalake 1.6's OPTIMIZE refuses a table with column mapping ("Column mapping is not supported for
write operation 'OPTIMIZE' yet"), and such a table grows by small files like any other. So
:func:`compact_mapped` bin-packs it the way OPTIMIZE does, within the Delta protocol:

* per partition, the files smaller than the target size are packed into bins of about the target
  size; a bin of one file is left alone. Only files of the same Parquet schema share a bin (same
  physical names, types and field ids), so a compacted file is exactly their rows, one after the
  other: column mapping's physical names and ids are kept as the files hold them, never renamed;
* a file with a deletion vector is left alone: the remove of such a file must name its vector, which
  deltalake's Python transaction API cannot (the rows it deletes would come back);
* the new file gets the statistics airflow-eo writes (numRecords; exact min/max/nullCount of the
  columns whose order Delta statistics keep) by physical name, and lands under the partition's
  directory, its partition values as the log keeps them;
* one commit removes the bin's files and adds the new ones, all with ``dataChange=false`` (what
  OPTIMIZE writes: readers of the change feed and streams skip it; an append-only table allows it),
  on exactly the snapshot they were chosen from (``max_commit_retries=0``). A table that moved
  meanwhile is compared again: if every removed file is still there, without a deletion vector,
  under the same column mapping, the same actions commit on the new snapshot; else nothing is
  committed. So a merge or a DELETE that changed one of the files is never undone, and a merge that
  committed after it sees its files gone and is compared again (:mod:`airflow_eo.table.commit`).

A compaction that loses the race deletes the files it wrote; one killed before its commit leaves
them unreferenced under the partition's directory, as an interrupted OPTIMIZE does.

Example::

    >>> compact_mapped(Ledger.open("/data/orders"), target_file_bytes=None)   # doctest: +SKIP
    {'numFilesAdded': 2, 'numFilesRemoved': 40, 'totalConsideredFiles': 41, 'skippedWithDeletionVectors': 1}
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction

from airflow_eo.core.errors import CommitConflictError
from airflow_eo.table.files import TableFile
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.mapping import ColumnNames
from airflow_eo.table.merge import key_stats
from airflow_eo.table.partitioning import partition_dir
from airflow_eo.table.staging import file_stats

log = logging.getLogger(__name__)

DEFAULT_TARGET_BYTES = 100 * 2**20  # deltalake's OPTIMIZE default (delta.targetFileSize when the table sets it)
ROW_GROUP_BYTES = 64 * 2**20  # rows buffered into one row group of a compacted file
COMMIT_ATTEMPTS = 5  # compare again on a moved table this many times before giving up
# in the commit's commitInfo: an airflow-eo compaction (no batch; it changes no row: the audit counts it so)
MAINTENANCE_KEY = "airflow_eo.maintenance"


@dataclass(frozen=True)
class _Written:
    """One compacted file: the files it replaces and its add action's parts."""

    removed: tuple[TableFile, ...]
    path: str
    size: int
    stats: str
    partition_values: dict


def target_bytes(ledger: Ledger, target_file_bytes: int | None) -> int:
    """The target size: given, else the table's ``delta.targetFileSize``, else OPTIMIZE's default."""
    if target_file_bytes:
        return int(target_file_bytes)
    configured = ledger.features.properties.get("delta.targetFileSize")
    return int(configured) if configured and configured.isdigit() else DEFAULT_TARGET_BYTES


def bins_of(files: list[TableFile], schemas: dict[str, str], target: int) -> list[list[TableFile]]:
    """Bins of about ``target`` bytes of the files below it, per partition and Parquet schema (the
    files in path order); bins of one file are left out.

    >>> f = [TableFile(p, s) for p, s in (("a", 40), ("b", 40), ("c", 40), ("d", 200), ("e", 30))]
    >>> [[x.path for x in b] for b in bins_of(f, dict.fromkeys("abcde", "s"), 100)]
    [['a', 'b', 'c']]
    """
    groups: dict[tuple, list[TableFile]] = {}
    for f in sorted(files, key=lambda f: f.path):
        if f.size < target:
            groups.setdefault((tuple(sorted(f.partition_values.items(), key=str)), schemas[f.path]), []).append(f)
    bins = []
    for members in groups.values():
        current: list[TableFile] = []
        for f in members:
            current.append(f)
            if sum(x.size for x in current) >= target:
                bins.append(current)
                current = []
        bins.append(current)
    return [b for b in bins if len(b) > 1]


def compact_mapped(ledger: Ledger, target_file_bytes: int | None = None) -> dict:
    """Bin-pack the small files of a column-mapped table (module doc); OPTIMIZE's metrics."""
    assert ledger.table is not None, "a table to compact"
    target = target_bytes(ledger, target_file_bytes)
    names = ledger.features.names
    with_vectors = set(ledger.deleted_rows())
    files = [f for f in ledger.table_files().values() if f.path not in with_vectors]
    location = ledger.location()
    schemas = {f.path: _schema_key(location, f) for f in files if f.size < target}
    bins = bins_of(files, schemas, target)
    done = {"numFilesAdded": 0, "numFilesRemoved": 0, "totalConsideredFiles": len(files) + len(with_vectors),
            "skippedWithDeletionVectors": len(with_vectors)}
    if not bins:
        log.info("compaction of %s: no partition has two files below %d bytes to pack", ledger.table_uri, target)
        return done
    written = [_write(location, b, names) for b in bins]
    version = _commit(ledger, written, names)
    done.update(numFilesAdded=len(written), numFilesRemoved=sum(len(w.removed) for w in written))
    log.info("compacted %s (column mapping, airflow-eo's bin-packing): %d file(s) into %d, table version %s%s",
             ledger.table_uri, done["numFilesRemoved"], done["numFilesAdded"], version,
             f"; {len(with_vectors)} file(s) with deletion vectors left as they are" if with_vectors else "")
    return done


def _schema_of(location, file: TableFile) -> pa.Schema:
    with location.fs.open_input_file(location.join(file.path)) as handle:
        return pq.ParquetFile(handle).schema_arrow


def _schema_key(location, file: TableFile) -> str:
    """The file's Parquet schema (names, types, field ids) as text: only equal files share a bin."""
    return _schema_of(location, file).to_string(show_field_metadata=True, show_schema_metadata=False)


def _write(location, files: list[TableFile], names: ColumnNames) -> _Written:
    """One file of ``files``' rows (one schema), streamed a row group at a time, under their partition's directory."""
    values = names.physical_values(files[0].partition_values)
    directory = partition_dir(values)
    relative = "/".join(p for p in (directory, f"part-{uuid.uuid4().hex}-compacted.parquet") if p)
    full = location.join(relative)
    if directory:
        location.fs.create_dir(location.join(directory), recursive=True)
    buffered: list[pa.RecordBatch] = []
    size = 0
    with location.fs.open_output_stream(full) as out:
        writer = pq.ParquetWriter(out, _schema_of(location, files[0]))
        for f in files:
            with location.fs.open_input_file(location.join(f.path)) as handle:
                for batch in pq.ParquetFile(handle).iter_batches():
                    buffered.append(batch)
                    size += batch.nbytes
                    if size >= ROW_GROUP_BYTES:
                        writer.write_table(pa.Table.from_batches(buffered))
                        buffered, size = [], 0
        if buffered:
            writer.write_table(pa.Table.from_batches(buffered))
        writer.close()
    meta = pq.read_metadata(full, filesystem=location.fs)
    rows = sum(pq.read_metadata(location.join(f.path), filesystem=location.fs).num_rows for f in files)
    if meta.num_rows != rows:  # never commit a file that lost rows
        location.fs.delete_file(full)
        raise RuntimeError(f"compacting {len(files)} file(s) of {location.uri} wrote {meta.num_rows} rows, not {rows}")
    stats = file_stats(meta, names)
    columns = [n for n in (f.name for f in names.fields) if n not in files[0].partition_values]
    extra = key_stats(meta, tuple(columns), names)
    for part in ("minValues", "maxValues", "nullCount"):
        stats[part] = {**extra[part], **stats.get(part, {})}
    return _Written(tuple(files), relative, location.fs.get_file_info(full).size, json.dumps(stats), values)


def _commit(ledger: Ledger, written: list[_Written], names: ColumnNames) -> int | None:
    """Commit the swap on the snapshot the files were chosen from, or compared again on a moved one."""
    now_ms = int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = [
        *(RemoveAction(f.path, False, now_ms, f.size, names.physical_values(f.partition_values))
          for w in written for f in w.removed),
        *(AddAction(w.path, w.size, w.partition_values, now_ms, False, w.stats) for w in written)]
    removed = {f.path for w in written for f in w.removed}
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        assert ledger.table is not None
        try:
            ledger.table.create_write_transaction(actions, mode="append", schema=ledger.table.schema(),
                                                  commit_properties=CommitProperties(
                                                      custom_metadata={MAINTENANCE_KEY: "compaction"},
                                                      max_commit_retries=0))
            return Ledger.open(ledger.table_uri, ledger.storage_options).version
        except CommitFailedError as exc:
            ledger = Ledger.open(ledger.table_uri, ledger.storage_options)
            why = _changed(ledger, removed, names)
            if why is None and attempt < COMMIT_ATTEMPTS:
                log.info("compaction of %s: the table moved while it committed (%s); its files are unchanged, "
                         "committing on the new snapshot", ledger.table_uri, type(exc).__name__)
                continue
            for w in written:  # never committed: nothing refers to them
                ledger.location().fs.delete_file(ledger.location().join(w.path))
            raise CommitConflictError(f"compaction of {ledger.table_uri} lost a race with another commit "
                                      f"({why or exc}); nothing was compacted, run it again") from exc
    raise AssertionError("unreachable: the last attempt returns or raises")


def _changed(ledger: Ledger, removed: set[str], names: ColumnNames) -> str | None:
    """Why the compacted files may no longer replace ``removed`` on this snapshot, or None."""
    if ledger.features.names != names:
        return "its column mapping changed"
    gone = removed - ledger.file_paths()
    if gone:
        return f"{len(gone)} of its files were removed meanwhile (e.g. {sorted(gone)[0]})"
    deleted = removed & set(ledger.deleted_rows())
    if deleted:
        return f"rows of {len(deleted)} of its files were deleted meanwhile (e.g. {sorted(deleted)[0]})"
    return None
