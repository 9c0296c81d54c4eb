"""Operator tests' fixtures: SparkSubmitHook replaced at its boundary by a stand-in that runs
the very job (``run_recorded_attempt``) in the session's SparkSession, and the connections.

The stand-in is a SparkSubmitHook (the provider's class, with its connection handling) whose
``submit`` runs the job in this process; the provider module's ``SparkSubmitHook`` is replaced
by it, which is where airflow-eo looks the hook up each time it submits."""

from __future__ import annotations

import json
import os
from datetime import datetime

import airflow.providers.apache.spark.hooks.spark_submit as spark_submit_hooks
import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_eo.attempt import Secrets
from airflow_eo.driver.main import run_recorded_attempt
from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator
from tests.airflow_context import context_for  # noqa: F401 - the operator tests' context

SECRET = "s3cr3t-value-never-logged"


class InProcessHook(SparkSubmitHook):
    """A SparkSubmitHook that runs the job in-process instead of spawning spark-submit."""

    made: list["InProcessHook"] = []
    spark = None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.kwargs = kwargs
        self.killed = False
        InProcessHook.made.append(self)

    def submit(self, application):
        assert application.endswith("kafka_to_delta.py")
        args = self.kwargs["application_args"]
        env = self.kwargs["env_vars"]
        shipped = [os.path.dirname(f) for f in (self.kwargs.get("files") or "").split(",") if f]  # --files
        run_recorded_attempt(self.spark, args[args.index("--table-uri") + 1], args[args.index("--attempt-id") + 1],
                             Secrets.from_env(env, search=tuple(shipped)))

    def on_kill(self):
        self.killed = True


@pytest.fixture
def hooks(spark, monkeypatch):
    InProcessHook.made = []
    InProcessHook.spark = spark
    monkeypatch.setattr(spark_submit_hooks, "SparkSubmitHook", InProcessHook)
    return InProcessHook.made


@pytest.fixture
def kafka_env(broker, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_UNIT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": broker.bootstrap_servers, "sasl.password": SECRET}}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    return "kafka_unit"


def make_operator(dag_id, table_uri, topic, conn_id, **kwargs):
    from airflow.providers.common.compat.sdk import DAG

    with DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1)):
        kwargs.setdefault("transform_sql", "SELECT topic, partition, offset, CAST(value AS STRING) AS body FROM source")
        return KafkaToDeltaOperator(task_id="ingest", topics=[topic], table_uri=table_uri, kafka_conn_id=conn_id,
                                    **kwargs)
