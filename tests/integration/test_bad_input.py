"""Bad input: one readable error naming the cause and the fix, and the table untouched.

Every test starts from a copy of a table that already holds one committed batch, runs
an ingestion with one thing wrong, and checks the message and that the table's Delta
version, offsets and batch counter are exactly as before. Spark runs in the session's
SparkSession (InProcessSubmitter) except where spark-submit itself is the point.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from airflow_eo.table.commit import COMMITTED
from airflow_eo.demo.broker import free_port
from airflow_eo.core.errors import ConfigError, KafkaUnavailableError, SparkJobError, TableError
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.loop.config import IngestConfig
from airflow_eo.table.ledger import Ledger
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.driver.main import InProcessSubmitter
from airflow_eo.submit.spark_submit import LocalSparkSubmit
from airflow_eo.spec import Transform
from tests.helpers import committed_offsets, new_topic, produce, read_table

INGEST_ID = "bad_input"
SQL = "SELECT topic, partition, offset, timestamp, CAST(value AS STRING) AS body FROM source"


def exploding_transform(df):
    raise ValueError("column 'amount' is missing")


def run(config: IngestConfig, spark, run_key: str = "bad", cls=Ingestion, submitter=None):
    return cls(config, submitter or InProcessSubmitter(spark)).run(RunIdentity(run_key=run_key))


def state(config: IngestConfig, topic: str) -> tuple:
    dt = DeltaTable(config.table_uri)
    return (dt.version(), committed_offsets(config.table_uri, INGEST_ID, topic, 2),
            Ledger.open(config.table_uri).last_batch(INGEST_ID), sorted(dt.file_uris()))


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, kafka_config, spark):
    topic = new_topic(kafka_config, 2)
    produce(kafka_config, topic, 20, partitions=2)
    config = IngestConfig(table_uri=str(tmp_path_factory.mktemp("seed") / "table"), ingest_id=INGEST_ID,
                          topics=[topic], kafka_config=kafka_config, transform=Transform(sql=SQL))
    assert run(config, spark, "seed").status == COMMITTED
    produce(kafka_config, topic, 10, partitions=2, start=20)  # the next run would have work
    return config, topic


@pytest.fixture
def table(seeded, tmp_path):
    """A private copy of the seeded table, and its state before the test."""
    config, topic = seeded
    shutil.copytree(config.table_uri, tmp_path / "table")
    config = dataclasses.replace(config, table_uri=str(tmp_path / "table"))
    return config, topic, state(config, topic)


def assert_fails_unchanged(table, spark, error, *messages, cls=Ingestion, submitter=None, **changes):
    config, topic, before = table
    bad = dataclasses.replace(config, **changes)
    with pytest.raises(error) as info:
        run(bad, spark, cls=cls, submitter=submitter)
    text = str(info.value)
    for m in messages:
        assert m in text, text
    assert state(config, topic) == before
    return text


def test_connection_without_bootstrap_servers(table, spark):
    assert_fails_unchanged(table, spark, ConfigError, "no 'bootstrap.servers'", "set it in the Kafka connection",
                           kafka_config={"security.protocol": "PLAINTEXT"})


def test_malformed_connection(table, spark, kafka_config):
    assert_fails_unchanged(table, spark, ConfigError, "not valid", "No such configuration property",
                           "fix the Kafka connection", kafka_config={**kafka_config, "bootstrap.server": "x"})


def test_unknown_topic(table, spark):
    assert_fails_unchanged(table, spark, KafkaUnavailableError, "'no-such-topic' does not exist",
                           "check the topic name", topics=["no-such-topic"])


def test_unreachable_broker(table, spark):
    """Reported once librdkafka says every broker is down, not after the whole metadata timeout (30 s)."""
    started = time.monotonic()
    assert_fails_unchanged(table, spark, KafkaUnavailableError, "cannot reach Kafka", "check the broker is up",
                           kafka_config={"bootstrap.servers": f"127.0.0.1:{free_port()}"})
    assert time.monotonic() - started < 20


def test_table_owned_by_another_ingest(table, spark):
    assert_fails_unchanged(table, spark, TableError, "was not written by ingest_id 'someone_else'",
                           "use the ingest_id that created it", ingest_id="someone_else")


@pytest.mark.parametrize("content", ["parquet", "garbage_log"])
def test_path_that_is_not_a_delta_table(content, tmp_path, spark, kafka_config, seeded):
    path = tmp_path / "not_delta"
    path.mkdir()
    if content == "parquet":
        pq.write_table(pa.table({"a": [1]}), path / "part-0.parquet")
        expected = "is not a Delta table (no _delta_log) but holds other files (part-0.parquet)"
    else:
        (path / "_delta_log").mkdir()
        (path / "_delta_log" / "00000000000000000000.json").write_text("not json\n")
        expected = "has a Delta log that cannot be read"
    before = {p: (path / p).read_bytes() for p in _files(path)}
    config = dataclasses.replace(seeded[0], table_uri=str(path))
    with pytest.raises(TableError, match="(?i)point table_uri at") as info:
        run(config, spark)
    assert expected in str(info.value)
    assert {p: (path / p).read_bytes() for p in _files(path)} == before


def _files(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_transform_with_bad_sql(table, spark):
    assert_fails_unchanged(table, spark, ConfigError, "transform_sql failed", "Fix the SQL", "nothing was committed",
                           transform=Transform(sql="SELECT topic, partition, offset, no_such_column FROM source"))


def test_transform_function_that_raises(table, spark):
    assert_fails_unchanged(table, spark, ConfigError,
                           "transform 'tests.integration.test_bad_input:exploding_transform' raised ValueError",
                           "column 'amount' is missing", "Fix the function",
                           transform=Transform(callable="tests.integration.test_bad_input:exploding_transform"))


def test_output_that_does_not_match_the_table_schema(table, spark):
    assert_fails_unchanged(table, spark, TableError, "does not match the table schema", "new columns: ['extra']",
                           "set schema_evolution=True", transform=Transform(sql=SQL.replace(
                               " FROM", ", 1 AS extra FROM")))


def test_schema_evolution_adds_a_new_column(table, spark):
    config, topic, before = table
    evolving = dataclasses.replace(config, schema_evolution=True,
                                   transform=Transform(sql=SQL.replace(" FROM", ", length(value) AS size FROM")))
    result = run(evolving, spark)
    assert result.status == COMMITTED
    assert "size" in [f.name for f in DeltaTable(config.table_uri).schema().fields]
    rows = read_table(config.table_uri, ["offset", "size"])
    assert rows.num_rows == 30  # 20 seeded (size null: written before the column existed) + 10 new
    assert rows["size"].null_count == 20
    assert Ledger.open(config.table_uri).last_batch(INGEST_ID) == before[2] + 1


@pytest.mark.parametrize("sql, column", [
    (SQL.replace("CAST(value AS STRING) AS body", "length(value) AS body"), "changed types: ['body']"),
    (SQL.replace(", CAST(value AS STRING) AS body", ""), "missing columns: ['body']"),
])
def test_schema_evolution_refuses_incompatible_changes(table, spark, sql, column):
    assert_fails_unchanged(table, spark, TableError, column, "schema evolution adds new columns only",
                           schema_evolution=True, transform=Transform(sql=sql))


def test_spark_job_that_dies(table, spark):
    # A master URL spark-submit rejects: the JVM starts and exits at once, like a crash at launch.
    dying = LocalSparkSubmit(master="no-such-master://", conf={"spark.ui.enabled": "false"})
    text = assert_fails_unchanged(table, spark, SparkJobError, "ended without committing",
                                  "the table and its offsets are unchanged", "Retry the task", submitter=dying)
    assert "spark-submit exited with code" in text
