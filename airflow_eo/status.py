"""Status: how far a table is behind Kafka, and what its last batches were.

The lag is computed in one place (:func:`measure_lag`, over the pure
:func:`airflow_eo.planning.backlog`) and used by the run summary of the operator and the
CLI, by ``airflow-eo status``, and by the backlog sensor and its trigger: per partition,
Kafka's last stable offset minus the table's committed offset; a partition the table never
read counts from where the next run would start it (``starting_offsets``).

Example::

    >>> measure_lag({"bootstrap.servers": "127.0.0.1:9092"}, ["orders"],
    ...             Ledger.open("/data/orders"), "orders_raw")       # doctest: +SKIP
    {'orders[0]': 0, 'orders[1]': 12}
"""

from __future__ import annotations

import logging
from typing import Mapping

from airflow_eo.errors import AirflowEoError, TableError
from airflow_eo.kafka import KafkaOffsets
from airflow_eo.planning import PartitionBounds, StartingPosition, TopicPartition, backlog, partitions_without_offsets
from airflow_eo.intervals import gaps
from airflow_eo.table.intervals import IntervalLedger
from airflow_eo.table.ledger import Ledger

log = logging.getLogger(__name__)


def lag_of(kafka: KafkaOffsets, bounds: Mapping[TopicPartition, PartitionBounds], ledger: Ledger, ingest_id: str,
           starting_offsets: object = "earliest") -> dict[TopicPartition, int]:
    """The lag per partition, from Kafka's bounds and the table's ledger."""
    committed = ledger.committed_offsets(ingest_id, bounds)
    new = partitions_without_offsets(committed, bounds)
    starts = kafka.resolve_starts(StartingPosition.parse(starting_offsets), new, bounds) if new else {}
    return backlog(bounds, committed, starts)


def measure_lag(kafka_config: Mapping[str, object], topics: list[str], ledger: Ledger, ingest_id: str,
                starting_offsets: object = "earliest", timeout: float = 30.0) -> dict[str, int]:
    """Offsets waiting per partition (``"topic[p]" -> n``) for ``ingest_id`` in the table."""
    kafka = KafkaOffsets(kafka_config, timeout=timeout)
    bounds = kafka.bounds(kafka.partitions(topics))
    return {str(tp): n for tp, n in lag_of(kafka, bounds, ledger, ingest_id, starting_offsets).items()}


def table_status(table_uri: str, ingest_id: str, kafka_config: dict | None, limit: int = 5,
                 storage_options: dict | None = None) -> dict:
    """Per partition committed offset, Kafka end offset and lag; the last batches; the table's
    files and log (:class:`airflow_eo.table.maintenance.Layout`) and which maintenance is due."""
    ledger = Ledger.open(table_uri, storage_options)
    if not ledger.exists:
        raise TableError(f"there is no Delta table at {ledger.table_uri}: check the path (and --storage-options "
                         "for object storage); a table is created by its first `airflow-eo ingest`")
    ledger.check_owner(ingest_id)
    batches = ledger.batches(ingest_id, limit=50)[:limit]
    partitions = sorted({TopicPartition(r.topic, r.partition) for b in batches[:1] for r in b.ranges})
    bounds, lag = {}, {}
    if kafka_config and kafka_config.get("bootstrap.servers"):
        topics = sorted({tp.topic for tp in partitions})
        try:
            kafka = KafkaOffsets(kafka_config, timeout=10)
            bounds = kafka.bounds(kafka.partitions(topics)) if topics else {}
            lag = lag_of(kafka, bounds, ledger, ingest_id)
        except AirflowEoError as exc:
            log.warning("Kafka not reachable, lag unknown: %s", exc)
        partitions = sorted(set(partitions) | set(bounds))
    committed = ledger.committed_offsets(ingest_id, partitions)
    rows = [{"topic": tp.topic, "partition": tp.partition, "committed": committed[tp],
             "end": bounds[tp].end if tp in bounds else None, "lag": lag.get(tp)} for tp in partitions]
    from airflow_eo.table.maintenance import layout

    table_layout = layout(ledger).to_dict()
    try:
        ledger.check_txn_retention()
    except AirflowEoError as exc:
        table_layout["due"].insert(0, str(exc))
    intervals = IntervalLedger(ledger, ingest_id)
    committed_intervals = intervals.committed() if intervals.is_interval_table() else []
    return {
        "intervals": {"committed": [{"batch": c.batch, "interval": str(c.interval), "start_ms": c.interval.start_ms,
                                     "end_ms": c.interval.end_ms} for c in sorted(committed_intervals, key=lambda c: c.interval)],
                      "gaps": [str(g) for g in gaps(committed_intervals)]} if committed_intervals else None,
        "table_uri": ledger.table_uri, "ingest_id": ingest_id, "version": ledger.version,
        "last_batch": ledger.last_batch(ingest_id), "layout": table_layout, "partitions": rows,
        "batches": [{"batch": b.batch, "version": b.version, "rows": b.rows, "operation": b.operation,
                     "run_key": b.run_key, "ranges": [str(r) for r in b.ranges if r.size],
                     "late": (b.raw.get("late") or {}).get("records", 0)} for b in batches],
    }
