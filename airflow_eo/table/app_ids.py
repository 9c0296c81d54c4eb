"""The ``txn`` app ids of a table's ledger: one name per thing the ledger records (no I/O).

Every id starts with ``airflow-eo:<ingest_id>:``; what each holds is in the ledger reference
(docs/reference/ledger.md). :mod:`airflow_eo.table.ledger` reads them,
:mod:`airflow_eo.table.intervals` reads interval mode's.

    >>> batch_app_id("orders_raw"), interval_at_app_id("orders_raw", 0)
    ('airflow-eo:orders_raw:batch', 'airflow-eo:orders_raw:interval-at:0')
"""

from __future__ import annotations

import zlib

from airflow_eo.core.offsets import TopicPartition

APP_PREFIX = "airflow-eo"


def partition_app_id(ingest_id: str, tp: TopicPartition) -> str:
    return f"{APP_PREFIX}:{ingest_id}:{tp.topic}:{tp.partition}"


def batch_app_id(ingest_id: str) -> str:
    return f"{APP_PREFIX}:{ingest_id}:batch"


def topic_mark_app_id(ingest_id: str, topic: str) -> str:
    """The mark of the topic id the table's offsets of ``topic`` are of (:func:`airflow_eo.core.identity.id_mark`)."""
    return f"{APP_PREFIX}:{ingest_id}:identity:{topic}:id"


def topic_reset_app_id(ingest_id: str, topic: str) -> str:
    """The batch that last reset ``topic``'s offsets to a recreated topic's start (on_topic_recreated='reset')."""
    return f"{APP_PREFIX}:{ingest_id}:identity:{topic}:reset"


def stamp_app_id(ingest_id: str, tp: TopicPartition) -> str:
    """A partition's fingerprint where Kafka reports no topic id (:func:`airflow_eo.core.identity.pack_stamp`)."""
    return f"{APP_PREFIX}:{ingest_id}:stamp:{tp.topic}:{tp.partition}"


def dead_letters_app_id(ingest_id: str) -> str:
    """On the main table: the last batch that staged dead letters (the roll-forward goes up to it)."""
    return f"{APP_PREFIX}:{ingest_id}:dead-letters:last"


def reprocess_app_id(ingest_id: str, batch: int) -> str:
    return f"{APP_PREFIX}:{ingest_id}:reprocess:{batch}"


def dlq_app_id(ingest_id: str) -> str:
    return f"{APP_PREFIX}:{ingest_id}:dlq"


def merge_app_id(ingest_id: str) -> str:
    """write_mode=merge: marks the table as merged by key; its version is :func:`merge_mark` of the key."""
    return f"{APP_PREFIX}:{ingest_id}:merge"


def merge_mark(key: tuple[str, ...]) -> int:
    """The ``txn`` version that marks a merge table and names its key (a fingerprint, never 0).

    >>> merge_mark(("id",)) == merge_mark(("id",)) != merge_mark(("id", "tenant"))
    True
    """
    return zlib.crc32("\x1f".join(key).encode()) + 1


def interval_app_id(ingest_id: str, batch: int, side: str) -> str:
    """Interval mode (:mod:`airflow_eo.table.intervals`): batch → its interval's start / end."""
    return f"{APP_PREFIX}:{ingest_id}:interval:{batch}:{side}"


def interval_at_app_id(ingest_id: str, start_ms: int) -> str:
    """Interval mode: interval start → the batch that committed it."""
    return f"{APP_PREFIX}:{ingest_id}:interval-at:{start_ms}"


def span_app_id(ingest_id: str, side: str) -> str:
    """Interval mode: the committed span's ``min-start`` / ``max-end``."""
    return f"{APP_PREFIX}:{ingest_id}:intervals:{side}"


def boundary_app_id(ingest_id: str, at_ms: int, tp: TopicPartition) -> str:
    """Interval mode: the offset ``B(at_ms)`` of ``tp`` a committed interval used."""
    return f"{APP_PREFIX}:{ingest_id}:boundary:{at_ms}:{tp.topic}:{tp.partition}"
