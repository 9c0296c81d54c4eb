"""The ledger: what a table has consumed, read from its own Delta log.

Consumed offsets live in Delta ``txn`` (SetTransaction) actions, one per topic-partition,
``appId = airflow-eo:<ingest_id>:<topic>:<partition>`` and ``version = next offset``.
Further ``txn`` actions hold the last batch number (``airflow-eo:<ingest_id>:batch``),
each batch's reprocess counter (``…:reprocess:<batch>``) and, on a dead-letter table, the
last batch whose dead letters landed (``…:dlq``). ``txn`` actions survive checkpoints and
log cleanup; the batch details in commitInfo (custom metadata under :data:`METADATA_KEY`)
are lineage for recent batches and may be cleaned with the log.

"Is this plan's batch committed?" is answered here and only here (:meth:`Ledger.state_of`).

Example::

    >>> from airflow_eo.table.ledger import Ledger
    >>> ledger = Ledger.open("/data/orders")          # doctest: +SKIP
    >>> ledger.committed_offsets("orders_raw", [TopicPartition("orders", 0)])  # doctest: +SKIP
    {TopicPartition(topic='orders', partition=0): 1500}
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from airflow_eo.spec import TXN_RETENTION, normalize_table_uri
from airflow_eo.core.errors import ConfigError, TableError, TableFeatureError
from airflow_eo.core.planning import BatchPlan, CommitCheck, batch_state
from airflow_eo.core.identity import unpack_stamp
from airflow_eo.core.offsets import OffsetRange, RecordStamp, TopicPartition
from airflow_eo.table.metadata import DATA_OPERATIONS, METADATA_KEY, BatchMetadata, CommitKind
from airflow_eo.table.app_ids import (
    batch_app_id, merge_app_id, partition_app_id, reprocess_app_id, stamp_app_id, topic_mark_app_id,
    topic_reset_app_id,
)
from airflow_eo.table.features import TableFeatures, TableUse
from airflow_eo.table.files import FEED_SUFFIX
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.table.partitioning import check_table_partitioning
from airflow_eo.table.storage import TableLocation, is_local

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_eo.table.files import TableFile


@dataclass(frozen=True)
class BatchRecord:
    """One commit of a batch: its table version and time, and its typed metadata."""

    version: int
    timestamp_ms: int | None
    meta: BatchMetadata

    @classmethod
    def from_commit_info(cls, info: dict) -> "BatchRecord | None":
        """The record of a commitInfo entry; None for commits that are not airflow-eo's (or
        of a kind this version does not know)."""
        text = info.get(METADATA_KEY)
        if not text:
            return None
        try:
            meta = BatchMetadata.from_json(text)
        except (ValueError, KeyError, TypeError):
            return None
        if meta.merge is not None and meta.merge.engine:  # deltalake's MERGE counted the rows
            meta = replace(meta, merge=meta.merge.counted_by(info.get("operationMetrics")))
        return cls(version=int(info.get("version", -1)), timestamp_ms=info.get("timestamp"), meta=meta)


# ours beside a new table's log: the markers, attempts' directories and a read's staged copy beside one
_OWN_ENTRIES = re.compile(rf"^(_airflow_eo|_delta_log|b\d{{8}}-[0-9a-f]+({re.escape(FEED_SUFFIX)})?)$")
_ATTEMPT_DIR = re.compile(r"^b(\d{8})-[0-9a-f]+$")


def batch_of_path(path: str) -> int | None:
    """The batch whose attempt directory holds a data file (None: a file outside them, e.g. compacted)."""
    match = _ATTEMPT_DIR.match(path.split("/", 1)[0]) if "/" in path else None
    return int(match.group(1)) if match else None


def _may_hold(row: dict, names: set, ranges: Iterable[OffsetRange]) -> bool:
    """Whether a file's min/max stats (``min.offset``…) allow rows of ``ranges`` (no stats: yes)."""
    keys = ("topic", "partition", "offset")
    if not all(f"min.{k}" in names and f"max.{k}" in names for k in keys) or \
            any(row[f"min.{k}"] is None or row[f"max.{k}"] is None for k in keys):
        return True
    return any(row["min.topic"] <= r.topic <= row["max.topic"]
               and row["min.partition"] <= r.partition <= row["max.partition"]
               and row["min.offset"] < r.end and r.start <= row["max.offset"] for r in ranges if r.size)


def _refuse_foreign_directory(uri: str) -> None:
    """No Delta log, but other files: a plain Parquet/CSV folder, not a table to create."""
    if not is_local(uri) or not os.path.isdir(uri):
        return
    foreign = sorted(n for n in os.listdir(uri) if not _OWN_ENTRIES.match(n))
    if foreign:
        raise TableError(
            f"{uri} is not a Delta table (no _delta_log) but holds other files ({', '.join(foreign[:3])}"
            f"{', …' if len(foreign) > 3 else ''}): point table_uri at a Delta table or an empty/new "
            "directory; nothing was changed"
        )


class Ledger:
    """Read side of a table's ledger, pinned to one snapshot of the Delta log.

    A compare-and-set commit must check offsets and commit from the *same* snapshot:
    keep one ``Ledger`` for both and do not refresh it in between.
    """

    def __init__(self, table: DeltaTable | None, table_uri: str, storage_options: dict[str, str] | None = None):
        self.table = table
        self.table_uri = table_uri
        self.storage_options = storage_options
        self._history: dict[int | None, list[dict]] = {}  # commitInfo of this snapshot, by limit
        self._features: TableFeatures | None = None
        self._txns: dict[str, int | None] = {}  # the snapshot's txn versions asked so far (it is pinned)

    @classmethod
    def open(cls, table_uri: str, storage_options: dict[str, str] | None = None) -> "Ledger":
        """The table's current snapshot. deltalake 1.6 always loads the active-file list
        (its ``without_files`` is deprecated and ignored), so a poll costs one snapshot load;
        checkpoints keep that bounded."""
        uri = normalize_table_uri(table_uri)
        try:
            table = DeltaTable(uri, storage_options=storage_options)
        except TableNotFoundError:
            _refuse_foreign_directory(uri)
            return cls(None, uri, storage_options)
        except DeltaError as exc:  # a _delta_log that cannot be read
            if "catalog" in str(exc).lower():  # the catalogManaged feature: commits go through a catalog
                raise TableFeatureError(
                    f"the Delta table at {uri} is catalog-managed (table feature 'catalogManaged'): its commits go "
                    "through its catalog, which airflow-eo does not talk to; ingest into a path-based table; "
                    "nothing was changed") from exc
            raise TableError(
                f"{uri} has a Delta log that cannot be read ({str(exc).splitlines()[0]}): it is not a "
                "usable Delta table. Point table_uri at the right table or repair/move the log; "
                "nothing was changed"
            ) from exc
        return cls(table, uri, storage_options)

    def location(self) -> TableLocation:
        return TableLocation.of(self.table_uri, self.storage_options)

    def txn(self, app_id: str) -> int | None:
        """The snapshot's ``txn`` version of ``app_id`` (None: never committed), each asked of deltalake once:
        the snapshot is pinned, and a run asks the same few (offsets, the batch counter, marks) many times."""
        if self.table is None:
            return None
        if app_id not in self._txns:
            self._txns[app_id] = self.table.transaction_version(app_id)
        return self._txns[app_id]

    @property
    def exists(self) -> bool:
        return self.table is not None

    @property
    def version(self) -> int | None:
        return self.table.version() if self.table is not None else None

    @property
    def features(self) -> TableFeatures:
        """The Delta features this snapshot's protocol and metadata ask writers and readers to honour."""
        if self._features is None:
            self._features = TableFeatures.of(self.table)
        return self._features

    def check_features(self, use: TableUse) -> None:
        """Refuse ``use`` of the table when one of its Delta features forbids it (one line, no retry)."""
        self.features.check(use, self.table_uri)

    def check_owner(self, ingest_id: str, adopt: bool = False) -> None:
        """Refuse a path that holds a Delta table this ingest never wrote (unless ``adopt``: the
        ``adopt_table`` option lets an ingest write into a table created elsewhere; its first batch
        starts at ``starting_offsets`` and marks the table as this ingest's).

        Ownership is the ingest's batch counter in the log (a ``txn`` action, which
        survives log cleanup), so no table property is needed.
        """
        if self.table is None or adopt or self.txn(batch_app_id(ingest_id)) is not None:
            return
        raise TableError(
            f"the Delta table at {self.table_uri} was not written by ingest_id {ingest_id!r} "
            "(another ingest id, or a table created elsewhere): use the ingest_id that created "
            "it, or another table path, or adopt_table=True (CLI --adopt-table) to write into it; nothing was changed"
        )

    def check_txn_retention(self) -> None:
        """Refuse a table whose ``txn`` actions expire: they are its committed offsets."""
        setting = self.table.metadata().configuration.get(TXN_RETENTION) if self.table is not None else None
        if setting is not None:
            raise ConfigError(
                f"the Delta table at {self.table_uri} sets {TXN_RETENTION}={setting!r}: Delta would drop its "
                "committed offsets (txn actions) after that time and a later run would duplicate records; "
                f"remove the property (Spark SQL: ALTER TABLE delta.`{self.table_uri}` UNSET TBLPROPERTIES "
                f"('{TXN_RETENTION}')); nothing was changed"
            )

    @property
    def partition_columns(self) -> list[str]:
        """The columns the table is partitioned by (none for a table not created yet)."""
        return list(self.table.metadata().partition_columns) if self.table is not None else []

    def check_writable(self, ingest_id: str, partition_by: Iterable[str] | None = None,
                       use: TableUse | None = None, adopt: bool = False) -> None:
        """What ingestion checks before it plans and again when it commits: the table is this
        ingest's (:meth:`check_owner`, or ``adopt``-ed), keeps its offsets (:meth:`check_txn_retention`),
        honours ``use`` with its Delta features (:meth:`check_features`) and, when
        ``partition_by`` is given, is partitioned so. That it is written the way its first batch was
        is the sink's check (:meth:`airflow_eo.sinks.base.Sink.check_table`, on :meth:`write_mark`)."""
        self.check_owner(ingest_id, adopt)
        self.check_txn_retention()
        if use is not None:
            self.check_features(use)
        if partition_by is not None and self.table is not None:
            check_table_partitioning(self.partition_columns, partition_by, self.table_uri)

    def is_merge_table(self, ingest_id: str) -> bool:
        return self.table is not None and self.txn(merge_app_id(ingest_id)) is not None

    def write_mark(self, ingest_id: str) -> int | None:
        """The table's write-mode mark for ``ingest_id``: None for a table without this ingest's
        batches, else the merge mark its first merge batch set (:func:`merge_mark` of its key),
        or 0 for a table of appended batches."""
        if self.table is None or self.txn(batch_app_id(ingest_id)) is None:
            return None  # a new table (or not this ingest's: check_owner says so)
        return self.txn(merge_app_id(ingest_id)) or 0

    def committed_offsets(
        self, ingest_id: str, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int | None]:
        """Next offset to read per partition; ``None`` for partitions never committed."""
        if self.table is None:
            return {tp: None for tp in partitions}
        return {tp: self.txn(partition_app_id(ingest_id, tp)) for tp in partitions}

    def last_batch(self, ingest_id: str) -> int:
        return self.transaction(batch_app_id(ingest_id))

    def topic_mark(self, ingest_id: str, topic: str) -> int | None:
        """The mark of the topic id the table's offsets of ``topic`` are of (None: none recorded)."""
        return self.transaction(topic_mark_app_id(ingest_id, topic)) or None

    def last_reset(self, ingest_id: str, topic: str) -> int:
        """The batch that last read ``topic`` again from a recreated topic's start (0: never)."""
        return self.transaction(topic_reset_app_id(ingest_id, topic))

    def stamps(self, ingest_id: str, committed: dict[TopicPartition, int | None]) -> dict[TopicPartition, RecordStamp | None]:
        """Each committed partition's fingerprint (:mod:`airflow_eo.core.identity`; None: none recorded)."""
        return {tp: unpack_stamp(self.transaction(stamp_app_id(ingest_id, tp)), offset)
                for tp, offset in committed.items() if offset is not None}

    def reprocess_count(self, ingest_id: str, batch: int) -> int:
        return self.transaction(reprocess_app_id(ingest_id, batch))

    def transaction(self, app_id: str) -> int:
        """The committed version of a ``txn`` app id; 0 when never committed."""
        if self.table is None:
            return 0
        return self.txn(app_id) or 0

    def file_paths(self) -> set[str]:
        """Paths (relative to the root) of the files in this snapshot."""
        if self.table is None:
            return set()
        return set(self.add_actions().column("path").to_pylist())

    def deleted_rows(self) -> dict[str, tuple[int, ...]]:
        """The rows deletion vectors remove, by file (:func:`airflow_eo.table.files.deleted_rows_of`);
        read only when the snapshot has any."""
        from airflow_eo.table.files import deleted_rows_of

        if self.table is None or not self.features.has_deletion_vectors:
            return {}
        return deleted_rows_of(self.table)

    def add_actions(self) -> "pa.Table":
        """This snapshot's add actions with their paths decoded (:func:`airflow_eo.table.files.add_actions_of`)."""
        from airflow_eo.table.files import add_actions_of  # pyarrow: imported when a table's files are needed

        assert self.table is not None, "add actions of a table that does not exist"
        return add_actions_of(self.table)

    def table_files(self) -> "dict[str, TableFile]":
        """This snapshot's data files by path, with their partition values from the log (by logical
        name; :func:`airflow_eo.table.files.snapshot_files`)."""
        from airflow_eo.table.files import snapshot_files

        return {f.path: f for f in snapshot_files(self.add_actions())} if self.table is not None else {}

    def files_of_batch(self, batch: int, ranges: Iterable[OffsetRange]) -> tuple[dict[str, int], dict[str, int]]:
        """The files holding ``batch``'s rows, as (paths → sizes of files that hold only this
        batch's rows, paths → sizes of files that may also hold other rows).

        An ingest writes each batch into its own attempt directory, so the first kind are the
        batch's directories. A compaction (or another writer) leaves files outside them that
        may mix batches; those whose key-column stats overlap ``ranges`` (or that have none)
        are the second kind: a reprocess rewrites them without the batch's rows.
        """
        actions = self.add_actions()
        wanted = ["path", "size_bytes", *(f"{s}.{k}" for s in ("min", "max") for k in ("topic", "partition", "offset"))]
        names = set(actions.column_names)
        rows = actions.select([c for c in wanted if c in names]).to_pylist()  # not every stat of every file
        whole, mixed = {}, {}
        for row in rows:
            path = row["path"]
            owner = batch_of_path(path)
            if owner is not None:
                if owner == batch:
                    whole[path] = row["size_bytes"]
            elif _may_hold(row, names, ranges):
                mixed[path] = row["size_bytes"]
        return whole, mixed

    def state_of(self, plan: BatchPlan) -> CommitCheck:
        """Is ``plan`` committable (READY), in the table (ALREADY_COMMITTED), or overtaken
        (CONFLICT)? Read from this snapshot (:func:`airflow_eo.core.planning.batch_state`; an interval
        plan is keyed by its interval: :meth:`airflow_eo.table.intervals.IntervalLedger.state_of`)."""
        if plan.interval is not None:
            return IntervalLedger(self, plan.ingest_id).state_of(plan)
        last = self.last_batch(plan.ingest_id)
        committed = self.committed_offsets(plan.ingest_id, plan.starts)
        state = batch_state(plan, committed, last)
        if state is CommitCheck.ALREADY_COMMITTED:  # only then is the history worth reading
            record = self.find_batch(plan.ingest_id, batch=plan.batch, operation=CommitKind.BATCH)
            state = batch_state(plan, committed, last, record.meta.ranges if record else None,
                                record.meta.run_key if record else None)
        return state

    def committed_plan(self, plan: BatchPlan) -> BatchPlan:
        """``plan`` as the table holds it, once :meth:`state_of` says ALREADY_COMMITTED: an offset
        batch keeps its number; an interval's batch is the one the table committed it under (a
        rebased number, or another run's batch)."""
        if plan.interval is None:
            return plan
        return IntervalLedger(self, plan.ingest_id).committed_plan(plan)

    def batches(self, ingest_id: str, limit: int | None = 20) -> list[BatchRecord]:
        """Recent data commits of ``ingest_id``, newest first (as far as the log still holds)."""
        if self.table is None:
            return []
        if limit not in self._history:  # the snapshot is pinned: its history does not change
            self._history[limit] = self.table.history(limit)
        found = []
        for info in self._history[limit]:
            record = BatchRecord.from_commit_info(info)
            if record is not None and record.meta.ingest_id == ingest_id and record.meta.operation in DATA_OPERATIONS:
                found.append(record)
        return found

    def find_batch(
        self, ingest_id: str, *, attempt_id: str | None = None, run_key: str | None = None,
        batch: int | None = None, since_version: int = 0, operation: CommitKind | None = None,
    ) -> BatchRecord | None:
        """The newest commit that matches the given attempt, run or batch number."""
        if self.table is None:
            return None
        span = max(self.table.version() - since_version + 1, 1)
        # Recent commits first: the batch a retry or rerun looks for is almost always among
        # the newest, and reading the whole history costs a file per commit.
        window, searched = 16, 0
        while searched < span:
            window = min(window, span)
            for record in self.batches(ingest_id, limit=window):
                meta = record.meta
                if (attempt_id is None or meta.attempt_id == attempt_id) and \
                        (run_key is None or meta.run_key == run_key) and \
                        (batch is None or meta.batch == batch) and \
                        (operation is None or meta.operation == operation):
                    return record
            searched, window = window, window * 16
        return None
