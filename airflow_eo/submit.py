"""Submitters: how an attempt's Spark job is started.

* :class:`LocalSparkSubmit` runs the installed ``spark-submit`` (used by the CLI and tests);
* :class:`InProcessSubmitter` runs the attempt in an existing SparkSession (the standalone
  Spark job, which plans and executes in one driver);
* the operator uses :class:`airflow_eo.hooks.spark.SparkJobSubmitter` (SparkSubmitHook).

All of them pass the same arguments (:func:`job_arguments`) and the same secret-carrying
environment (:func:`job_environment`), so every path runs the same job.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys

from airflow_eo import errors
from airflow_eo.errors import SparkJobError
from airflow_eo.job import KAFKA_CONFIG_ENV, SPARK_DEFAULTS, STORAGE_OPTIONS_ENV

log = logging.getLogger(__name__)


def job_script() -> str:
    import spark_jobs.kafka_to_delta as entry

    return entry.__file__


def job_arguments(config, attempt_id: str) -> list[str]:
    return ["--table-uri", config.table_uri, "--attempt-id", attempt_id]


def job_environment(config) -> dict[str, str]:
    """Secrets for the driver, by environment: never on the command line."""
    env = {
        KAFKA_CONFIG_ENV: json.dumps(config.kafka_config),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable),
    }
    if config.storage_options:
        env[STORAGE_OPTIONS_ENV] = json.dumps(config.storage_options)
    return env


def spark_submit_binary() -> str:
    found = shutil.which("spark-submit", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if not found:
        raise SparkJobError("spark-submit is not on PATH: install pyspark into this environment")
    return found


_JOB_ERROR = re.compile(r"airflow_eo\.errors\.(\w+): (.*)")


def job_failure(code: int | None, output: list[str]) -> Exception:
    """The error a failed job reported (its own airflow-eo error if it raised one)."""
    for line in reversed(output):
        match = _JOB_ERROR.search(line)
        if match and isinstance(getattr(errors, match.group(1), None), type):
            return getattr(errors, match.group(1))(match.group(2))
    return SparkJobError(f"spark-submit exited with code {code}; last output:\n" + "\n".join(output[-15:]))


class LocalSparkSubmit:
    """Run ``spark-submit --master local[N]`` as a child process and wait for it.

    >>> LocalSparkSubmit(master="local[2]", conf={"spark.ui.enabled": "false"})  # doctest: +ELLIPSIS
    <airflow_eo.submit.LocalSparkSubmit object at ...>
    """

    def __init__(self, master: str = "local[*]", conf: dict | None = None, extra_env: dict | None = None,
                 timeout: float | None = None):
        self.master = master
        self.conf = {**SPARK_DEFAULTS, "spark.ui.enabled": "false", **(conf or {})}
        self.extra_env = extra_env or {}
        self.timeout = timeout
        self.process: subprocess.Popen | None = None
        self.launches = 0

    def command(self, config, attempt_id: str) -> list[str]:
        cmd = [spark_submit_binary(), "--master", self.master]
        for key, value in self.conf.items():
            cmd += ["--conf", f"{key}={value}"]
        return cmd + [job_script(), *job_arguments(config, attempt_id)]

    def submit(self, config, attempt_id: str) -> None:
        env = {**os.environ, "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
               **job_environment(config), **self.extra_env}
        self.launches += 1
        self.process = subprocess.Popen(self.command(config, attempt_id), env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail: list[str] = []
        for line in self.process.stdout:
            tail = (tail + [line.rstrip()])[-40:]
            log.debug("spark: %s", line.rstrip())
        code = self.process.wait(self.timeout)
        if code != 0:
            raise job_failure(code, tail)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()


class InProcessSubmitter:
    """Run attempts in the SparkSession of the current driver."""

    def __init__(self, spark):
        self.spark = spark

    def submit(self, config, attempt_id: str) -> None:
        from airflow_eo.job import run_attempt

        run_attempt(self.spark, config.table_uri, attempt_id, config.kafka_config, config.storage_options)
