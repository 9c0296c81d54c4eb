"""``airflow-eo demo``: the whole pipeline on the embedded broker, in one command.

A development extra (``pip install 'airflow-eo[demo]'``, which brings the noida-db broker):
the CLI imports this package only for ``airflow-eo demo``; nothing in the library does.

Starts noida-db on 127.0.0.1, produces sample order events (plain, in a committed
transaction, and in an aborted one), ingests them into a local Delta table through the
example Airflow DAG (``dag.test()``, real spark-submit), produces more, ingests again,
then prints the table's committed offsets and a few rows, and stops the broker.
"""

from __future__ import annotations

import json
import os
import shutil
import time

DEMO_TOPIC = "orders"
DEMO_INGEST_ID = "orders"  # the example DAG's ingest_id


def produce_orders(config: dict, count: int, start: int = 0) -> None:
    from confluent_kafka import Producer

    producer = Producer({**config, "enable.idempotence": True, "linger.ms": 20})
    for i in range(start, start + count):
        event = {"order_id": i, "customer": f"c{i % 97}", "amount": round(10 + (i % 500) * 0.37, 2)}
        producer.produce(DEMO_TOPIC, key=str(i).encode(), value=json.dumps(event).encode(), partition=i % 3)
        if i % 5000 == 0:
            producer.poll(0)
    producer.flush(60)
    tx = Producer({**config, "transactional.id": f"demo-{start}"})
    tx.init_transactions(30)
    tx.begin_transaction()
    tx.produce(DEMO_TOPIC, value=b'{"order_id": -1, "note": "aborted: never ingested"}', partition=0)
    tx.abort_transaction()


def run_demo(directory: str, records: int = 10_000) -> int:
    from confluent_kafka.admin import AdminClient, NewTopic

    from airflow_eo.demo.broker import EmbeddedBroker
    from airflow_eo.status import table_status

    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    table_uri = os.path.join(directory, "orders_table")
    # Each demo starts a fresh broker whose offsets restart at 0: a table from an earlier
    # demo would (rightly) be refused as "topic recreated", so start the table afresh too.
    shutil.rmtree(table_uri, ignore_errors=True)
    step = _progress()
    with EmbeddedBroker() as broker:
        step(f"broker up at {broker.bootstrap_servers}")
        admin = AdminClient(broker.config)  # must outlive the futures
        for f in admin.create_topics([NewTopic(DEMO_TOPIC, 3, 1)]).values():
            f.result()
        produce_orders(broker.config, records // 2)
        step(f"produced {records // 2} order events (+1 aborted transaction)")
        results = [_ingest(table_uri, broker, directory)]
        step(f"run 1: {_summary(results[-1])}")
        produce_orders(broker.config, records - records // 2, start=records // 2)
        step(f"produced {records - records // 2} more")
        results.append(_ingest(table_uri, broker, directory))
        step(f"run 2: {_summary(results[-1])}")
        status = table_status(table_uri, DEMO_INGEST_ID, broker.config)
    print()
    print(f"Delta table {table_uri} (version {status['version']}):")
    for p in status["partitions"]:
        print(f"  {p['topic']}[{p['partition']}] committed offset {p['committed']}  end {p['end']}  lag {p['lag']}")
    _show_rows(table_uri)
    expected = records
    got = _count_rows(table_uri)
    print(f"\nrecords produced {expected}, rows ingested {got}: {'exactly once' if got == expected else 'MISMATCH'}")
    return 0 if got == expected else 1


def _ingest(table_uri: str, broker, directory: str) -> dict:
    """One run of the example DAG through Airflow (``dag.test()``, real spark-submit)."""
    from airflow_eo.demo.airflow import run_demo_via_airflow

    os.environ.setdefault("AIRFLOW_HOME", os.path.join(directory, "airflow"))
    return run_demo_via_airflow(table_uri, broker.bootstrap_servers, topic=DEMO_TOPIC)


DEMO_SQL = (
    "SELECT topic, partition, offset, timestamp, "
    "get_json_object(CAST(value AS STRING), '$.order_id') AS order_id, "
    "get_json_object(CAST(value AS STRING), '$.customer') AS customer, "
    "CAST(get_json_object(CAST(value AS STRING), '$.amount') AS DOUBLE) AS amount FROM source"
)


def _count_rows(table_uri: str) -> int:
    import pyarrow.dataset as pads
    from deltalake import DeltaTable

    return pads.dataset(DeltaTable(table_uri).file_uris(), format="parquet").count_rows()


def _show_rows(table_uri: str, limit: int = 5) -> None:
    import pyarrow.dataset as pads
    from deltalake import DeltaTable

    table = pads.dataset(DeltaTable(table_uri).file_uris(), format="parquet").to_table()
    print(f"  {table.num_rows} rows; first {limit}:")
    for row in table.sort_by([("partition", "ascending"), ("offset", "ascending")]).slice(0, limit).to_pylist():
        print("   ", {k: v for k, v in row.items() if k != "timestamp"})


def _summary(result: dict) -> str:
    return (f"{result.get('status')} batch {result.get('batch')} version {result.get('version')} "
            f"rows {result.get('rows')}")


def _progress():
    started = time.monotonic()

    def step(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", flush=True)

    return step
