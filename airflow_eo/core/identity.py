"""A topic's identity: whether the topic Kafka holds now is the one the table's offsets are of (no I/O).

A topic deleted and created again under its old name starts at offset 0: reading on from the
table's committed offsets would skip the new topic's first records without a word. So each
commit records what identifies the topics it read, and each plan compares it with Kafka's:

* **the topic id** (KIP-516, Kafka 2.8+), where the broker reports one: the table keeps a 63-bit
  mark of it (:func:`id_mark`, a ``txn`` version, which survives log cleanup) and the whole id in
  the commit's metadata;
* where the broker reports none (all zeros: the embedded broker, older brokers), a **fingerprint**
  per partition: the offset and timestamp of the last record below the committed offset
  (:class:`~airflow_eo.core.offsets.RecordStamp`, packed into one ``txn`` version by
  :func:`pack_stamp`). A record's timestamp at an offset never changes within one topic; the
  new topic's record at that offset has another (a record that is gone, compacted or aborted,
  proves nothing: the check is then skipped for that partition);
* and, whatever Kafka reports, the offsets themselves: a committed offset above the partition's
  end, or on a partition the topic no longer has, is of another topic.

:func:`recreations` decides from these facts; the planner gathers them
(:mod:`airflow_eo.loop.planner`). A recreated topic fails the table without retry
(:class:`~airflow_eo.core.errors.TopicRecreatedError`), unless ``on_topic_recreated="reset"``:
then its partitions are read from the new topic's start, and the reset is recorded in the commit.

    >>> tp = TopicPartition("rc", 0)
    >>> found = recreations({tp: 10}, {tp: PartitionBounds(tp, 0, 25)}, kafka_ids={"rc": None},
    ...                     marks={}, stamps={tp: RecordStamp(9, 1_700_000_000_000)},
    ...                     found={tp: RecordStamp(9, 1_700_000_999_000)})
    >>> [r.topic for r in found]
    ['rc']
    >>> unpack_stamp(pack_stamp(RecordStamp(9, 1_700_000_000_000), committed=10), committed=10)
    RecordStamp(offset=9, timestamp_ms=1700000000000)
"""

from __future__ import annotations

import base64
import enum
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping

from airflow_eo.core.offsets import PartitionBounds, RecordStamp, TopicPartition

# A fingerprint is the last record within this many offsets below the committed offset (transaction
# markers and aborted records take offsets too); none found there: no fingerprint.
STAMP_LOOK_BACK = 32
_DISTANCE_BITS = 16  # the stamp's distance below the committed offset, packed under its timestamp


class OnTopicRecreated(str, enum.Enum):
    """What a plan does with a topic that was deleted and created again since the table read it."""

    FAIL = "fail"  # the table stays as it is, the run fails without retry (the default)
    RESET = "reset"  # the topic's partitions are read from the new topic's start, recorded in the commit


def normal_topic_id(topic_id: str | None) -> str | None:
    """Kafka's topic id as the client prints it (base64url, 22 characters); None for none (all zeros).

    >>> normal_topic_id("AAAAAAAAAAAAAAAAAAAAAA") is None
    True
    """
    if not topic_id:
        return None
    try:
        raw = base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4))
    except ValueError:
        raw = b""
    if len(raw) != 16:
        try:
            raw = uuid.UUID(topic_id).bytes
        except ValueError:
            return topic_id
    return None if not any(raw) else base64.urlsafe_b64encode(raw).decode().rstrip("=")


def id_mark(topic_id: str) -> int:
    """The ``txn`` version that names a topic id: its first 63 bits, never 0.

    >>> id_mark("Mh1ZQ3UdQ6-uQ_sSkE2a3Q") == id_mark("Mh1ZQ3UdQ6-uQ_sSkE2a3Q") != id_mark("AQAAAAAAAAAAAAAAAAAAAA")
    True
    """
    raw = base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4))
    return (int.from_bytes(raw[:8], "big") & (2**63 - 1)) or 1


def pack_stamp(stamp: RecordStamp, committed: int) -> int | None:
    """One ``txn`` version holding a fingerprint: its timestamp and its distance below ``committed``
    (None: not packable, e.g. a record without a timestamp)."""
    distance = committed - 1 - stamp.offset
    if stamp.timestamp_ms <= 0 or not 0 <= distance < 2**_DISTANCE_BITS or stamp.timestamp_ms >= 2**46:
        return None
    return (stamp.timestamp_ms << _DISTANCE_BITS) | distance


def unpack_stamp(value: int | None, committed: int | None) -> RecordStamp | None:
    """The fingerprint a ``txn`` version holds for a partition committed at ``committed`` (0: none)."""
    if not value or committed is None:
        return None
    return RecordStamp(committed - 1 - (value & (2**_DISTANCE_BITS - 1)), value >> _DISTANCE_BITS)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Recreation:
    """A topic the table read that Kafka now holds anew: what the table recorded, what Kafka says."""

    topic: str
    recorded: str
    found: str

    def __str__(self) -> str:
        return f"topic {self.topic!r} was deleted and created again since the table read it: the table's offsets " \
               f"are of the topic with {self.recorded}, Kafka's {self.topic!r} has {self.found}"


def recreations(
    committed: Mapping[TopicPartition, int | None], bounds: Mapping[TopicPartition, PartitionBounds], *,
    kafka_ids: Mapping[str, str | None], marks: Mapping[str, int | None],
    stamps: Mapping[TopicPartition, RecordStamp | None], found: Mapping[TopicPartition, RecordStamp | None],
    recorded_ids: Mapping[str, str] | None = None,
) -> list[Recreation]:
    """The topics among ``committed``'s whose identity changed, one :class:`Recreation` each.

    ``kafka_ids``: each topic's id as Kafka reports it now (None: none); ``marks``: the table's
    :func:`id_mark` of the id it recorded; ``stamps``: the table's fingerprints; ``found``: the
    record Kafka holds now at each fingerprint's offset (the first at or after it; None: none).
    A topic whose recorded id equals Kafka's is the same topic, whatever its offsets say (a
    committed offset above the end is then a truncation: the plan's own error).
    """
    out: list[Recreation] = []
    topics = sorted({tp.topic for tp, offset in committed.items() if offset is not None})
    for topic in topics:
        kafka_id, mark = kafka_ids.get(topic), marks.get(topic)
        if kafka_id is not None and mark:
            if id_mark(kafka_id) != mark:
                was = (recorded_ids or {}).get(topic)
                out.append(Recreation(topic, f"topic id {was}" if was else f"another topic id (mark {mark:#x})",
                                      f"topic id {kafka_id}"))
            continue
        mine = sorted(tp for tp, offset in committed.items() if tp.topic == topic and offset is not None)
        reason = None
        for tp in mine:
            offset, b = committed[tp], bounds.get(tp)
            assert offset is not None
            if b is None and offset > 0:
                have = len([p for p in bounds if p.topic == topic])
                reason = (f"partition {tp.partition} read up to offset {offset}", f"{have} partition(s), no {tp}")
            elif b is not None and offset > b.end:
                reason = (f"{tp} read up to offset {offset}", f"{tp} ending at offset {b.end}")
            else:
                stamp, now = stamps.get(tp), found.get(tp)
                if stamp is not None and now is not None and now.offset == stamp.offset \
                        and now.timestamp_ms != stamp.timestamp_ms:
                    reason = (f"{tp} record {stamp.offset} at {_iso(stamp.timestamp_ms)}",
                              f"{tp} record {now.offset} at {_iso(now.timestamp_ms)}")
            if reason is not None:
                break
        if reason is not None:
            out.append(Recreation(topic, *reason))
    return out


def stamped(committed: Mapping[TopicPartition, int | None], bounds: Mapping[TopicPartition, PartitionBounds],
            stamps: Mapping[TopicPartition, RecordStamp | None], reading: set[str]) -> dict[TopicPartition, int]:
    """The fingerprints worth checking against Kafka now: those of the topics a plan would read
    (``reading``; a topic nothing new arrived in cannot lose a record yet), whose record Kafka may
    still hold (at or above its log start, below its end). Offset by partition."""
    return {tp: s.offset for tp, s in stamps.items() if s is not None and tp.topic in reading and tp in bounds
            and bounds[tp].log_start <= s.offset < bounds[tp].end and committed.get(tp) is not None}
