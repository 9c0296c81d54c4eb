"""Merging by key, the table side: which files can hold a batch's keys, and their copies without them.

A merge batch (``write_mode="merge"``) changes a set of keys: each key's winning record
upserts or deletes the key's row (:mod:`airflow_eo.driver.changes`). The table's rows of
those keys must go in the same commit that adds the new rows. Which files hold them is
known only by reading them, so the reading is narrowed first, from the snapshot's file list
alone (:func:`candidate_files`): a file is read only if the Delta statistics of the key
columns (``minValues`` / ``maxValues``) or its partition values (for key columns that
partition the table) allow one of the batch's keys. ``maintain --z-order <key>`` clusters
the keys, so the files of recent keys are few and narrow.

Each candidate is then read (inside a Spark task, through the table's own filesystem, so
``s3://`` tables need no Hadoop jar) and, if it holds a changed key, rewritten without
those rows (:func:`rewrite_file`); the commit removes it and adds the copy. A candidate
that holds none of the keys is left alone.

The key columns' statistics of the files airflow-eo writes come from the Parquet footers
(:func:`key_stats`), for the types whose order Delta statistics keep exactly: integers,
strings, dates and timestamps; files without them are always read.

Example::

    >>> import pyarrow as pa
    >>> files = pa.table({"path": ["a.parquet", "b.parquet"], "size_bytes": [10, 10],
    ...                   "min.id": [1, 100], "max.id": [50, 150]})
    >>> keys = pa.table({"id": [7, 60], DELETE_COLUMN: [False, True]})
    >>> found, in_range = candidate_files(files, keys, ("id",))
    >>> [f.path for f in found], in_range["id"].to_pylist()
    (['a.parquet'], [7])
"""

from __future__ import annotations

import json
import uuid
from bisect import bisect_left, bisect_right
from dataclasses import asdict, dataclass, replace
from datetime import timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_eo.core.offsets import OffsetRange
from airflow_eo.table.files import (
    StagedFile, TableFile, conform, logged_partition_values, partition_columns_of, read_file,
)
from airflow_eo.table.mapping import ColumnNames, rename_columns
from airflow_eo.table.partitioning import partition_dir
from airflow_eo.table.staging import column_bounds, staged_file
from airflow_eo.table.storage import TableLocation

DELETE_COLUMN = "_airflow_eo_delete"  # a changed key's winner deletes it (else it upserts)
_ROW = "_airflow_eo_row"


@dataclass(frozen=True)
class Rewrite:
    """A table file the merge replaces: removed, and copied without the rows of the batch's keys
    (no copy when no row remains)."""

    removed: TableFile
    copy: StagedFile | None
    updated: int = 0  # rows dropped because the batch upserts their key
    deleted: int = 0  # rows dropped because the batch deletes their key
    replaced: int = 0  # a reprocess: rows dropped only because they came from its batch's ranges
    kept: int = 0  # rows copied

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "copy": asdict(self.copy) if self.copy else None})

    @classmethod
    def from_json(cls, text: str) -> "Rewrite":
        raw = json.loads(text)
        copy = raw.pop("copy")
        return cls(**{**raw, "removed": TableFile(**raw["removed"]), "copy": StagedFile(**copy) if copy else None})


def _stat_typed(keys: pa.Table, column: str, actions: pa.Table) -> pa.Array | None:
    """The keys' column in the type of the files' statistics (None: no usable statistics)."""
    name = f"min.{column}"
    if name not in actions.column_names or f"max.{column}" not in actions.column_names:
        return None
    try:
        return pc.cast(keys[column].combine_chunks(), actions.schema.field(name).type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None


def _partition_match(values: pa.Array, raw) -> pa.Array | None:
    """Which of ``values`` equal a file's partition value (None: cannot tell, so any may)."""
    if raw is None:
        return pa.array([False] * len(values), pa.bool_())  # a null partition holds no key (keys are never null)
    try:
        scalar = pc.cast(pa.array([str(raw) if not isinstance(raw, str) else raw]), values.type)[0]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    return pc.equal(values, scalar)


def candidate_files(actions: pa.Table, keys: pa.Table, key_columns: tuple[str, ...],
                    partition_columns: tuple[str, ...] = ()) -> tuple[list[TableFile], pa.Table]:
    """The files of ``actions`` (the snapshot's add actions, flattened) that may hold one of
    ``keys``, and the keys that fall into at least one of them (the rows any rewrite can drop).

    A key column that partitions the table is matched against each file's partition value;
    the others against the file's min/max statistics, which must all allow the key. A file
    without statistics for a column allows every value of it. Keys are sorted by the first
    such column, so each file costs two binary searches plus a look at the keys in its range.
    """
    if keys.num_rows == 0 or actions.num_rows == 0:
        return [], keys.slice(0, 0)
    ranged = [c for c in key_columns if c not in partition_columns]
    parted = [c for c in key_columns if c in partition_columns]
    if ranged:
        keys = keys.sort_by([(ranged[0], "ascending")])
    typed = {c: _stat_typed(keys, c, actions) for c in ranged}
    plain = {c: keys[c].combine_chunks() for c in parted}
    first_typed = typed[ranged[0]] if ranged else None
    first = ranged[0] if first_typed is not None else None
    ordered = first_typed.to_pylist() if first_typed is not None else []
    logged = partition_columns_of(actions)
    wanted = ["path", "size_bytes", *(f"{s}.{c}" for c in ranged if typed[c] is not None for s in ("min", "max")),
              *logged]
    selected = [False] * keys.num_rows
    found = []
    for row in actions.select(wanted).to_pylist():
        lo, hi = 0, keys.num_rows
        if first and row[f"min.{first}"] is not None and row[f"max.{first}"] is not None:
            lo, hi = bisect_left(ordered, row[f"min.{first}"]), bisect_right(ordered, row[f"max.{first}"])
        if lo >= hi:
            continue
        mask = pa.array([True] * (hi - lo), pa.bool_())
        for c in ranged[1:]:
            low, high, values = row.get(f"min.{c}"), row.get(f"max.{c}"), typed[c]
            if values is not None and low is not None and high is not None:
                part = values.slice(lo, hi - lo)
                mask = pc.and_(mask, pc.and_(pc.greater_equal(part, low), pc.less_equal(part, high)))
        for c in parted:
            if f"partition.{c}" in row:
                match = _partition_match(plain[c].slice(lo, hi - lo), row[f"partition.{c}"])
                if match is not None:
                    mask = pc.and_(mask, match)
        hits = mask.to_pylist()
        if not any(hits):
            continue
        found.append(TableFile(row["path"], row["size_bytes"], logged_partition_values(row, logged)))
        for i, hit in enumerate(hits, start=lo):
            selected[i] = selected[i] or bool(hit)
    return found, keys.filter(pa.array(selected))


def _in_ranges(table: pa.Table, ranges: tuple[OffsetRange, ...]) -> pa.Array:
    inside = pa.array([False] * table.num_rows, pa.bool_())
    for r in ranges:
        match = pc.and_(pc.and_(pc.equal(table["topic"], r.topic), pc.equal(table["partition"], r.partition)),
                        pc.and_(pc.greater_equal(table["offset"], r.start), pc.less(table["offset"], r.end)))
        inside = pc.or_(inside, pc.fill_null(match, False))
    return inside


def _key_probe(table: pa.Table, file: TableFile, keys: pa.Table, key_columns: tuple[str, ...]) -> pa.Table:
    """The file's key columns typed like ``keys`` (a partition column as the file's value; a key
    column the file lacks, or a null partition value, is null: it matches no key) and each row's number."""
    probe = conform(table, file, pa.schema([keys.schema.field(c) for c in key_columns]))
    return probe.append_column(_ROW, pa.array(range(table.num_rows), pa.int64()))


def rewrite_file(location: TableLocation, file: TableFile, keys: pa.Table | None, key_columns: tuple[str, ...],
                 target_dir: str, ranges: tuple[OffsetRange, ...] = (), names: ColumnNames | None = None) -> Rewrite | None:
    """Read ``file`` and, if it holds one of ``keys`` (key columns and :data:`DELETE_COLUMN`; None:
    none) or, for a reprocess, a row of ``ranges``, write its other rows into ``target_dir`` (under
    the directory of the file's own partition values). None when the file holds none of them (left
    alone). ``names``: the table's column mapping: the file holds physical names, which the keys and
    ranges are compared by; the copy keeps the file's own columns, names and field ids, and its
    statistics and partition values are kept by physical name."""
    names = names or ColumnNames()
    stored = read_file(location, file.path)
    table = rename_columns(stored, {f.physical: f.name for f in names.fields}) if names.active else stored
    drop = [False] * table.num_rows
    updated = deleted = replaced = 0
    if table.num_rows and keys is not None and keys.num_rows:
        hits = _key_probe(table, file, keys, key_columns).join(keys.select([*key_columns, DELETE_COLUMN]), keys=list(key_columns), join_type="inner")
        for row, deletes in zip(hits[_ROW].to_pylist(), hits[DELETE_COLUMN].to_pylist()):
            drop[row] = True
            deleted += bool(deletes)
            updated += not deletes
    if ranges:
        for i, inside in enumerate(_in_ranges(table, ranges).to_pylist()):
            if inside and not drop[i]:
                drop[i] = True
                replaced += 1
    if not any(drop):
        return None
    kept = stored.filter(pc.invert(pa.array(drop)))
    copy = None
    if kept.num_rows:
        values = names.physical_values(file.partition_values)
        directory = "/".join(p for p in (target_dir, partition_dir(values)) if p)
        full = location.join(f"{directory}/part-{uuid.uuid4().hex}.parquet")
        location.fs.create_dir(location.join(directory), recursive=True)
        pq.write_table(kept, full, filesystem=location.fs)
        written = replace(staged_file(location, location.fs.get_file_info(full), names), partition_values=values)
        copy = with_key_stats(location, [written], key_columns, names)[0]
    return Rewrite(file, copy, updated, deleted, replaced, kept.num_rows)


# -- statistics of the key columns -------------------------------------------------------------------
def _stat_value(value, kind: str, high: bool):
    """A footer bound as Delta statistics write it; timestamps at millisecond precision, the
    upper bound rounded up so it stays a bound."""
    if kind == "timestamp":
        ms = value.astimezone(timezone.utc)
        if high and ms.microsecond % 1000:
            ms = ms + timedelta(microseconds=1000 - ms.microsecond % 1000)
        return ms.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms.microsecond // 1000:03d}Z"
    if kind == "date":
        return value.isoformat()
    return value


def _stat_kind(arrow_type: pa.DataType) -> str | None:
    if pa.types.is_integer(arrow_type):
        return "integer"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "string"
    if pa.types.is_date32(arrow_type):
        return "date"
    if pa.types.is_timestamp(arrow_type) and arrow_type.tz is not None:
        return "timestamp"
    return None  # no exact order in Delta statistics (decimals, binaries, floats): never pruned by


def key_stats(meta: pq.FileMetaData, key_columns: tuple[str, ...], mapping: ColumnNames | None = None) -> dict:
    """``minValues`` / ``maxValues`` / ``nullCount`` entries of the key columns a Parquet footer
    bounds exactly (inexact bounds, e.g. truncated strings, are left out); under column mapping
    (``mapping``) by the physical names the file and the log keep."""
    out: dict = {"minValues": {}, "maxValues": {}, "nullCount": {}}
    arrow = meta.schema.to_arrow_schema()
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    for column in (mapping or ColumnNames()).physical_names(key_columns):
        if column not in names or column not in arrow.names:
            continue
        kind = _stat_kind(arrow.field(column).type)
        idx = names.index(column)
        # pyarrow that knows whether a bound was truncated says so; writers here write whole values
        exact = all(getattr(meta.row_group(rg).column(idx).statistics, attr, True)
                    for rg in range(meta.num_row_groups) for attr in ("is_min_value_exact", "is_max_value_exact"))
        bounds = column_bounds(meta, idx) if kind and exact else None
        if bounds is None or bounds[0] is None or kind is None:
            continue
        low, high, nulls = bounds
        out["minValues"][column] = _stat_value(low, kind, False)
        out["maxValues"][column] = _stat_value(high, kind, True)
        out["nullCount"][column] = nulls
    return out


def with_key_stats(location: TableLocation, files: list[StagedFile], key_columns: tuple[str, ...],
                   names: ColumnNames | None = None) -> list[StagedFile]:
    """``files`` whose Delta statistics also bound the key columns (read from their footers; by
    physical name under column mapping)."""
    out = []
    for f in files:
        stats = json.loads(f.stats or "{}")
        if "minValues" not in stats:  # no bounds of the offsets either: nothing is pruned by this file
            out.append(f)
            continue
        extra = key_stats(pq.read_metadata(location.join(f.path), filesystem=location.fs), key_columns, names)
        for part in ("minValues", "maxValues", "nullCount"):
            stats[part] = {**stats.get(part, {}), **extra[part]}
        out.append(replace(f, stats=json.dumps(stats)))
    return out
