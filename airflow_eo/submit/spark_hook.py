"""Start an attempt's Spark job through Airflow's SparkSubmitHook (the operator's submitter).

Runs the very job ``airflow-eo ingest`` runs (same script, arguments and environment:
:mod:`airflow_eo.submit.spark_submit`), with the master, deploy mode, queue and binary
taken from the standard ``spark`` connection (``local[*]``, ``spark://host:7077``,
``yarn``, ``k8s://…``). Only the hook's public API is used.

Secrets (the Kafka client config, storage options) travel only as environment variables
(SparkSubmitHook ``env_vars``): in local and client mode they go into the spark-submit
process environment, which the hook never logs. On YARN and Kubernetes the hook turns
env vars into ``--conf spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*``
arguments, which it does log: their values are always registered with Airflow's secrets
masker and ``spark.redaction.regex`` is widened so Spark's UI redacts them too.

Example::

    >>> submitter = SparkSubmitHookSubmitter(conn_id="spark_default", conf={"spark.executor.memory": "2g"})
    >>> Ingestion(config, submitter).run(run)      # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from airflow_eo.attempt import SPARK_DEFAULTS, Attempt, Env, Secrets
from airflow_eo.submit.spark_submit import job_arguments, job_environment, job_script

log = logging.getLogger(__name__)

# Spark's default redaction regex plus our env var names.
REDACTION_REGEX = r"(?i)secret|password|token|access[.]?key|AIRFLOW_EO_"


def _default_hook_factory(**kwargs):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    return SparkSubmitHook(**kwargs)


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

    def build_hook(self, attempt: Attempt, secrets: Secrets):
        from airflow.sdk.log import mask_secret

        remote = runs_driver_in_cluster_manager(self.conn_id)
        env = {**self.env_vars, **job_environment(secrets, python=not remote)}
        for key in Env.SECRET:  # YARN/Kubernetes put env vars on the command line: mask them
            if key in env:
                mask_secret(env[key], key)
        conf = {"spark.redaction.regex": REDACTION_REGEX, **SPARK_DEFAULTS, **self.conf}
        return self.hook_factory(
            conn_id=self.conn_id, conf=conf, env_vars=env, name=f"{self.name} {attempt.plan.ingest_id}",
            application_args=job_arguments(attempt), **self.hook_kwargs,
        )

    def submit(self, attempt: Attempt, secrets: Secrets) -> None:
        """Start the job for a logged attempt and wait; raises if spark-submit fails."""
        self.hook = self.build_hook(attempt, secrets)
        self.submissions += 1
        self.hook.submit(job_script())

    def kill(self) -> None:
        """Stop the running job (``on_kill``): spark-submit, and the YARN app / driver pod."""
        if self.hook is not None:
            self.hook.on_kill()
