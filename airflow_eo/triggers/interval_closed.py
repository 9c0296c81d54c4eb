"""IntervalClosedTrigger: wait in the triggerer until an interval-mode run's data interval is closed.

An interval ``[T0, T1)`` may be planned once every partition holds a record stamped at or
after ``T1`` below its last stable offset, or a later committed interval bounds it, or
``close_after`` has passed since ``T1`` (:func:`airflow_eo.core.intervals.waiting`, the rule the
plan itself applies, through :meth:`airflow_eo.loop.planner.IntervalPlanner.closing`). A deferrable
:class:`~airflow_eo.operators.kafka_to_delta.KafkaToDeltaOperator` whose interval is not closed
defers to this trigger instead of failing for a retry; it resumes and plans when the trigger fires.

Each check runs in a worker thread with a Kafka client of its own, made and closed there
(as :mod:`airflow_eo.triggers.kafka_backlog` does): no client lives on the event loop
between checks. The trigger wakes at ``close_after`` past ``T1`` at the latest, when the
interval closes whatever Kafka holds.

Example::

    IntervalClosedTrigger(table_uri="/data/orders", ingest_id="orders_hourly", topics=["orders"],
                          interval_start_ms=1772582400000, interval_end_ms=1772586000000,
                          close_after=900, kafka_conn_id="kafka_default", poll_interval=60)
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Mapping

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_eo.loop.config import IngestConfig
from airflow_eo.hooks.kafka import kafka_config_of
from airflow_eo.hooks.storage import storage_options_of
from airflow_eo.kafka import KafkaOffsets
from airflow_eo.loop.planner import IntervalClosing, IntervalPlanner
from airflow_eo.core.offsets import Interval
from airflow_eo.table.ledger import Ledger
from airflow_eo.triggers.polling import poll_until

# past the moment close_after closes the interval, so the check that follows sees it closed
_CLOSING_MARGIN_SECONDS = 0.05


def interval_closing(kafka_config: Mapping[str, object], storage_options: Mapping[str, str] | None, table_uri: str,
                     ingest_id: str, topics: list[str], close_after: float, interval: Interval,
                     adopt_table: bool = False) -> IntervalClosing:
    """Whether ``interval`` may be planned now for ``ingest_id`` in the table, as the planner decides it
    (``adopt_table``: a table created elsewhere is one without this ingest's intervals yet)."""
    config = IngestConfig(table_uri=table_uri, ingest_id=ingest_id, topics=topics, mode="interval",
                          close_after=close_after, kafka_config=kafka_config, storage_options=storage_options)
    ledger = Ledger.open(config.table_uri, dict(storage_options) if storage_options else None)
    ledger.check_owner(ingest_id, adopt=adopt_table)  # never wait on (or report closed for) another ingest's table
    return IntervalPlanner(config, interval).closing(ledger, KafkaOffsets(config.kafka_config))


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat().replace("+00:00", "Z")


class IntervalClosedTrigger(BaseTrigger):
    """Fires ``{"status": "closed", "interval": ..., "committed_batch": ...}`` once the interval
    is closed (or already committed by another run).

    A transient failure (broker away) is retried with exponential backoff, up to
    ``max_failures`` in a row; a permanent one (another ingest's table, an overlapping
    interval), or one failure too many, fires ``{"status": "error", "error": "<ErrorClass>: ...",
    "retryable": ...}`` (:mod:`airflow_eo.triggers.polling`).

    Only connection ids and the non-secret options set in code are serialised (the trigger
    row holds no credentials); the connections are read in the triggerer.
    """

    def __init__(self, *, table_uri: str, ingest_id: str, topics: list[str], interval_start_ms: int,
                 interval_end_ms: int, close_after: float, kafka_conn_id: str = "kafka_default",
                 storage_conn_id: str | None = None, storage_options: dict[str, str] | None = None,
                 poll_interval: float = 60.0, started_at: float | None = None, max_failures: int = 5,
                 adopt_table: bool = False):
        super().__init__()
        self.table_uri, self.ingest_id, self.topics = table_uri, ingest_id, list(topics)
        self.interval = Interval(int(interval_start_ms), int(interval_end_ms))
        self.close_after = float(close_after)
        self.kafka_conn_id, self.storage_conn_id, self.storage_options = kafka_conn_id, storage_conn_id, storage_options
        self.poll_interval = float(poll_interval)
        self.started_at = started_at if started_at is not None else time.time()
        self.max_failures = int(max_failures)
        self.adopt_table = bool(adopt_table)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"table_uri": self.table_uri, "ingest_id": self.ingest_id, "topics": self.topics,
             "interval_start_ms": self.interval.start_ms, "interval_end_ms": self.interval.end_ms,
             "close_after": self.close_after, "kafka_conn_id": self.kafka_conn_id,
             "storage_conn_id": self.storage_conn_id, "storage_options": self.storage_options,
             "poll_interval": self.poll_interval, "started_at": self.started_at, "max_failures": self.max_failures,
             "adopt_table": self.adopt_table},
        )

    async def closing(self) -> IntervalClosing:
        from asgiref.sync import sync_to_async

        kafka_config = await sync_to_async(kafka_config_of)(self.kafka_conn_id)  # the connection API is sync
        storage = await sync_to_async(storage_options_of)(self.storage_conn_id, self.storage_options)
        return await asyncio.to_thread(interval_closing, kafka_config, storage, self.table_uri, self.ingest_id,
                                       self.topics, self.close_after, self.interval, self.adopt_table)

    def decide(self, found: IntervalClosing) -> TriggerEvent | float:
        """The event a closed interval fires, else the seconds until the next check: the poll
        interval, or less when ``close_after`` closes the interval sooner."""
        waited = time.time() - self.started_at
        if found.closed:
            self.log.info("interval %s of %s is %s after %.0f s of waiting", self.interval, self.ingest_id,
                          "committed" if found.committed_batch is not None else "closed", waited)
            return TriggerEvent({"status": "closed", "interval": {"start_ms": self.interval.start_ms,
                                                                  "end_ms": self.interval.end_ms},
                                 "committed_batch": found.committed_batch, "waited_seconds": round(waited, 1)})
        self.log.info("interval %s of %s not closed: %s without a record at or after %s; closes by %s at the "
                      "latest (close_after)", self.interval, self.ingest_id, ", ".join(map(str, found.open)),
                      _iso(self.interval.end_ms), _iso(found.closes_by_ms))
        until_closed = found.closes_by_ms / 1000 - time.time() + _CLOSING_MARGIN_SECONDS
        return min(self.poll_interval, until_closed)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield await poll_until(self.closing, self.decide, poll_interval=self.poll_interval,
                               max_failures=self.max_failures, log=self.log,
                               what=f"whether interval {self.interval} of {self.ingest_id} is closed")
