"""Tables on S3 (a local moto_server): credentials from an aws connection's fields, safe
commits enforced, one ingestion end to end through spark-submit, racing commits."""

from __future__ import annotations

import json
import threading

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from airflow_eo.sinks.append import BatchCommit
from airflow_eo.table.commit import ALREADY_COMMITTED, COMMITTED, StagedBatch, commit
from airflow_eo.core.errors import CommitConflictError, ConfigError
from airflow_eo.loop.ingest import Ingestion
from airflow_eo.loop.config import IngestConfig
from airflow_eo.driver.reader import read_range
from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.table.staging import StagingArea, attempt_dir_name, new_attempt_id
from airflow_eo.hooks.storage import storage_options_from_connection
from airflow_eo.table.storage import TableLocation, check_commit_safety
from airflow_eo.submit.spark_submit import LocalSparkSubmit
from tests.helpers import broker_records, duplicates, keys_of, new_topic, produce


def options_of(s3) -> dict:
    return storage_options_from_connection(*s3.connection_fields())


def read_s3_table(uri: str, options: dict) -> pa.Table:
    files = DeltaTable(uri, storage_options=options).file_uris()
    fs = TableLocation.of(uri, options).fs
    return pads.dataset([f.split("://", 1)[1] for f in files], format="parquet", filesystem=fs).to_table()


@pytest.mark.parametrize("options, reason", [
    ({}, "conditional_put is None"),
    ({"conditional_put": "disabled"}, "conditional_put is 'disabled'"),
    ({"AWS_S3_LOCKING_PROVIDER": "dynamodb", "DELTA_DYNAMO_TABLE_NAME": "delta_log"}, "ignored by deltalake 1.x"),
    ({"conditional_put": "etag", "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}, "opts out of safe concurrent commits"),
])
def test_unsafe_s3_configs_are_refused_before_anything_runs(options, reason):
    with pytest.raises(ConfigError, match="refusing to commit") as err:
        check_commit_safety("s3://bucket/table", options)
    assert reason in str(err.value)
    config = IngestConfig(table_uri="s3://bucket/table", ingest_id="unsafe", topics=["t"],
                          kafka_config={"bootstrap.servers": "127.0.0.1:1"}, storage_options=options)
    with pytest.raises(ConfigError, match="conditional_put"):
        Ingestion(config, submitter=None)


def test_aws_connection_fields_map_to_deltalake_options():
    options = storage_options_from_connection(
        "AKIDEXAMPLE", "secret", {"endpoint_url": "http://minio:9000", "region_name": "eu-west-1",
                                  "conditional_put": "etag", "storage_options": {"AWS_S3_ADDRESSING_STYLE": "path"}})
    assert options == {
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_ENDPOINT_URL": "http://minio:9000", "AWS_REGION": "eu-west-1", "AWS_ALLOW_HTTP": "true",
        "conditional_put": "etag", "AWS_S3_ADDRESSING_STYLE": "path",
    }
    check_commit_safety("s3://bucket/t", options)


def test_ingestion_into_s3_through_spark_submit(s3, kafka_config, monkeypatch):
    topic = new_topic(kafka_config, partitions=3)
    produce(kafka_config, topic, 240)
    uri = f"s3://{s3.bucket}/e2e-{topic}"
    options = options_of(s3)
    # Credentials come from Airflow connections, as a DAG author sets them: never from code.
    login, password, extra = s3.connection_fields()
    monkeypatch.setenv("AIRFLOW_CONN_S3_EO", json.dumps(
        {"conn_type": "aws", "login": login, "password": password, "extra": extra}))
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_EO", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_config["bootstrap.servers"]}}))
    operator = KafkaToDeltaOperator(task_id="to_s3", topics=[topic], table_uri=uri, ingest_id="to_s3",
                                    kafka_conn_id="kafka_eo", storage_conn_id="s3_eo")
    config = operator.ingest_config()
    assert config.storage_options == options
    ingestion = Ingestion(config, LocalSparkSubmit(master="local[2]", timeout=180))

    result = ingestion.run(RunIdentity("s3-1"))
    again = ingestion.run(RunIdentity("s3-1"))  # a retry of the same run: no Spark, no rows

    assert result.status == COMMITTED and result.rows == 240
    assert again.status == ALREADY_COMMITTED and not again.spark_started
    rows = read_s3_table(uri, options)
    assert not duplicates(rows)
    assert set(keys_of(rows)) == set(broker_records(kafka_config["bootstrap.servers"], topic))
    # staged by the executors' pyarrow writer (Spark here cannot write s3a://)
    added = DeltaTable(uri, storage_options=options).file_uris()
    assert added and all("/part-" in f and f.startswith(f"{uri}/b00000001-") for f in added)
    # the secret never reaches the commit metadata of the table
    assert password not in json.dumps(DeltaTable(uri, storage_options=options).history(), default=str)


def stage_from_kafka(location: TableLocation, plan, kafka_config: dict):
    """Stage a plan's records the way an executor would: Arrow batches → Parquet on S3."""
    target = location.join(attempt_dir_name(plan))
    batches = [b for r in plan.data_ranges for b in read_range(kafka_config, r)]
    schema = batches[0].schema
    with location.fs.open_output_stream(f"{target}/part-00000-test.parquet") as out:
        pq.write_table(pa.Table.from_batches(batches, schema), out)
    staging = StagingArea(location)
    files = staging.staged_files(target)
    return files, staging.rows_per_partition(files), schema


def race(commits) -> list:
    """Run the commits at the same moment; return each one's outcome or exception."""
    barrier = threading.Barrier(len(commits))
    results: list = [None] * len(commits)

    def go(i, fn):
        barrier.wait()
        try:
            results[i] = fn()
        except Exception as exc:  # the outcome under test
            results[i] = exc

    threads = [threading.Thread(target=go, args=(i, fn)) for i, fn in enumerate(commits)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def test_the_tables_lease_is_taken_by_one_run_on_s3(s3):
    """The lease is a Delta log of its own: on S3 its versions are conditional puts, so of four runs
    taking a free lease at once exactly one holds it; released, the next takes it."""
    from airflow_eo.table.lease import Claim, HeldLease, LeaseHolder, LeasePurpose, TableLease

    options = options_of(s3)
    lease = TableLease(TableLocation.of(f"s3://{s3.bucket}/lease-{new_attempt_id()}", options), options)
    taken = race([lambda i=i: lease.try_take(Claim(LeasePurpose.INGEST, f"run-{i}", "race")) for i in range(4)])
    held = [t for t in taken if isinstance(t, HeldLease)]
    assert len(held) == 1 and all(isinstance(t, LeaseHolder) for t in taken if t not in held), taken
    assert lease.holder().token == held[0].holder.token
    held[0].attempt("0123456789abcdef")
    assert lease.holder().attempt_id == "0123456789abcdef"
    held[0].release()
    assert lease.holder() is None
    nxt = lease.try_take(Claim(LeasePurpose.MAINTAIN, "run-9", "race"))
    assert isinstance(nxt, HeldLease)
    nxt.release()


def test_racing_commits_on_s3_land_once(s3, kafka_config):
    topic = new_topic(kafka_config, partitions=3)
    produce(kafka_config, topic, 150)
    uri = f"s3://{s3.bucket}/race-{topic}"
    options = options_of(s3)

    def planned(max_records: int, run_key: str):
        config = IngestConfig(table_uri=uri, ingest_id="race", topics=[topic], kafka_config=kafka_config,
                              storage_options=options, max_records_per_run=max_records)
        ingestion = Ingestion(config, submitter=None)
        plan = ingestion.plan(RunIdentity(run_key)).with_attempt(new_attempt_id())
        return plan, stage_from_kafka(ingestion.location, plan, kafka_config)

    def committer(plan, staged):
        files, rows, schema = staged
        return lambda: commit(BatchCommit(StagedBatch(plan, tuple(files), rows, schema)), uri, options)

    first = planned(30, "batch-1")
    assert committer(*first)().status == COMMITTED

    # Same starts, different ends (two runs planned at different moments): one lands,
    # the other must not, and says why.
    a, b = planned(30, "run-a"), planned(60, "run-b")
    outcomes = race([committer(*a), committer(*b)])
    committed = [o for o in outcomes if getattr(o, "status", None) == COMMITTED]
    conflicts = [o for o in outcomes if isinstance(o, CommitConflictError)]
    assert len(committed) == 1 and len(conflicts) == 1, outcomes
    assert "Nothing was committed" in str(conflicts[0]) or "nothing of this batch" in str(conflicts[0])

    # The very same range twice (a retry racing its first attempt): one commit, the
    # other finds it already there; never two.
    c, d = planned(30, "run-c"), planned(30, "run-c")
    outcomes = race([committer(*c), committer(*d)])
    statuses = sorted(getattr(o, "status", repr(o)) for o in outcomes)
    assert statuses == [ALREADY_COMMITTED, COMMITTED], outcomes
    winner = next(o for o in outcomes if o.status == COMMITTED)

    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 2  # create + one winner of each race
    rows = read_s3_table(uri, options)
    assert not duplicates(rows)
    assert rows.num_rows == 30 + committed[0].rows + winner.rows
    # every partition holds exactly its offsets [0, committed offset)
    from airflow_eo.table.app_ids import partition_app_id
    from airflow_eo.core.offsets import TopicPartition

    keys = keys_of(rows)
    for p in range(3):
        upto = table.transaction_version(partition_app_id("race", TopicPartition(topic, p)))
        assert sorted(o for t, q, o in keys if q == p) == list(range(upto))
