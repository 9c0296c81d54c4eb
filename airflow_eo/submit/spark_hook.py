"""Start an attempt's Spark job through Airflow's SparkSubmitHook (the operator's submitter).

Runs the very job ``airflow-eo ingest`` runs (same script, arguments and environment:
:mod:`airflow_eo.submit.spark_submit`), with the master, deploy mode, queue and binary
taken from the standard ``spark`` connection (``local[*]``, ``spark://host:7077``,
``yarn``, ``k8s://…``). Only the hook's public API is used.

Secrets (the Kafka client config, storage options) never travel on a command line. In local
and client mode they go into the spark-submit process environment (SparkSubmitHook
``env_vars``), which the hook never logs. On YARN and Kubernetes the hook would turn env
vars into ``--conf spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*`` arguments,
so there they go into a private temporary file shipped with ``--files`` (YARN: the driver's
working directory; Kubernetes: needs ``spark.kubernetes.file.upload.path``), named by the
non-secret :attr:`Env.SECRETS_FILE`; ``spark.redaction.regex`` is widened so Spark's UI
redacts our variables too.

Example::

    >>> submitter = SparkSubmitHookSubmitter(conn_id="spark_default", conf={"spark.executor.memory": "2g"})
    >>> Ingestion(config, submitter).run(run)      # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any, Callable

from airflow_eo.attempt import SPARK_APP_DEFAULTS, Attempt, Env, Secrets
from airflow_eo.submit.spark_submit import job_arguments, job_environment, job_script, job_scratch
from airflow_eo.table.liveness import remove_scratch

log = logging.getLogger(__name__)

# Spark's default redaction regex plus our env var names.
REDACTION_REGEX = r"(?i)secret|password|token|access[.]?key|AIRFLOW_EO_"


def _default_hook_factory(**kwargs):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    return SparkSubmitHook(**kwargs)


def write_secrets_file(secrets: Secrets) -> str:
    """The secrets as a private (0600) temporary file, removed once the job ends."""
    fd, path = tempfile.mkstemp(prefix="airflow-eo-secrets-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(secrets.to_env(), f)
    return path


def runs_driver_in_cluster_manager(conn_id: str) -> bool:
    """Whether the ``spark`` connection names YARN or Kubernetes, where the driver's
    environment is set through Spark conf and this machine's Python path means nothing."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    try:
        conn = SparkSubmitHook.get_connection(conn_id)
    except Exception:  # no such connection: SparkSubmitHook then defaults to yarn
        return True
    master = f"{conn.conn_type or ''} {conn.host or ''}".lower()
    return "yarn" in master or "k8s" in master


class SparkSubmitHookSubmitter:
    """Runs ``spark_jobs/kafka_to_delta.py --attempt-id …`` with SparkSubmitHook and waits."""

    def __init__(
        self,
        conn_id: str = "spark_default",
        conf: dict[str, Any] | None = None,
        env_vars: dict[str, str] | None = None,
        name: str = "airflow-eo",
        hook_kwargs: dict[str, Any] | None = None,
        hook_factory: Callable[..., Any] = _default_hook_factory,
    ):
        self.conn_id = conn_id
        self.conf = dict(conf or {})
        self.env_vars = dict(env_vars or {})
        self.name = name
        self.hook_kwargs = dict(hook_kwargs or {})
        self.hook_factory = hook_factory
        self.hook = None
        self.submissions = 0
        self.secrets_file: str | None = None

    def build_hook(self, attempt: Attempt, secrets: Secrets):
        remote = runs_driver_in_cluster_manager(self.conn_id)
        hook_kwargs = dict(self.hook_kwargs)
        if remote:
            # SparkSubmitHook turns env vars into --conf arguments on YARN and Kubernetes: the
            # secrets go in a file shipped with --files instead, never on a command line
            self.secrets_file = write_secrets_file(secrets)
            env = {**self.env_vars, Env.SECRETS_FILE: os.path.basename(self.secrets_file)}
            hook_kwargs["files"] = ",".join(f for f in (hook_kwargs.get("files"), self.secrets_file) if f)
        conf = {"spark.redaction.regex": REDACTION_REGEX, **SPARK_APP_DEFAULTS, **self.conf}
        if not remote:  # local and client mode: the spark-submit process environment, never logged
            env = {**self.env_vars, **job_environment(secrets)}
            env.update(job_scratch(attempt, conf, self.env_vars))
        return self.hook_factory(
            conn_id=self.conn_id, conf=conf, env_vars=env, name=f"{self.name} {attempt.plan.ingest_id}",
            application_args=job_arguments(attempt), **hook_kwargs,
        )

    def submit(self, attempt: Attempt, secrets: Secrets) -> None:
        """Start the job for a logged attempt and wait; raises if spark-submit fails."""
        self.hook = self.build_hook(attempt, secrets)
        self.submissions += 1
        try:
            self.hook.submit(job_script())
        finally:
            remove_scratch(attempt.attempt_id)
            if self.secrets_file:
                os.unlink(self.secrets_file)
                self.secrets_file = None

    def kill(self) -> None:
        """Stop the running job (``on_kill``): spark-submit, and the YARN app / driver pod."""
        if self.hook is not None:
            self.hook.on_kill()
