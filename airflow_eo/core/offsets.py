"""Offsets: the small value objects of Kafka positions (partitions, ranges, bounds, gaps).

Offsets follow Kafka: a range ``[start, end)`` holds the offsets ``start .. end-1``; a
committed offset is the *next* offset to read.

    >>> str(OffsetRange("orders", 0, 10, 25)), OffsetRange("orders", 0, 10, 25).size
    ('orders[0] 10..25', 15)
"""

from __future__ import annotations

from dataclasses import dataclass

EARLIEST = -2
LATEST = -1


@dataclass(frozen=True, order=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Half-open offset range ``[start, end)`` of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def size(self) -> int:
        """Offsets spanned; records may be fewer (gaps)."""
        return self.end - self.start

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] {self.start}..{self.end}"


@dataclass(frozen=True)
class PartitionBounds:
    """What Kafka holds for a partition: first offset retained, last stable offset."""

    tp: TopicPartition
    log_start: int
    end: int


@dataclass(frozen=True)
class SkippedRange:
    """Offsets the table will never hold, recorded in the commit that skips them."""

    topic: str
    partition: int
    start: int
    end: int
    reason: str


@dataclass(frozen=True, order=True)
class RecordStamp:
    """One record's offset and timestamp (epoch ms): what a partition's fingerprint is made of where
    Kafka reports no topic id (:mod:`airflow_eo.core.identity`)."""

    offset: int
    timestamp_ms: int


@dataclass(frozen=True, order=True)
class TopicReset:
    """One partition of a recreated topic read again from the new topic's start, recorded in the
    commit that does it (``on_topic_recreated="reset"``): ``committed`` the table's offset (of the
    old topic; None: never read), ``start`` where the new topic's partition starts (None: the new
    topic has no such partition, its offset is cleared), ``reason`` both identities."""

    topic: str
    partition: int
    committed: int | None
    start: int | None
    reason: str

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True)
class RunIdentity:
    """Who asked for a batch. ``run_key`` is stable across retries and clears of one run."""

    run_key: str
    dag_id: str | None = None
    run_id: str | None = None
    task_id: str | None = None
    try_number: int | None = None


@dataclass(frozen=True, order=True)
class Interval:
    """A half-open span of Kafka record time ``[start_ms, end_ms)`` in epoch milliseconds: the
    data interval an interval-mode batch owns (:mod:`airflow_eo.core.intervals`)."""

    start_ms: int
    end_ms: int

    def __str__(self) -> str:
        from datetime import datetime, timezone

        def iso(ms: int) -> str:
            return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat().replace("+00:00", "Z")

        return f"[{iso(self.start_ms)}, {iso(self.end_ms)})"
