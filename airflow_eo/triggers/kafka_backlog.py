"""KafkaBacklogTrigger: wait in the triggerer until Kafka holds enough records a table has not read.

The backlog is measured exactly as the planner sees it: per partition, Kafka's last
stable offset (read_committed) minus the table's committed offset from its Delta ledger
(partitions the table never read count from the first retained offset). Offsets have
gaps (transaction markers), so this is an upper bound on the records waiting.

Example::

    KafkaBacklogTrigger(topics=["orders"], table_uri="/data/orders", ingest_id="orders.ingest",
                        kafka_conn_id="kafka_default", min_records=1000, poll_interval=30)
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_eo.hooks.kafka import kafka_config_of
from airflow_eo.hooks.storage import storage_options_of
from airflow_eo.spec import parse_option
from airflow_eo.status import measure_lag
from airflow_eo.table.ledger import Ledger
from airflow_eo.triggers.polling import poll_until


def measure_backlog(kafka_config: dict, topics: list[str] | str, table_uri: str, ingest_id: str,
                    storage_options: dict | None = None, starting_offsets: object = "earliest",
                    adopt_table: bool = False) -> dict[str, int]:
    """Offsets waiting per partition (``"topic[p]" -> n``) for ``ingest_id`` in the table: the
    lag as the planner sees it (:func:`airflow_eo.status.measure_lag`). ``topics`` and
    ``starting_offsets`` are the operator's options, raw (as templated or serialised): the spec
    parses them as it does the operator's. ``adopt_table`` (the operator's): a table created
    elsewhere is one with no offsets of this ingest yet, its backlog counted from ``starting_offsets``."""
    ledger = Ledger.open(table_uri, storage_options)
    # the operator's check: never report "no backlog" for another's table (unless the ingest adopts it)
    ledger.check_owner(ingest_id, adopt=adopt_table)
    return measure_lag(kafka_config, list(parse_option("topics", topics)), ledger, ingest_id,
                       parse_option("starting_offsets", starting_offsets))


class KafkaBacklogTrigger(BaseTrigger):
    """Fires ``{"status": "ready", "backlog": n, ...}`` once the backlog reaches ``min_records``,
    or ``{"status": "timeout", ...}`` when ``timeout`` seconds pass first.

    A transient failure (broker away) is retried with exponential backoff, up to
    ``max_failures`` in a row; a permanent one (another ingest's table, a bad config) or one
    failure too many fires ``{"status": "error", "error": "<ErrorClass>: ...", "retryable": ...}``.

    Only the connection ids are serialised (the trigger row holds no credentials); the
    connections are read in the triggerer.
    """

    def __init__(self, *, topics: list[str], table_uri: str, ingest_id: str, kafka_conn_id: str = "kafka_default",
                 min_records: int = 1, poll_interval: float = 30.0, timeout: float | None = None,
                 started_at: float | None = None, starting_offsets: object = "earliest",
                 storage_conn_id: str | None = None, max_failures: int = 5, adopt_table: bool = False):
        super().__init__()
        self.max_failures = int(max_failures)
        self.adopt_table = bool(adopt_table)
        self.topics = list(topics)
        self.table_uri = table_uri
        self.ingest_id = ingest_id
        self.kafka_conn_id = kafka_conn_id
        self.min_records = int(min_records)
        self.poll_interval = float(poll_interval)
        self.timeout = timeout
        self.started_at = started_at if started_at is not None else time.time()
        self.starting_offsets = starting_offsets
        self.storage_conn_id = storage_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"topics": self.topics, "table_uri": self.table_uri, "ingest_id": self.ingest_id,
             "kafka_conn_id": self.kafka_conn_id, "min_records": self.min_records,
             "poll_interval": self.poll_interval, "timeout": self.timeout, "started_at": self.started_at,
             "starting_offsets": self.starting_offsets, "storage_conn_id": self.storage_conn_id,
             "max_failures": self.max_failures, "adopt_table": self.adopt_table},
        )

    async def backlog(self) -> dict[str, int]:
        from asgiref.sync import sync_to_async

        config = await sync_to_async(kafka_config_of)(self.kafka_conn_id)  # connection API is sync
        storage = await sync_to_async(storage_options_of)(self.storage_conn_id)
        return await asyncio.to_thread(measure_backlog, config, self.topics, self.table_uri, self.ingest_id,
                                       storage, self.starting_offsets, self.adopt_table)

    def decide(self, per_partition: dict[str, int]) -> TriggerEvent | float:
        """The event a measured backlog fires (ready, or timed out), else the seconds until the next check."""
        total = sum(per_partition.values())
        self.log.info("backlog of %s for %s: %d (want %d)", self.topics, self.ingest_id, total, self.min_records)
        event = {"backlog": total, "per_partition": per_partition, "min_records": self.min_records}
        if total >= self.min_records:
            return TriggerEvent({"status": "ready", **event})
        if self.timeout is not None and time.time() - self.started_at >= self.timeout:
            return TriggerEvent({"status": "timeout", **event})
        return self.poll_interval

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield await poll_until(self.backlog, self.decide, poll_interval=self.poll_interval,
                               max_failures=self.max_failures, log=self.log, what=f"backlog of {self.topics}")
