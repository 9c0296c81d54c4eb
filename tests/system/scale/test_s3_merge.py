"""A merge (write_mode="merge") into an s3:// table (a local moto_server): the table's files are read
and rewritten inside Spark tasks through the table's storage options, no Hadoop S3 jar needed."""

from __future__ import annotations

from airflow_eo.driver.main import InProcessSubmitter
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.loop.config import IngestConfig
from airflow_eo.core.offsets import RunIdentity
from tests.changes import SQL, ChangeProducer, assert_model_holds
from tests.helpers import new_topic
from tests.system.scale.test_s3 import options_of


def merging(spark, kafka_config: dict, uri: str, topic: str, options: dict, ingest_id: str, sql: str = SQL,
            **extra) -> tuple[Ingestion, ChangeProducer]:
    """An in-process merge ingest by ``id`` into the s3:// table ``uri``, and a producer of its changes."""
    config = IngestConfig(table_uri=uri, ingest_id=ingest_id, topics=[topic], kafka_config=kafka_config,
                          storage_options=options, write_mode="merge", merge_key="id", transform_sql=sql, **extra)
    return Ingestion(config, InProcessSubmitter(spark)), ChangeProducer(kafka_config, topic)


def test_a_merge_into_s3_rewrites_the_files_that_held_its_keys(s3, kafka_config, spark):
    bootstrap = kafka_config["bootstrap.servers"]
    topic = new_topic(kafka_config, 3)
    options = options_of(s3)
    uri = f"s3://{s3.bucket}/merge-{topic}"
    ingestion, changes = merging(spark, kafka_config, uri, topic, options, "s3_merge")
    changes.write(range(500))
    changes.flush()
    assert ingestion.run(RunIdentity("s1")).inserted == 500
    changes.write(range(0, 500, 4))
    changes.delete(range(1, 500, 10))
    changes.flush()
    second = ingestion.run(RunIdentity("s2"))
    assert second.status == "committed" and second.files_rewritten > 0
    assert (second.updated, second.deleted) == (125, 50)
    assert assert_model_holds(uri, "s3_merge", bootstrap, topic, options) == 450


def test_a_column_mapped_s3_table_with_lists_and_maps_in_a_struct_takes_merges(s3, kafka_config, spark, tmp_path):
    """A table created with column mapping (id mode: physical names col-…, every nested field mapped) on
    S3, adopted by a merge ingest whose rows hold a struct of a list and a map: the executors' pyarrow
    writer (Spark writes no s3://) gives every field its physical name and id, the rewrites in Spark tasks
    keep them; DuckDB, reading a copy of the table, and deltalake on S3 read every key once."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    from airflow_eo.table.storage import TableLocation
    from tests.delta_tables import create_mapped_table, duckdb_rows

    bootstrap = kafka_config["bootstrap.servers"]
    topic = new_topic(kafka_config, 3)
    options = options_of(s3)
    uri = f"s3://{s3.bucket}/mapped-{topic}"
    meta = pa.struct([("tags", pa.list_(pa.string())), ("attrs", pa.map_(pa.string(), pa.string()))])
    local = str(tmp_path / "created")
    create_mapped_table(local, pa.schema([("id", pa.string()), ("v", pa.int64()), ("topic", pa.string()),
                                          ("partition", pa.int32()), ("offset", pa.int64()), ("meta", meta)]), "id")
    remote = TableLocation.of(uri, options)
    pafs.copy_files(local, remote.root, destination_filesystem=remote.fs)
    sql = SQL.replace(" FROM source", ", named_struct('tags', array(CAST(key AS STRING)), 'attrs', "
                      "map('v', CAST(value AS STRING))) AS meta FROM source")
    ingestion, changes = merging(spark, kafka_config, uri, topic, options, "s3_mapped", sql, adopt_table=True)
    changes.write(range(60))
    changes.flush()
    assert ingestion.run(RunIdentity("m1")).inserted == 60
    changes.write(range(0, 60, 3))
    changes.delete([1, 2])
    changes.flush()
    second = ingestion.run(RunIdentity("m2"))
    assert (second.status, second.updated, second.deleted) == ("committed", 20, 2) and second.files_rewritten > 0
    assert assert_model_holds(uri, "s3_mapped", bootstrap, topic, options) == 58
    copy = str(tmp_path / "copy")
    pafs.copy_files(remote.root, copy, source_filesystem=remote.fs)
    got = duckdb_rows(copy, "SELECT id, meta.tags, meta.attrs['v'] IS NOT NULL FROM t ORDER BY CAST(id AS INT)")
    assert got == [(str(i), [str(i)], True) for i in range(60) if i not in (1, 2)]
