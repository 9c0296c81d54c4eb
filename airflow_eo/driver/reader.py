"""Reading planned offset ranges from Kafka into Arrow batches (runs in Spark's Python workers).

``read_committed``, stops at each range's end across offset gaps (transaction markers,
aborted records), never yields an offset at or past the end, and raises instead of
returning fewer records than a range holds. One consumer reads all the ranges of a task
(one Spark task may read several partitions: small batches need no task per partition).

The record path is the cost of a batch, so it stays out of per-record Python where it can:
each ``consume()`` result is cut into runs of one partition and each column is built with
one pass over the run (no per-record dicts or appends), constant columns (topic, partition)
are repeated by Arrow, and headers are built only when a run has any.

Example::

    >>> batches = list(read_ranges({"bootstrap.servers": "127.0.0.1:9092"},
    ...                            [OffsetRange("orders", 0, 0, 1500), OffsetRange("orders", 1, 0, 700)]))  # doctest: +SKIP
    >>> sum(b.num_rows for b in batches)                                  # doctest: +SKIP
    2200
"""

from __future__ import annotations

import bisect
import sys
import threading
import time
from typing import Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError
from confluent_kafka import TopicPartition as KafkaTopicPartition

from airflow_eo.core.errors import DataLossError, ReadIncompleteError
from airflow_eo.kafka import client_config, new_consumer
from airflow_eo.core.offsets import OffsetRange

BATCH_ROWS = 10_000
# librdkafka prefetches up to queued.min.messages (default 100,000) per partition; while the
# task converts or decodes a batch, that fetcher runs ahead and takes the task's CPU (measured:
# reading and Avro-decoding 300k records took 2.9 s with the defaults, 1.4 s with these; a
# plain read 0.9 s against 0.5 s). Two batches ahead keep the pipe full. A connection may
# still set them.
_PREFETCH = {"queued.min.messages": 2 * BATCH_ROWS, "queued.max.messages.kbytes": 16384}
# Client settings this project owns: a user's connection must not change them.
_READER_SETTINGS = {
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "error",
}
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
KAFKA_SCHEMA = pa.schema([
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("timestampType", pa.int32()),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("headers", HEADERS_TYPE),
])


def spark_kafka_struct():
    """:data:`KAFKA_SCHEMA` as a Spark ``StructType`` (decoders add columns to it)."""
    from airflow_eo.compat import spark_schema_of

    return spark_schema_of(KAFKA_SCHEMA)


def read_range(
    config: Mapping[str, object], r: OffsetRange, *, batch_rows: int = BATCH_ROWS, stall_timeout: float = 60.0,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``[r.start, r.end)`` as Arrow batches, read_committed (one range
    of :func:`read_ranges`)."""
    return read_ranges(config, [r], batch_rows=batch_rows, stall_timeout=stall_timeout)


def read_ranges(
    config: Mapping[str, object], ranges: Sequence[OffsetRange], *, batch_rows: int = BATCH_ROWS,
    stall_timeout: float = 60.0,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of every ``[r.start, r.end)`` of ``ranges`` (at most one range per
    partition) as Arrow batches of one partition each, read_committed, with one consumer.

    A partition is done when the consumer's position reaches its range's end; because
    offsets have gaps (transaction markers, aborted records) the last offset of a range may
    never arrive as a message. Never yields an offset ``>= end``. Raises instead of
    returning fewer records when a range cannot be read to its end.
    """
    wanted = [r for r in ranges if r.size > 0]
    if not wanted:
        return
    keys = [(r.topic, r.partition) for r in wanted]
    if len(set(keys)) != len(keys):
        raise ValueError(f"one range per partition and task, got {wanted}")
    _import_pandas_meanwhile()
    consumer = new_consumer(client_config(config), {"group.id": str(config.get("group.id", "airflow-eo-reader")),
                                                    **_READER_SETTINGS}, defaults=_PREFETCH)
    try:
        consumer.assign([KafkaTopicPartition(r.topic, r.partition, r.start) for r in wanted])
        yield from _Reading(consumer, wanted, batch_rows, stall_timeout).batches()
    finally:
        consumer.close()


def rehearse(partitions: int = 2, rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The record path of :func:`read_ranges` — runs of messages cut by partition, each column built
    in one pass, batches of ``BATCH_ROWS`` — over ``rows`` synthetic messages of each of
    ``partitions`` partitions, without a broker: what a Spark Connect server's warm-up runs in its
    Python workers (:func:`airflow_eo.driver.direct.warm_up`), so a batch's first task finds the
    code and the lazily loaded parts of pyarrow and confluent-kafka it needs already loaded.

    >>> sum(b.num_rows for b in rehearse(partitions=2, rows=15_000))
    30000
    """
    wanted = [OffsetRange("airflow-eo-warm-up", p, 0, rows) for p in range(partitions)]
    yield from _Reading(_Rehearsal(wanted), wanted, BATCH_ROWS, stall_timeout=60.0).batches()


class _Rehearsal:
    """The three calls :class:`_Reading` makes of a consumer, answered from synthetic messages
    (consume() hands out runs of one partition, as librdkafka does)."""

    def __init__(self, ranges: list[OffsetRange]):
        from confluent_kafka import Message

        self._message = Message
        self.next = {(r.topic, r.partition): r.start for r in ranges}
        self.ends = {(r.topic, r.partition): r.end for r in ranges}
        self.stamp = int(time.time() * 1000)

    def consume(self, num_messages: int, timeout: float) -> list:
        for key, offset in self.next.items():
            n = min(num_messages, self.ends[key] - offset)
            if n > 0:
                self.next[key] = offset + n
                return [self._message(topic=key[0], partition=key[1], offset=o, key=b"key-%d" % o,
                                      value=b"v" * 180, timestamp=(1, self.stamp)) for o in range(offset, offset + n)]
        return []

    def position(self, partitions: list) -> list:
        return [KafkaTopicPartition(tp.topic, tp.partition, self.next[(tp.topic, tp.partition)]) for tp in partitions]

    def pause(self, partitions: list) -> None:
        pass


def _import_pandas_meanwhile() -> None:
    """pyarrow imports pandas (~0.2 s of CPU) at its first conversion of Python values, which the
    columns are built from: a thread starts that import now, while the consumer connects and waits
    for its first fetch, instead of after it (pyarrow's import is locked: a conversion meanwhile waits
    for it). Nothing when pandas is imported already (a later read, a Spark worker that had a task)."""
    if "pandas" not in sys.modules:
        threading.Thread(target=pa.array, args=([0],), name="airflow-eo-pyarrow-pandas", daemon=True).start()


class _Partition:
    """One range being read: where it ends, what has arrived, the rows not yet yielded."""

    __slots__ = ("range", "tp", "next_offset", "done", "pending", "pending_rows", "topic_value", "partition_value")

    def __init__(self, r: OffsetRange):
        self.range = r
        self.tp = KafkaTopicPartition(r.topic, r.partition)
        self.next_offset = r.start
        self.done = False
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.topic_value = pa.scalar(r.topic, pa.string())
        self.partition_value = pa.scalar(r.partition, pa.int32())

    def take(self) -> pa.RecordBatch:
        pending, self.pending, self.pending_rows = self.pending, [], 0
        if len(pending) == 1:
            return pending[0]
        return pa.Table.from_batches(pending, schema=KAFKA_SCHEMA).combine_chunks().to_batches()[0]


class _Reading:
    def __init__(self, consumer: Consumer, ranges: list[OffsetRange], batch_rows: int, stall_timeout: float):
        self.consumer, self.batch_rows, self.stall_timeout = consumer, batch_rows, stall_timeout
        self.parts = {(r.topic, r.partition): _Partition(r) for r in ranges}
        self.one_topic = len({r.topic for r in ranges}) == 1

    def batches(self) -> Iterator[pa.RecordBatch]:
        last_progress = time.monotonic()
        open_parts = list(self.parts.values())
        while open_parts:
            # Ask for no more than the ranges still hold: consume() waits out its timeout
            # until it has that many, which would cost a second at the end of every range.
            remaining = sum(p.range.end - p.next_offset for p in open_parts)
            messages = self.consumer.consume(max(1, min(self.batch_rows, remaining)), 1.0)
            if messages:
                last_progress = time.monotonic()
                messages, at_eof = self._without_events(messages)
                for part, run in self._runs(messages):
                    self._add(part, run)
                for part in at_eof:  # after the records that came before the event
                    part.done = True
            still_open = [p for p in open_parts if not p.done]
            if still_open:  # a range whose last offsets are markers ends at the position, not a message
                for tp in self.consumer.position([p.tp for p in still_open]):
                    part = self.parts[(tp.topic, tp.partition)]
                    part.done = part.done or tp.offset >= part.range.end
            for part in open_parts:
                if part.pending_rows and (part.done or part.pending_rows >= self.batch_rows):
                    yield part.take()
            finished = [p for p in open_parts if p.done]
            if finished:
                self.consumer.pause([p.tp for p in finished])  # stop prefetching past the range's end
                open_parts = [p for p in open_parts if not p.done]
            if open_parts and time.monotonic() - last_progress > self.stall_timeout:
                r = open_parts[0].range
                raise ReadIncompleteError(
                    f"reading {r} made no progress for {self.stall_timeout:.0f}s (broker down or range no "
                    "longer readable); nothing was committed, retry the run when Kafka is back"
                )

    def _without_events(self, messages: list) -> tuple[list, list[_Partition]]:
        """``messages`` without the error events, and the partitions whose EOF event says they
        reached their range's end. An error of a partition read here raises; a client-level error
        that is not fatal (a coordinator lookup, a connection that librdkafka re-opens) is
        passed over: a read that stops progressing fails after ``stall_timeout``."""
        events = [i for i, m in enumerate(messages) if m.error() is not None]
        if not events:
            return messages, []
        at_eof = []
        for i in events:
            m, err = messages[i], messages[i].error()
            part = self.parts.get((m.topic(), m.partition()))
            if err.code() == KafkaError._PARTITION_EOF:
                if part is not None and m.offset() >= part.range.end:
                    at_eof.append(part)
                continue
            if part is None and not err.fatal():
                continue
            r = part.range if part is not None else "the ranges of this task"
            if err.code() == KafkaError.OFFSET_OUT_OF_RANGE and part is not None:
                raise DataLossError(
                    f"{part.range.topic}[{part.range.partition}]: offsets {part.range.start}..{part.range.end} are "
                    "no longer in Kafka (deleted by retention after planning); nothing was committed. Re-run with "
                    "on_data_loss='skip' to skip the gap"
                )
            raise ReadIncompleteError(f"reading {r}: {err.str()}; nothing was committed, retry the run")
        skip = set(events)
        return [m for i, m in enumerate(messages) if i not in skip], at_eof

    def _runs(self, messages: list):
        """Consecutive messages of one partition (librdkafka hands out a fetch partition by partition)."""
        if not messages:
            return
        if len(self.parts) == 1:
            (part,) = self.parts.values()
            yield part, messages
            return
        if self.one_topic:  # ints compare and count at C speed; (topic, partition) tuples would not
            keys: list = [m.partition() for m in messages]
            if keys.count(keys[0]) == len(keys):
                part = self.parts.get((messages[0].topic(), keys[0]))
                if part is not None:
                    yield part, messages
                return
        else:
            keys = [(m.topic(), m.partition()) for m in messages]
        start = 0
        for i in range(1, len(keys) + 1):
            if i == len(keys) or keys[i] != keys[start]:
                m = messages[start]
                part = self.parts.get((m.topic(), m.partition()))
                if part is not None:
                    yield part, messages[start:i]
                start = i

    def _add(self, part: _Partition, run: list) -> None:
        if part.done or not run:
            return
        offsets = [m.offset() for m in run]
        end = part.range.end
        if offsets[-1] >= end:  # prefetched past the range: offsets rise within a partition
            keep = bisect.bisect_left(offsets, end)
            run, offsets = run[:keep], offsets[:keep]
            part.done = True
            if not run:
                return
        part.next_offset = offsets[-1] + 1
        part.done = part.done or offsets[-1] >= end - 1
        batch = _to_batch(part, run, offsets)
        part.pending.append(batch)
        part.pending_rows += batch.num_rows


def _to_batch(part: _Partition, run: list, offsets: list[int]) -> pa.RecordBatch:
    """The Kafka columns of ``run`` (messages of one partition), one pass per column."""
    n = len(run)
    types, stamps = zip(*[m.timestamp() for m in run])  # (type, epoch ms) per record
    millis = pa.array(stamps, pa.int64())
    low = pc.min(millis).as_py()
    if low is None or low < 0:  # -1: the record has no timestamp
        millis = pc.if_else(pc.less(millis, 0), pa.scalar(None, pa.int64()), millis)
    timestamps = pc.multiply(millis, 1000).cast(pa.timestamp("us", tz="UTC"))
    headers = [m.headers() for m in run]
    if any(h is not None for h in headers):
        header_column = pa.array([[{"key": k, "value": v} for k, v in h] if h else None for h in headers],
                                 HEADERS_TYPE)
    else:
        header_column = pa.nulls(n, HEADERS_TYPE)
    return pa.RecordBatch.from_arrays([
        pa.repeat(part.topic_value, n),
        pa.repeat(part.partition_value, n),
        pa.array(offsets, pa.int64()),
        timestamps,
        pa.array(types, pa.int32()),
        pa.array([m.key() for m in run], pa.binary()),
        pa.array([m.value() for m in run], pa.binary()),
        header_column,
    ], schema=KAFKA_SCHEMA)
