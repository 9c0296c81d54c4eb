"""The audit's reads: coordinates only — offsets from Kafka, ``topic``/``partition``/``offset`` from the table.

Kafka: the offsets a ``read_committed`` consumer delivers in a span of one partition, read
from record-batch headers where they settle them (:mod:`airflow_eo.audit.batches`), else
record by record (the client fetches values, nothing decodes them). Table: the ``offset`` column of the data files
whose statistics or partition values may hold a partition's rows in a span, read a Parquet
batch at a time and filtered there, so only the span's offsets are kept. Both run wherever
a slice runs: in the auditing process or in a Spark task (:mod:`airflow_eo.audit.slices`).

Example::

    >>> with KafkaCoordinates({"bootstrap.servers": "127.0.0.1:9092"}) as kafka:     # doctest: +SKIP
    ...     kafka.offsets(TopicPartition("orders", 0), 0, 1500).size
    1497
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar

import numpy as np

from airflow_eo.audit.batches import BatchOffsets, NeedRecords, client_options
from airflow_eo.audit import read_failed, retention_took, stalled
from airflow_eo.kafka import client_config, new_consumer
from airflow_eo.core.offsets import TopicPartition
from airflow_eo.table.files import add_actions_of
from airflow_eo.table.storage import TableLocation

log = logging.getLogger(__name__)
KEYS = ("topic", "partition", "offset")
_NONE = np.array([], dtype=np.int64)
# the audit's consumer reads and never commits: settings a connection must not change
_AUDIT_SETTINGS = {"group.id": "airflow-eo-audit", "enable.auto.commit": False, "enable.auto.offset.store": False,
                   "isolation.level": "read_committed", "enable.partition.eof": True, "auto.offset.reset": "error"}


class KafkaCoordinates:
    """The offsets Kafka delivers in a span of one partition, read from record-batch headers
    (:class:`~airflow_eo.audit.batches.BatchOffsets`) where they settle it, else record by record
    (:class:`RecordOffsets`): a span with a compacted or pre-0.11 batch, or a connection config
    only librdkafka speaks (OAUTHBEARER, Kerberos, callbacks). Clients are made on first use."""

    def __init__(self, kafka_config: Mapping[str, object], stall_timeout: float = 60.0):
        config = {**client_config(kafka_config), **_AUDIT_SETTINGS}
        self.records = RecordOffsets(config, stall_timeout)
        options = client_options(config)
        self.batches: BatchOffsets | None = None if options is None else BatchOffsets(options, stall_timeout)

    def __enter__(self) -> "KafkaCoordinates":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            if self.batches is not None:
                self.batches.close()
        finally:
            self.records.close()

    def offsets(self, tp: TopicPartition, start: int, end: int) -> np.ndarray:
        """The offsets Kafka delivers in ``[start, end)``: aborted records and transaction
        markers are never delivered, so their offsets stay absent."""
        if self.batches is not None:
            try:
                return self.batches.offsets(tp, start, end)
            except NeedRecords as why:
                if why.whole_connection:  # once per client, and it costs time: worth the user's eye
                    log.info("audit: reading Kafka record by record with librdkafka: %s", why)
                    self.batches.close()
                    self.batches = None
                else:
                    log.debug("audit: %s %s..%s read record by record: %s", tp, start, end, why)
        return self.records.offsets(tp, start, end)


class RecordOffsets:
    """One read_committed librdkafka consumer, assigned to one span at a time (made on first use)."""

    def __init__(self, config: Mapping[str, object], stall_timeout: float = 60.0):
        self.config = dict(config)
        self.stall_timeout = stall_timeout
        self._consumer: Any = None  # a confluent_kafka.Consumer, made on first use

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def offsets(self, tp: TopicPartition, start: int, end: int) -> np.ndarray:
        """The offsets Kafka delivers in ``[start, end)``, one record at a time."""
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka import TopicPartition as KTP

        if end <= start:
            return _NONE
        if self._consumer is None:
            self._consumer = new_consumer(self.config)
        consumer, ktp = self._consumer, KTP(tp.topic, tp.partition, start)
        found: list[np.ndarray] = []
        try:
            consumer.assign([ktp])
            last_progress, done, next_offset = time.monotonic(), False, start
            while not done:
                offsets: list[int] = []
                keep = offsets.append
                # no more than the span still holds: consume() waits out its timeout for the count it asks
                for m in consumer.consume(num_messages=max(1, min(50_000, end - next_offset)), timeout=0.5):
                    error = m.error()
                    if error is None:
                        keep(m.offset())
                    elif error.code() == KafkaError._PARTITION_EOF:  # nothing after: the span is read
                        done = True
                    elif error.code() == KafkaError.OFFSET_OUT_OF_RANGE:
                        raise retention_took(tp, start, end)
                    else:
                        raise read_failed(tp, error.str())
                if offsets:
                    last_progress = time.monotonic()
                    got = np.fromiter(offsets, dtype=np.int64, count=len(offsets))
                    found.append(got[got < end])
                    next_offset = int(got[-1]) + 1
                    done = done or next_offset >= end
                if not done and consumer.position([ktp])[0].offset >= end:  # the span ends in a marker
                    done = True
                if not done and time.monotonic() - last_progress > self.stall_timeout:
                    raise stalled(tp, start, end, self.stall_timeout)
        except KafkaException as exc:
            raise read_failed(tp, exc) from exc
        finally:
            consumer.unassign()
        return np.concatenate(found) if found else _NONE


@dataclass(frozen=True)
class FileRef:
    """A data file as the Delta log names it (relative to the table root), with the values of
    ``topic`` / ``partition`` when the table is partitioned by them (the file then lacks them)."""

    path: str
    topic: str | None = None
    partition: int | None = None
    deleted: tuple[int, ...] = ()  # row indexes its deletion vector removes (another engine's DELETE)
    deleted_by: str = ""  # the commit that deleted them: "version 7 (DELETE)"


V = TypeVar("V", str, int)


@dataclass(frozen=True)
class Bounds(Generic[V]):
    """The least and the greatest value of a column in a file, as its statistics say (None: not recorded)."""

    low: V | None = None
    high: V | None = None

    def admits(self, value: V) -> bool:
        """Whether ``value`` may be in the file (unknown bounds: yes)."""
        return self.low is None or self.high is None or self.low <= value <= self.high

    @property
    def only(self) -> V | None:
        """The one value of the file, when the bounds pin it (None: several, or unknown)."""
        return self.low if self.low is not None and self.low == self.high else None


@dataclass(frozen=True)
class FileStats:
    """A data file and what its statistics say of its coordinates."""

    ref: FileRef
    topic: Bounds[str] = Bounds()
    partition: Bounds[int] = Bounds()
    offset: Bounds[int] = Bounds()

    def may_hold(self, tp: TopicPartition, lo: int, hi: int | None) -> bool:
        """Whether rows of ``tp`` at offsets in ``[lo, hi)`` may be in the file (unknown: yes)."""
        offset = self.offset
        return self.topic.admits(tp.topic) and self.partition.admits(tp.partition) and \
            (offset.high is None or offset.high >= lo) and (offset.low is None or hi is None or offset.low < hi)


def _int(value) -> int | None:
    return None if value is None else int(value)


def _bounds(row: dict, key: str, cast: Callable[[Any], V]) -> Bounds[V]:
    """A column's bounds in a file's add action: a partition value is both (the file lacks the column)."""
    fixed = row.get(f"partition.{key}")
    low, high = (fixed, fixed) if fixed is not None else (row.get(f"min.{key}"), row.get(f"max.{key}"))
    return Bounds(None if low is None else cast(low), None if high is None else cast(high))


def table_files(table, deleted: Mapping[str, tuple[int, ...]] | None = None,
                deleted_by: Mapping[str, str] | None = None) -> list[FileStats]:
    """The data files of a ``deltalake.DeltaTable`` snapshot with their coordinate statistics;
    ``deleted``: the rows deletion vectors remove, by file (and ``deleted_by``: which commit)."""
    actions, out = add_actions_of(table), []
    deleted, deleted_by = deleted or {}, deleted_by or {}
    wanted = ["path"] + [f"{kind}.{key}" for kind in ("partition", "min", "max") for key in KEYS]
    # column by column: Table.to_pylist() imports pandas (~0.2 s) to rule it out
    columns = {name: actions[name].to_pylist() for name in wanted if name in actions.column_names}
    for i in range(actions.num_rows):
        row = {name: values[i] for name, values in columns.items()}
        topic, partition = row.get("partition.topic"), row.get("partition.partition")
        path = row["path"]
        out.append(FileStats(FileRef(path, None if topic is None else str(topic), _int(partition),
                                     deleted.get(path, ()), deleted_by.get(path, "")),
                             _bounds(row, "topic", str), _bounds(row, "partition", int), _bounds(row, "offset", int)))
    return out


class FileIndex:
    """A table's files by the topic-partition their statistics pin (one per file, as batches write
    them), so a slice finds its files without testing every file of the table."""

    def __init__(self, files: Sequence[FileStats]):
        self.by_tp: dict[TopicPartition, list[FileStats]] = {}
        self.others: list[FileStats] = []  # files of several partitions, or without statistics
        for f in files:
            topic, partition = f.topic.only, f.partition.only
            if topic is not None and partition is not None:
                self.by_tp.setdefault(TopicPartition(topic, partition), []).append(f)
            else:
                self.others.append(f)

    def _of(self, tp: TopicPartition) -> list[FileStats]:
        return self.by_tp.get(tp, []) + self.others

    def files(self, tp: TopicPartition, lo: int, hi: int | None) -> tuple[FileRef, ...]:
        """The files that may hold rows of ``tp`` at offsets in ``[lo, hi)``."""
        return tuple(f.ref for f in self._of(tp) if f.may_hold(tp, lo, hi))

    def highest_offset(self, tp: TopicPartition) -> int | None:
        """The highest offset of ``tp`` the statistics admit (None: no file holds ``tp``, or one
        may but records no offset statistics)."""
        top = None
        for f in self._of(tp):
            if f.may_hold(tp, 0, None):
                if f.offset.high is None:
                    return None
                top = f.offset.high if top is None else max(top, f.offset.high)
        return top


def table_offsets(location: TableLocation, files: Sequence[FileRef], tp: TopicPartition, lo: int, hi: int | None,
                  ingest_id: str | None = None, deleted: dict[str, list[np.ndarray]] | None = None,
                  names: Mapping[str, str] | None = None) -> np.ndarray:
    """The ``offset`` of every row of ``tp`` in ``[lo, hi)`` in ``files``, duplicates kept; with
    ``ingest_id``, only rows whose ``ingest_id`` column says so (a dead-letter table's). Rows a
    deletion vector removes are not rows of the table: their offsets go to ``deleted`` (by the
    commit that deleted them) when it is given. ``names``: logical → physical column names (column
    mapping: the files hold the physical ones)."""
    import pyarrow.parquet as pq

    found: list[np.ndarray] = []
    for ref in files:
        first = 0  # the file's row index of the batch's first row
        with location.fs.open_input_file(location.join(ref.path)) as f:
            pf = pq.ParquetFile(f)
            physical = {k: (names or {}).get(k, k) for k in (*KEYS, "ingest_id")}
            present = [k for k in (*KEYS, "ingest_id") if physical[k] in pf.schema_arrow.names]
            strings = [physical[k] for k in ("topic", "ingest_id") if k in present]  # compared by dictionary index
            if strings:  # the footer read once: a reader naming a column absent from the file fails
                pf = pq.ParquetFile(f, metadata=pf.metadata, read_dictionary=strings)
            for batch in pf.iter_batches(columns=[physical[k] for k in present], batch_size=262_144):
                batch = batch.rename_columns(present)
                offsets = _ints(batch["offset"])
                gone = _deleted_in(ref.deleted, first, offsets.size)
                first += offsets.size
                mask = offsets >= lo
                if hi is not None:
                    mask &= offsets < hi
                if "topic" in present:
                    mask &= _equal(batch["topic"], tp.topic)
                elif ref.topic != tp.topic:
                    continue
                if "partition" in present:
                    mask &= _ints(batch["partition"]) == tp.partition
                elif ref.partition != tp.partition:
                    continue
                if ingest_id is not None and "ingest_id" in present:
                    mask &= _equal(batch["ingest_id"], ingest_id)
                if gone is not None:
                    if deleted is not None and (mask & gone).any():
                        deleted.setdefault(ref.deleted_by, []).append(offsets[mask & gone])
                    mask &= ~gone
                picked = offsets[mask]
                if picked.size:
                    found.append(picked)
    return np.concatenate(found) if found else _NONE


def _deleted_in(rows: tuple[int, ...], first: int, size: int) -> np.ndarray | None:
    """Which of a batch's rows (the file's rows ``first``…) a deletion vector removes (None: none)."""
    if not rows:
        return None
    indexes = np.asarray(rows, dtype=np.int64)
    indexes = indexes[(indexes >= first) & (indexes < first + size)] - first
    if not indexes.size:
        return None
    mask = np.zeros(size, dtype=bool)
    mask[indexes] = True
    return mask


# Arrow to numpy through the data buffers: pyarrow's to_numpy(), pa.scalar() and compute calls
# given a Python value import pandas (~0.2 s, holding the GIL the other slices' reads need).
def _ints(array) -> np.ndarray:
    """An integer Arrow array as int64 numpy; a null (no row of ours has one) as -1, below every offset."""
    import pyarrow as pa

    kind = array.type
    if array.null_count or not pa.types.is_integer(kind):
        import pyarrow.compute as pc

        return pc.fill_null(pc.cast(array, pa.int64()), -1).to_numpy(zero_copy_only=False)
    dtype = np.dtype(f"<{'i' if pa.types.is_signed_integer(kind) else 'u'}{kind.bit_width // 8}")
    values = np.frombuffer(array.buffers()[1], dtype=dtype)[array.offset:array.offset + len(array)]
    return values.astype(np.int64, copy=False)


def _equal(array, value: str) -> np.ndarray:
    """Where a string column read as a dictionary (or, should a reader not, as strings) holds ``value``."""
    import pyarrow as pa

    if isinstance(array, pa.DictionaryArray):
        codes = [i for i, name in enumerate(array.dictionary.to_pylist()) if name == value]
        return np.isin(_ints(array.indices), codes)
    return np.array(array.to_pylist(), dtype=object) == value
