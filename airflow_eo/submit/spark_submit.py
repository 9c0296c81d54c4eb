"""The spark-submit job: its script, arguments and environment, and a local submitter.

Every path that starts the job as its own process (:class:`LocalSparkSubmit` here, the
operator's :class:`airflow_eo.submit.spark_hook.SparkSubmitHookSubmitter`) passes the same
arguments (:func:`job_arguments`: the table and the attempt id, nothing secret) and the same
environment (:func:`job_environment`: the secrets), and reads a failure back the same way
(:func:`job_failure`).

Example::

    >>> LocalSparkSubmit(master="local[2]", conf={"spark.ui.enabled": "false"})  # doctest: +ELLIPSIS
    <airflow_eo.submit.spark_submit.LocalSparkSubmit object at ...>
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys

from airflow_eo.core import errors
from airflow_eo.attempt import SPARK_APP_DEFAULTS, Attempt, Env, Secrets
from airflow_eo.core.errors import SparkJobError
from airflow_eo.table.liveness import remove_scratch, scratch_dir

log = logging.getLogger(__name__)

JOB_MODULE = "spark_jobs.kafka_to_delta"


def job_script() -> str:
    """Path of the spark-submit entry script (found, not imported: it is a program)."""
    spec = importlib.util.find_spec(JOB_MODULE)
    if spec is None or not spec.origin:
        raise SparkJobError(f"{JOB_MODULE} is not installed beside airflow_eo: reinstall airflow-eo")
    return spec.origin


def job_arguments(attempt: Attempt) -> list[str]:
    return ["--table-uri", attempt.table_uri, "--attempt-id", attempt.attempt_id]


def job_environment(secrets: Secrets, python: bool = True) -> dict[str, str]:
    """Secrets for the driver, by environment: never on the command line. With ``python``,
    also this interpreter for the driver and workers (local and client mode)."""
    env = secrets.to_env()
    if python:
        env[Env.PYSPARK_PYTHON] = os.environ.get(Env.PYSPARK_PYTHON, sys.executable)
        env[Env.PYSPARK_DRIVER_PYTHON] = os.environ.get(Env.PYSPARK_DRIVER_PYTHON, sys.executable)
    return env


# The driver JVM of a batch job in local and client mode (in local mode also its executor): the
# C1 compiler only and the serial collector. A job lives seconds to minutes, and the C2 compiler
# spends its start-up compiling code the job has stopped running by then: measured, spark-submit
# of a session and one small job took 12.7 s of CPU with the defaults and 7.1 s with these (wall
# 30 s -> 11-16 s on a busy 2-core machine); spark-submit's launcher JVM, which only builds the
# command, 2.5 -> 1.25 s. A user's own JIT or collector options win.
BATCH_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def batch_jvm_options(given: str) -> list[str]:
    """:data:`BATCH_JVM_OPTIONS` but those ``given`` options already choose (a JIT or a collector).

    >>> batch_jvm_options("-XX:+UseG1GC -Xmx2g")
    ['-XX:TieredStopAtLevel=1']
    """
    return [o for o in BATCH_JVM_OPTIONS
            if not ("GC" in o and "GC" in given) and not ("Tiered" in o and ("Tiered" in given or "Xint" in given))]


def job_scratch(attempt: Attempt, conf: dict, env: dict) -> dict[str, str]:
    """Environment of a local or client-mode job: the launcher's and the driver JVM's options
    (:data:`BATCH_JVM_OPTIONS`), and the local driver's Spark scratch (``spark-*``,
    ``blockmgr-*``) in the attempt's own directory (:func:`airflow_eo.table.liveness.scratch_dir`),
    removed when the attempt ends or, after a SIGKILL, by the table's next run once the attempt is
    known dead. A ``spark.local.dir`` or ``SPARK_LOCAL_DIRS`` the user set wins."""
    given = env.get("SPARK_SUBMIT_OPTS", os.environ.get("SPARK_SUBMIT_OPTS"))
    options = [given, *batch_jvm_options(f"{given or ''} {conf.get('spark.driver.extraJavaOptions', '')}")]
    out = {}
    if "spark.local.dir" not in conf and "SPARK_LOCAL_DIRS" not in env:
        path = scratch_dir(attempt.attempt_id)
        os.makedirs(path, exist_ok=True)
        options.append(f"-Djava.io.tmpdir={path}")
        out = {"SPARK_LOCAL_DIRS": path, "TMPDIR": path}
    launcher = env.get("SPARK_LAUNCHER_OPTS", os.environ.get("SPARK_LAUNCHER_OPTS"))  # the JVM that builds the command
    return {**out, "SPARK_SUBMIT_OPTS": " ".join(filter(None, options)),
            "SPARK_LAUNCHER_OPTS": " ".join(filter(None, [launcher, *batch_jvm_options(launcher or "")]))}


def spark_submit_binary() -> str:
    found = shutil.which("spark-submit", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if not found:
        raise SparkJobError("spark-submit is not on PATH: install pyspark into this environment")
    return found


_JOB_ERROR = re.compile(r"airflow_eo\.core\.errors\.(\w+): (.*)")
_JOB_LINE = re.compile(r" INFO airflow_eo\.[\w.]+: (.*)")  # the driver's log format (driver/main.py)


def job_failure(code: int | None, output: list[str]) -> Exception:
    """The error a failed job reported (its own airflow-eo error if it raised one)."""
    for line in reversed(output):
        match = _JOB_ERROR.search(line)
        if match and isinstance(getattr(errors, match.group(1), None), type):
            return getattr(errors, match.group(1))(match.group(2))
    return SparkJobError(f"spark-submit exited with code {code}; last output:\n" + "\n".join(output[-15:]))


class LocalSparkSubmit:
    """Run ``spark-submit --master local[N]`` (or any master) as a child process and wait."""

    def __init__(self, master: str = "local[*]", conf: dict | None = None, extra_env: dict | None = None,
                 timeout: float | None = None):
        self.master = master
        self.conf = {**SPARK_APP_DEFAULTS, "spark.ui.enabled": "false", **(conf or {})}
        self.extra_env = extra_env or {}
        self.timeout = timeout
        self.process: subprocess.Popen | None = None
        self.launches = 0

    def command(self, attempt: Attempt) -> list[str]:
        cmd = [spark_submit_binary(), "--master", self.master]
        for key, value in self.conf.items():
            cmd += ["--conf", f"{key}={value}"]
        return cmd + [job_script(), *job_arguments(attempt)]

    def submit(self, attempt: Attempt, secrets: Secrets) -> None:
        env = {**os.environ, Env.SPARK_LOCAL_IP: os.environ.get(Env.SPARK_LOCAL_IP, "127.0.0.1"),
               **job_environment(secrets), **self.extra_env}
        env.update(job_scratch(attempt, self.conf, {**self.extra_env}))
        self.launches += 1
        try:
            self.process = subprocess.Popen(self.command(attempt), env=env,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            tail: list[str] = []
            for line in self.process.stdout:
                tail = (tail + [line.rstrip()])[-40:]
                ours = _JOB_LINE.search(line)
                if ours:  # the job's own lines (read, stage, commit timings) belong in this log too
                    log.info("spark job: %s", ours.group(1))
                else:
                    log.debug("spark: %s", line.rstrip())
            code = self.process.wait(self.timeout)
        finally:
            remove_scratch(attempt.attempt_id)
        if code != 0:
            raise job_failure(code, tail)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
