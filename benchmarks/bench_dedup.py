"""Dedup by key: one batch with ``dedup_key`` and a one-day horizon against the same batch
without dedup, into copies of one large table.

The table (``rows`` rows in ``files`` files, each row with a ``_dedup_key``, Kafka timestamps
spread over the last 30 days) is built with pyarrow and deltalake, not through Spark, and
owned by the benchmark's ingest id; each measured run gets a fresh copy, so both sides start
from the same table. The batch: ``batch_records`` records from the broker, 1 % of them resends
of keys the table stored within the last day.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

INGEST_ID = "bench_dedup"
KEY = "CAST(headers['event-id'] AS STRING)"
DAY_MS = 86_400_000


def build(table_uri: str, files: int, rows: int, now_ms: int) -> None:
    """``rows`` rows in ``files`` attempt directories, newest last: file i's rows are stamped
    ``30 * (files - 1 - i) / files`` days and an hour ago."""
    from deltalake.transaction import CommitProperties, Transaction, create_table_with_add_actions

    from airflow_eo.table.commit import add_actions
    from airflow_eo.table.app_ids import batch_app_id
    from airflow_eo.table.schema import delta_schema_of
    from airflow_eo.table.staging import staged_file
    from airflow_eo.table.storage import TableLocation

    per_file = max(1, rows // files)
    schema = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                        ("timestamp", pa.timestamp("us", tz="UTC")), ("body", pa.string()), ("_dedup_key", pa.string())])
    location, staged = TableLocation.of(table_uri), []
    for i in range(files):
        ts = (now_ms - int(30 * DAY_MS * (files - 1 - i) / files) - 3_600_000) * 1000  # newest: an hour ago
        keys = [f"old-{n}" for n in range(i * per_file, (i + 1) * per_file)]
        table = pa.table({"topic": pa.array(["history"] * per_file), "partition": pa.array([0] * per_file, pa.int32()),
                          "offset": pa.array(range(i * per_file, (i + 1) * per_file), pa.int64()),
                          "timestamp": pa.array([ts] * per_file, pa.timestamp("us", tz="UTC")),
                          "body": pa.array(["x" * 100] * per_file), "_dedup_key": pa.array(keys)}, schema=schema)
        full = os.path.join(table_uri, f"b{i + 1:08d}-{uuid.uuid4().hex[:16]}", "part-00000.parquet")
        os.makedirs(os.path.dirname(full), exist_ok=True)
        pq.write_table(table, full)
        staged.append(staged_file(location, location.fs.get_file_info(full)))
    create_table_with_add_actions(table_uri, delta_schema_of(schema), add_actions(staged), mode="error",
                                  commit_properties=CommitProperties(
                                      custom_metadata={"bench": "build"},
                                      app_transactions=[Transaction(batch_app_id(INGEST_ID), files)]))


def recent_keys(rows: int, files: int, count: int) -> list[str]:
    """Keys of the newest file (stamped within the last day): resends the horizon must catch."""
    per_file = max(1, rows // files)
    return [f"old-{n}" for n in range((files - 1) * per_file, (files - 1) * per_file + count)]


def load(config: dict, topic: str, records: int, partitions: int, resent: list[str]) -> None:
    from confluent_kafka import Producer

    producer = Producer({**config, "linger.ms": 20})
    for i in range(records):
        key = resent[i % len(resent)] if resent and i % 100 == 0 else f"new-{i}"
        while True:
            try:
                producer.produce(topic, value=b'{"v": "' + b"y" * 100 + b'"}', partition=i % partitions,
                                 headers=[("event-id", key.encode())])
                break
            except BufferError:
                producer.poll(0.5)
    producer.flush(60)


def ingest(spark, kafka_config: dict, table_uri: str, topic: str, dedup: bool, join_back: bool = False) -> dict:
    """One exactly-once batch of the whole topic into ``table_uri`` (in this process's session).
    ``join_back``: the transform leaves ``_dedup_key`` out, so the driver joins it back."""
    from airflow_eo.spec import Transform
    from airflow_eo.driver.main import InProcessSubmitter
    from airflow_eo.loop.ingest import Ingestion
    from airflow_eo.loop.config import IngestConfig
    from airflow_eo.core.offsets import RunIdentity

    # the same columns either way: plain stores a null key; with dedup the transform keeps the
    # key column (as docs/how-to/dedup.md advises) or the driver joins it back
    key = "CAST(NULL AS STRING) AS _dedup_key" if not dedup else ("" if join_back else "_dedup_key")
    sql = "SELECT topic, partition, offset, timestamp, CAST(value AS STRING) AS body" + (
        f", {key}" if key else "") + " FROM source"
    config = IngestConfig(table_uri=table_uri, ingest_id=INGEST_ID, topics=[topic], kafka_config=kafka_config,
                          transform=Transform(sql=sql), dedup_key=KEY if dedup else None,
                          dedup_horizon="1d" if dedup else None)
    started = time.monotonic()
    result = Ingestion(config, InProcessSubmitter(spark)).run(RunIdentity(uuid.uuid4().hex))
    return {"seconds": time.monotonic() - started, "rows": result.rows, "duplicates": result.duplicates}


def copy(built: str, target: str) -> str:
    shutil.copytree(built, target)
    return target
