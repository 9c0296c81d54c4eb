"""What the Spark provider's SparkSubmitHook is asked to run, read from its command line
(a recording spark-submit: tests/unit/submit/conftest.py)."""

from __future__ import annotations

import json
import os

import pytest

from airflow_eo.attempt import Env, Secrets
from airflow_eo.core.planning import BatchPlan
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.submit.spark_hook import REDACTION_REGEX, SparkSubmitHookSubmitter
from tests.conftest import build_config

SECRET = "s3cr3t-value-never-on-a-command-line"


def attempt_and_secrets():
    config = build_config("/tmp/orders", "orders", {"bootstrap.servers": "b:9092", "sasl.password": SECRET},
                          ingest_id="orders_raw")
    return config.attempt(BatchPlan("orders_raw", 1, (), RunIdentity("r"), attempt_id="3f2a9c0d1e6b4a52")), \
        config.secrets()


@pytest.mark.parametrize("deploy_mode", ["cluster", "client"])
def test_no_secret_on_the_command_line_of_a_cluster_manager(deploy_mode, spark_submit, monkeypatch):
    """YARN (Kubernetes goes the same way; its hook needs the cncf.kubernetes provider): the
    secrets travel in a private file shipped with --files (env vars would become --conf
    arguments there), never in argv; the file is gone once the job ended."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CM", json.dumps({"conn_type": "spark", "host": "yarn",
                                                           "extra": {"deploy-mode": deploy_mode}}))
    attempt, secrets = attempt_and_secrets()
    SparkSubmitHookSubmitter(conn_id="spark_cm").submit(attempt, secrets)
    [call] = spark_submit.calls()
    assert SECRET not in " ".join(call.argv)
    assert call.value_of("--master") == "yarn" and call.value_of("--deploy-mode") == deploy_mode
    [(path, (content, mode))] = call.shipped.items()
    assert call.value_of("--files") == path and mode == 0o600 and not os.path.exists(path)
    assert json.loads(json.loads(content)[Env.KAFKA_CONFIG])["sasl.password"] == SECRET  # what the driver reads
    assert call.conf[f"spark.yarn.appMasterEnv.{Env.SECRETS_FILE}"] == os.path.basename(path)
    found = Secrets.from_env({Env.SECRETS_FILE: "shipped-" + os.path.basename(path)}, search=(str(spark_submit.folder),))
    assert found.kafka_config["sasl.password"] == SECRET
    assert call.conf["spark.redaction.regex"] == REDACTION_REGEX and call.conf["spark.log.level"] == "WARN"
    assert call.value_of("--attempt-id") == attempt.attempt_id and Env.KAFKA_CONFIG not in call.env


def test_local_mode_passes_secrets_in_the_process_environment_only(spark_submit, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    attempt, secrets = attempt_and_secrets()
    SparkSubmitHookSubmitter(conn_id="spark_local", conf={"spark.executor.memory": "2g"}).submit(attempt, secrets)
    [call] = spark_submit.calls()
    assert SECRET not in " ".join(call.argv) and call.shipped == {} and call.value_of("--files") is None
    assert call.value_of("--master") == "local[2]" and call.conf["spark.executor.memory"] == "2g"
    assert call.value_of("--table-uri") == "/tmp/orders" and call.value_of("--attempt-id") == attempt.attempt_id
    assert json.loads(call.env[Env.KAFKA_CONFIG])["sasl.password"] == SECRET
