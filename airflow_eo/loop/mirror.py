"""Mirror a table's committed offsets into a Kafka consumer group (optional, off by default).

The Delta log is the only source of truth for what a table holds. Lag tools (Burrow,
``kafka-consumer-groups``, Prometheus exporters) only read consumer groups, so after a
batch commits, the table's offsets are also committed to a group the user names. The
group never drives planning: a failed mirror only logs a warning, and because each run
mirrors the table's *current* offsets (not the batch's), a mirror that missed a run is
corrected by the next one.

The group has no members: offsets are committed by a consumer that never subscribes,
which Kafka accepts for a group in the ``Empty`` state. Do not give the group name to
a real consumer application: its commits would overwrite the mirror and vice versa.

Example::

    >>> mirror_offsets({"bootstrap.servers": "127.0.0.1:9092"}, "orders-lake",
    ...                {TopicPartition("orders", 0): 1200})                    # doctest: +SKIP
    True
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Mapping, Sequence

from airflow_eo.core.offsets import TopicPartition

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 10.0


def mirror_offsets(kafka_config: Mapping[str, object], group_id: str,
                   offsets: Mapping[TopicPartition, int | None], timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Commit ``offsets`` (next offset to read, per partition) to ``group_id``.

    Partitions the table never committed (``None``) are left out. Returns whether the
    broker acknowledged the commit within ``timeout``; never raises for Kafka errors.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    from airflow_eo.kafka import client_config, new_consumer

    wanted = [KafkaTopicPartition(tp.topic, tp.partition, off) for tp, off in offsets.items() if off is not None]
    if not wanted:
        return True
    acks: list = []
    consumer = new_consumer(client_config(kafka_config), {
        "group.id": group_id, "enable.auto.commit": False,
        "log_level": 0,  # librdkafka would print connection errors to stderr; we warn once instead
        # an asynchronous commit + our own deadline: a synchronous commit waits for a
        # group coordinator indefinitely while the broker is down
        "on_commit": lambda err, parts: acks.append((err, parts)),
    })
    try:
        consumer.commit(offsets=wanted, asynchronous=True)
        deadline = time.monotonic() + timeout
        while not acks and time.monotonic() < deadline:
            consumer.poll(0.2)
    except (KafkaException, RuntimeError) as exc:
        acks.append((exc, []))
    finally:
        # close() waits for a commit still in flight (~45 s measured with the broker
        # down): let it finish in the background rather than hold up the run
        closer = threading.Thread(target=consumer.close, name=f"mirror-close-{group_id}", daemon=True)
        closer.start()
        closer.join(timeout)
    if not acks:
        log.warning("could not mirror offsets to consumer group %r within %.0fs (broker unreachable?); "
                    "the table is unaffected and the next run mirrors again", group_id, timeout)
        return False
    err, parts = acks[0]
    failed = [p for p in parts if p.error is not None]
    if err is not None or failed:
        log.warning("mirroring offsets to consumer group %r failed (%s); the table is unaffected and "
                    "the next run mirrors again", group_id, err or failed[0].error)
        return False
    log.info("mirrored %d partition offsets to consumer group %r", len(wanted), group_id)
    return True


def mirror_table(kafka_config: Mapping[str, object], group_id: str, ledger, ingest_id: str,
                 topics: Sequence[str], timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Mirror the table's current committed offsets of ``topics`` (from the Delta log)."""
    try:
        from airflow_eo.kafka import KafkaOffsets

        partitions = KafkaOffsets(kafka_config, timeout=timeout).partitions(topics)
        return mirror_offsets(kafka_config, group_id, ledger.committed_offsets(ingest_id, partitions), timeout)
    except Exception as exc:  # the mirror is best effort by design: never fail a committed batch
        log.warning("could not mirror offsets to consumer group %r (%s: %s); the table is unaffected "
                    "and the next run mirrors again", group_id, exc.__class__.__name__, exc)
        return False
