"""A merge (write_mode="merge") into an s3:// table (a local moto_server): the table's files are read
and rewritten inside Spark tasks through the table's storage options, no Hadoop S3 jar needed."""

from __future__ import annotations

from airflow_eo.driver.main import InProcessSubmitter
from airflow_eo.ingest import IngestConfig, Ingestion
from airflow_eo.planning import RunIdentity
from tests.changes import SQL, ChangeProducer, assert_model_holds
from tests.helpers import new_topic
from tests.system.scale.test_s3 import options_of


def test_a_merge_into_s3_rewrites_the_files_that_held_its_keys(s3, kafka_config, spark):
    bootstrap = kafka_config["bootstrap.servers"]
    topic = new_topic(kafka_config, 3)
    options = options_of(s3)
    uri = f"s3://{s3.bucket}/merge-{topic}"
    config = IngestConfig(table_uri=uri, ingest_id="s3_merge", topics=[topic], kafka_config=kafka_config,
                          storage_options=options, write_mode="merge", merge_key="id", transform_sql=SQL)
    ingestion = Ingestion(config, InProcessSubmitter(spark))
    changes = ChangeProducer(kafka_config, topic)
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
