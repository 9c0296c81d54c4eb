"""What a spark-submit child gets (arguments, environment) and what its failure becomes, without starting one."""

from __future__ import annotations

import json
import sys

from airflow_eo.attempt import Env, Secrets
from airflow_eo.core.errors import DataLossError, SparkJobError
from airflow_eo.core.planning import BatchPlan
from airflow_eo.core.offsets import RunIdentity
from airflow_eo.submit.spark_submit import LocalSparkSubmit, job_arguments, job_environment, job_failure, job_script
from tests.conftest import build_config

SECRETS = Secrets({"bootstrap.servers": "b:9092", "sasl.password": "s3cr3t"}, {"AWS_SECRET_ACCESS_KEY": "k3y"})


def attempt():
    plan = BatchPlan("orders_raw", 2, (), RunIdentity("r"), attempt_id="3f2a9c0d1e6b4a52")
    return build_config("/data/orders", "orders", {}, ingest_id="orders_raw").attempt(plan)


def test_the_job_is_told_the_table_and_attempt_and_nothing_secret():
    args = job_arguments(attempt())
    assert args == ["--table-uri", "/data/orders", "--attempt-id", "3f2a9c0d1e6b4a52"]
    command = LocalSparkSubmit("local[2]", conf={"spark.executor.memory": "1g"}).command(attempt())
    assert command[1:3] == ["--master", "local[2]"] and "spark.executor.memory=1g" in command
    assert command[-5:] == [job_script(), *args] and job_script().endswith("kafka_to_delta.py")
    assert "s3cr3t" not in " ".join(command)


def test_secrets_and_the_interpreter_travel_in_the_environment(monkeypatch):
    monkeypatch.delenv(Env.PYSPARK_PYTHON, raising=False)
    monkeypatch.delenv(Env.PYSPARK_DRIVER_PYTHON, raising=False)
    env = job_environment(SECRETS)
    assert json.loads(env[Env.KAFKA_CONFIG])["sasl.password"] == "s3cr3t"
    assert json.loads(env[Env.STORAGE_OPTIONS]) == {"AWS_SECRET_ACCESS_KEY": "k3y"}
    assert env[Env.PYSPARK_PYTHON] == env[Env.PYSPARK_DRIVER_PYTHON] == sys.executable
    assert Env.PYSPARK_PYTHON not in job_environment(SECRETS, python=False)
    assert Secrets.from_env(env) == SECRETS and "s3cr3t" not in repr(SECRETS)


def test_a_failed_job_raises_its_own_error_or_a_retryable_spark_error():
    error = job_failure(1, ["Traceback (most recent call last):",
                            "airflow_eo.core.errors.DataLossError: offsets 0..9 of orders[0] were deleted by retention",
                            "log4j: shutting down"])
    assert type(error) is DataLossError and str(error) == "offsets 0..9 of orders[0] were deleted by retention"
    other = job_failure(137, [f"line {i}" for i in range(30)])
    assert type(other) is SparkJobError and other.retryable and "exited with code 137" in str(other)
    assert "line 29" in str(other) and "line 14" not in str(other)  # the last 15 lines
    assert type(job_failure(1, ["airflow_eo.core.errors.NoSuchError: x"])) is SparkJobError


def test_a_batch_jobs_driver_jvm_compiles_with_c1_and_collects_serially_unless_the_user_chose(monkeypatch):
    from airflow_eo.submit import spark_submit

    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    monkeypatch.delenv("SPARK_LAUNCHER_OPTS", raising=False)
    monkeypatch.setattr(spark_submit, "scratch_dir", lambda attempt_id: f"/tmp/scratch-{attempt_id}")
    monkeypatch.setattr(spark_submit.os, "makedirs", lambda *a, **k: None)
    env = spark_submit.job_scratch(attempt(), {}, {})
    assert env["SPARK_SUBMIT_OPTS"].split() == ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                                                "-Djava.io.tmpdir=/tmp/scratch-3f2a9c0d1e6b4a52"]
    assert env["SPARK_LOCAL_DIRS"] == env["TMPDIR"] == "/tmp/scratch-3f2a9c0d1e6b4a52"
    assert env["SPARK_LAUNCHER_OPTS"] == "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    # the user's collector, JIT setting or scratch stay theirs
    chosen = spark_submit.job_scratch(attempt(), {"spark.driver.extraJavaOptions": "-XX:+UseG1GC",
                                                  "spark.local.dir": "/big"}, {"SPARK_SUBMIT_OPTS": "-Xint"})
    assert chosen["SPARK_SUBMIT_OPTS"] == "-Xint" and "SPARK_LOCAL_DIRS" not in chosen
