"""The attempt value: what crosses from the caller to the Spark driver, typed and secret-free."""

from __future__ import annotations

import json

import pytest

from airflow_eo.attempt import (
    Attempt, AttemptKind, DeadLetterSpec, DecodeSpec, Env, Secrets, SparkSettings, Transform,
)
from airflow_eo.errors import ConfigError
from airflow_eo.ingest import IngestConfig
from airflow_eo.planning import BatchPlan, OffsetRange, RunIdentity, TopicPartition

PLAN = BatchPlan("orders", 3, (OffsetRange("o", 0, 10, 20), OffsetRange("o", 1, 5, 5)), RunIdentity("dag/run/t/-1"),
                 new_partitions=(TopicPartition("o", 1),), planned_at="2026-11-24T00:00:00+00:00",
                 attempt_id="3f2a9c0d1e6b4a52")


def test_round_trip_keeps_every_field():
    attempt = Attempt(plan=PLAN, table_uri="/data/orders", kind=AttemptKind.REPROCESS,
                      transform=Transform(sql="SELECT * FROM source"),
                      decode=DecodeSpec("id INT", max_value_bytes=64),
                      dead_letters=DeadLetterSpec("/data/dlq", max_count=5, max_fraction=0.5),
                      spark=SparkSettings(1000), schema_evolution=True, reprocess_from=2,
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
    (lambda: Attempt(plan=PLAN.with_attempt(""), table_uri="/t"), "attempt id"),
    (lambda: Attempt(plan=PLAN, table_uri="/t", decode=DecodeSpec("id INT")), "dead_letter_table_uri"),
    (lambda: Attempt(plan=PLAN, table_uri="/t", kind=AttemptKind.REPROCESS), "reprocess counter"),
    (lambda: DecodeSpec(value_format="xml"), "not supported"),
    (lambda: DeadLetterSpec(max_fraction=2), "between 0 and 1"),
    (lambda: SparkSettings(0), "positive"),
    (lambda: Transform(sql="SELECT 1", callable="m:f"), "not both"),
])
def test_bad_settings_fail_before_spark(build, message):
    with pytest.raises(ConfigError, match=message):
        build()
