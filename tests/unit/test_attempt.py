"""The attempt value: what crosses from the caller to the Spark driver, typed and secret-free."""

from __future__ import annotations

import json

import pytest

from airflow_eo.attempt import Attempt, AttemptKind, Env, Secrets
from airflow_eo.spec import DeadLetterSpec, DecodeSpec, SparkSettings, Transform, IngestSpec
from airflow_eo.core.errors import ConfigError
from airflow_eo.loop.config import IngestConfig
from airflow_eo.core.planning import BatchPlan
from airflow_eo.core.offsets import OffsetRange, RunIdentity, TopicPartition

PLAN = BatchPlan("orders", 3, (OffsetRange("o", 0, 10, 20), OffsetRange("o", 1, 5, 5)), RunIdentity("dag/run/t/-1"),
                 new_partitions=(TopicPartition("o", 1),), planned_at="2026-11-24T00:00:00+00:00",
                 attempt_id="3f2a9c0d1e6b4a52")


def spec(**options) -> IngestSpec:
    return IngestSpec.of(**{"table_uri": "/data/orders", "ingest_id": "orders", "topics": "o", **options})


def test_round_trip_keeps_every_field():
    attempt = Attempt(plan=PLAN, kind=AttemptKind.REPROCESS, reprocess_from=2,
                      spec=spec(transform_sql="SELECT * FROM source", value_schema="id INT", max_value_bytes=64,
                                dead_letter_table_uri="/data/dlq", max_dead_letters=5, max_dead_letter_fraction=0.5,
                                schema_evolution=True).replace(spark=SparkSettings(1000)),
                      requested_by=RunIdentity("dag/other/t/-1", dag_id="dag", try_number=2))
    assert Attempt.from_json(attempt.to_json()) == attempt
    assert json.loads(attempt.to_json())["kind"] == "reprocess"


def test_an_ingest_config_builds_the_attempt_without_its_secrets():
    config = IngestConfig(table_uri="/data/orders", ingest_id="orders", topics=["o"],
                          kafka_config={"bootstrap.servers": "b:9092", "sasl.password": "s3cr3t"},
                          storage_options={"AWS_SECRET_ACCESS_KEY": "k3y"}, max_offsets_per_task=500)
    attempt = config.attempt(PLAN)
    assert attempt.spark.max_offsets_per_task == 500 and attempt.kind is AttemptKind.INGEST
    assert "s3cr3t" not in attempt.to_json() and "k3y" not in attempt.to_json()
    secrets = config.secrets()
    assert "s3cr3t" not in repr(secrets)
    env = secrets.to_env()
    assert set(env) == {Env.KAFKA_CONFIG, Env.STORAGE_OPTIONS}
    assert Secrets.from_env(env) == secrets


@pytest.mark.parametrize("build, message", [
    (lambda: Attempt(plan=PLAN.with_attempt(""), spec=spec()), "attempt id"),
    (lambda: spec().replace(decode=DecodeSpec("id INT")), "dead_letter_table_uri"),
    (lambda: Attempt(plan=PLAN, spec=spec(), kind=AttemptKind.REPROCESS), "reprocess counter"),
    (lambda: DecodeSpec(value_format="xml"), "not supported"),
    (lambda: DeadLetterSpec(max_fraction=2), "between 0 and 1"),
    (lambda: SparkSettings(0), "positive"),
    (lambda: Transform(sql="SELECT 1", callable="m:f"), "not both"),
])
def test_bad_settings_fail_before_spark(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


# An attempt record as the previous version wrote it into a marker beside the table (before the
# spec): sub-specs at the top level, the table's settings loose beside them. Markers of running
# or crashed attempts on existing tables are read back by this version.
OLD_ATTEMPT = {
    "plan": json.loads(PLAN.to_json()), "table_uri": "/data/orders", "kind": "ingest",
    "transform": {"sql": "SELECT * FROM source", "callable": None},
    "decode": {"value_schema": "id INT", "value_format": "json", "max_value_bytes": 64, "avro_schema": None,
               "value_subject": None, "value_schema_version": "latest", "key_format": "raw", "key_schema": None,
               "key_avro_schema": None, "key_subject": None},
    "dead_letters": {"table_uri": "/data/dlq", "max_count": 5, "max_fraction": None},
    "dedup": {"key": "headers['id']", "horizon": "2 batches", "to_dead_letters": True},
    "spark": {"max_offsets_per_task": 1000}, "schema_evolution": True,
    "table_properties": {"delta.checkpointInterval": "50"}, "partition_by": ["date"],
    "reprocess_from": None, "requested_by": None,
}


def test_an_attempt_the_previous_version_recorded_is_read_with_every_setting():
    attempt = Attempt.from_json(json.dumps(OLD_ATTEMPT))
    assert attempt.plan == PLAN and attempt.kind is AttemptKind.INGEST
    assert (attempt.table_uri, attempt.spec.ingest_id, attempt.spec.topics) == ("/data/orders", "orders", ("o",))
    assert attempt.transform == Transform(sql="SELECT * FROM source")
    assert attempt.decode == DecodeSpec("id INT", max_value_bytes=64)
    assert attempt.dead_letters == DeadLetterSpec("/data/dlq", max_count=5)
    assert (attempt.dedup.key, attempt.dedup.horizon_batches(), attempt.dedup.to_dead_letters) == ("headers['id']", 2, True)
    assert attempt.spark.max_offsets_per_task == 1000 and attempt.schema_evolution
    assert attempt.table_properties == {"delta.checkpointInterval": "50"} and attempt.partition_by == ("date",)
    assert Attempt.from_json(attempt.to_json()) == attempt  # and written anew in the spec's shape
    assert "spec" in json.loads(attempt.to_json())


def test_an_old_reprocess_attempt_keeps_its_counter_and_requester():
    raw = {**OLD_ATTEMPT, "kind": "reprocess", "reprocess_from": 1,
           "requested_by": {"run_key": "d/r/t/-1", "dag_id": "d", "run_id": "r", "task_id": "t", "try_number": 3}}
    attempt = Attempt.from_json(json.dumps(raw))
    assert attempt.kind is AttemptKind.REPROCESS and attempt.reprocess_from == 1
    assert attempt.requested_by == RunIdentity("d/r/t/-1", dag_id="d", run_id="r", task_id="t", try_number=3)
