"""Dedup by key (``dedup_key``) on an s3:// table (a local moto_server): the stored keys are read in
Spark tasks through the table's storage options (Spark here has no hadoop-aws jar), and the result
is the one a local table gives for the same records — rows, dropped copies, recorded counts — on
both Spark paths (in-process local Spark and Spark Connect)."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.dataset as pads
from confluent_kafka import Producer
from deltalake import DeltaTable

from airflow_eo.loop.ingest import Ingestion
from airflow_eo.loop.config import IngestConfig
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.loop.reprocess import Reprocessor
from airflow_eo.table.ledger import Ledger
from airflow_eo.table.storage import TableLocation
from tests.helpers import duplicates, new_topic, read_table
from tests.system.scale.test_s3 import options_of

KEY = "CAST(headers['event-id'] AS STRING)"
SQL = "SELECT topic, partition, offset, timestamp, CAST(value AS STRING) AS body, _dedup_key FROM source"
COLUMNS = ["topic", "partition", "offset", "body", "_dedup_key"]


def send(producer: Producer, topic: str, events) -> int:
    """Each event under its id (a resend of an id is a new record at a new offset, maybe in
    another partition, as a retrying producer without idempotence writes it)."""
    n = 0
    for i, event in enumerate(events):
        producer.produce(topic, value=f"event-{event}".encode(), partition=(event + i) % 3,
                         headers=[("event-id", str(event).encode())])
        n += 1
    producer.flush(30)
    return n


def rows_of(uri: str, options: dict | None) -> pa.Table:
    if options is None:
        return read_table(uri, COLUMNS)
    files = DeltaTable(uri, storage_options=options).file_uris()
    fs = TableLocation.of(uri, options).fs
    return pads.dataset([f.split("://", 1)[1] for f in files], format="parquet", filesystem=fs).to_table(columns=COLUMNS)


def test_dedup_into_s3_drops_what_a_local_table_drops(s3, kafka_config, spark_path, tmp_path):
    topic = new_topic(kafka_config, 3)
    options = options_of(s3)
    tables = {"s3": (f"s3://{s3.bucket}/dedup-{topic}", options), "local": (str(tmp_path / "local"), None)}
    ingestions = {name: Ingestion(IngestConfig(
        table_uri=uri, ingest_id="s3_dedup", topics=[topic], kafka_config=kafka_config, storage_options=opts,
        dedup_key=KEY, dedup_horizon="1d", transform_sql=SQL), spark_path.submitter())
        for name, (uri, opts) in tables.items()}
    producer = Producer(kafka_config)
    batches = [
        list(range(100)) + list(range(0, 10)),  # 10 copies within the batch
        list(range(100, 150)) + list(range(20, 30)) + list(range(100, 105)),  # 10 stored earlier, 5 within
        list(range(40, 45)) + list(range(150, 160)) + list(range(150, 152)),  # 5 stored two batches back, 2 within
    ]
    expected = [(100, 10), (50, 15), (10, 7)]
    results: dict[str, list] = {name: [] for name in tables}
    for events, want in zip(batches, expected):
        sent = send(producer, topic, events)
        for name, ingestion in ingestions.items():
            result = ingestion.run(RunIdentity(uuid.uuid4().hex))
            assert result.status == "committed", (name, result)
            assert (result.rows, result.duplicates) == want, name
            assert result.rows + result.duplicates == sent
            results[name].append(result)

    s3_rows, local_rows = (rows_of(uri, opts) for uri, opts in tables.values())
    assert sorted(s3_rows["_dedup_key"].to_pylist(), key=int) == [str(i) for i in range(160)]  # each event once
    assert duplicates(s3_rows) == {}
    assert sorted(s3_rows.to_pylist(), key=str) == sorted(local_rows.to_pylist(), key=str)  # the same rows kept
    for name, (uri, opts) in tables.items():  # the counts are in the log, as on a local table
        recorded = [b.meta.findings.duplicates.records for b in
                    sorted(Ledger.open(uri, opts).batches("s3_dedup", limit=None), key=lambda b: b.meta.batch)]
        assert recorded == [d for _, d in expected], name

    # a reprocess of the first batch on s3: its own rows are not "already in the table"
    again = Reprocessor(ingestions["s3"]).run(RunIdentity("rp"), target_run_key=results["s3"][0].run_key)
    assert again.status == "reprocessed" and (again.rows, again.duplicates) == expected[0]
    assert sorted(rows_of(*tables["s3"])["_dedup_key"].to_pylist(), key=int) == [str(i) for i in range(160)]
