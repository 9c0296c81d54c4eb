"""Avro against JSON decoding of the same records through the same exactly-once path.

The same nested records (record, array, map, decimal, timestamp, nullable union, enum) are
written twice: as JSON (decoded by Spark's ``from_json`` with a DDL schema) and as Avro in
the Confluent wire format through a Schema Registry (decoded by fastavro in the Spark tasks).
Each side is one exactly-once ingest (``Ingestion`` with an in-process local SparkSession,
so the JVM start is not part of either) selecting every decoded column; the rate ratio is
``avro_rate / json_rate``. The registry is the project's test double (``airflow_eo/testing/registry.py``):
the decode work is the same as with a real registry (one schema fetch per task and id).
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from confluent_kafka import Producer  # noqa: E402

from airflow_eo.spec import Transform  # noqa: E402
from airflow_eo.loop.ingest import Ingestion  # noqa: E402
from airflow_eo.loop.config import IngestConfig
from airflow_eo.core.offsets import RunIdentity  # noqa: E402
from tests.helpers import ORDER_DDL, ORDER_SCHEMA, order, produce_avro, send  # noqa: E402

SCHEMA, DDL = ORDER_SCHEMA, ORDER_DDL
SQL = "SELECT topic, partition, offset, data.* FROM source"


record = order


def load(kafka_config: dict, registry_url: str, json_topic: str, avro_topic: str, records: int,
         partitions: int) -> float:
    started = time.monotonic()
    producer = Producer({**kafka_config, "linger.ms": 20})
    for i in range(records):
        r = record(i)
        value = json.dumps({**r, "price": float(r["price"]), "at": r["at"].isoformat()}).encode()
        send(producer, json_topic, value, i % partitions)
    producer.flush(120)
    produce_avro(kafka_config, avro_topic, (record(i) for i in range(records)), SCHEMA, {"url": registry_url},
                 partitions)
    return time.monotonic() - started


def ingest(spark, kafka_config: dict, table: str, topic: str, fmt: str, registry_url: str) -> dict:
    from airflow_eo.driver.main import InProcessSubmitter

    options = {"value_schema": DDL} if fmt == "json" else {"value_format": "avro",
                                                             "schema_registry": {"url": registry_url}}
    config = IngestConfig(table_uri=table, ingest_id=f"decode_{fmt}", topics=[topic], kafka_config=kafka_config,
                          transform=Transform(sql=SQL), dead_letter_table_uri=f"{table}_dlq", **options)
    started = time.monotonic()
    result = Ingestion(config, InProcessSubmitter(spark)).run(RunIdentity(run_key=f"bench-{fmt}"))
    return {"seconds": time.monotonic() - started, "rows": result.rows, "dead_letters": result.dead_letters}
