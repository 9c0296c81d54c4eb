"""Start an attempt's Spark job through Airflow's SparkSubmitHook.

Implements the :class:`airflow_eo.ingest.Submitter` protocol, so the operator runs the
very job that ``airflow-eo ingest`` runs (same script, arguments and environment), with
the master, deploy mode, queue and binary taken from the standard ``spark`` connection
(``local[*]``, ``spark://host:7077``, ``yarn``, ``k8s://…``).

Secrets (the Kafka client config, storage options) travel only as environment variables
(SparkSubmitHook ``env_vars``): in local and client mode they go into the spark-submit
process environment, which the hook never logs. On YARN and Kubernetes the hook turns
env vars into ``--conf spark.yarn.appMasterEnv.*`` / ``spark.kubernetes.driverEnv.*``
arguments, which it does log; for those masters the values are registered with Airflow's
secrets masker and ``spark.redaction.regex`` is widened so Spark's UI redacts them too.

Example::

    >>> submitter = SparkJobSubmitter(conn_id="spark_default", conf={"spark.executor.memory": "2g"})
    >>> Ingestion(config, submitter).run(run)      # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from airflow_eo.job import KAFKA_CONFIG_ENV, SPARK_DEFAULTS, STORAGE_OPTIONS_ENV
from airflow_eo.submit import job_arguments, job_environment, job_script

log = logging.getLogger(__name__)

SECRET_ENV = (KAFKA_CONFIG_ENV, STORAGE_OPTIONS_ENV)
# Spark's default redaction regex plus our env var names.
REDACTION_REGEX = r"(?i)secret|password|token|access[.]?key|AIRFLOW_EO_"


def _default_hook_factory(**kwargs):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    return SparkSubmitHook(**kwargs)


class SparkJobSubmitter:
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

    def build_hook(self, config, attempt_id: str):
        secret_env = job_environment(config)
        env = {**self.env_vars, **secret_env}
        conf = {**SPARK_DEFAULTS, **self.conf}
        hook = self.hook_factory(
            conn_id=self.conn_id, conf=conf, env_vars=env, name=f"{self.name} {config.ingest_id}",
            application_args=job_arguments(config, attempt_id), **self.hook_kwargs,
        )
        master = str(getattr(hook, "_connection", {}).get("master", ""))
        if "yarn" in master or master.startswith("k8s"):
            # These masters put env vars on the command line: mask and redact them.
            from airflow.sdk.log import mask_secret

            for key in SECRET_ENV:
                if key in env:
                    mask_secret(env[key], key)
            hook._conf = {"spark.redaction.regex": REDACTION_REGEX, **conf}
            for key in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):  # the worker's path means nothing there
                if key not in self.env_vars:
                    env.pop(key, None)
        return hook

    def submit(self, config, attempt_id: str) -> None:
        """Start the job for a logged attempt and wait; raises if spark-submit fails."""
        self.hook = self.build_hook(config, attempt_id)
        self.submissions += 1
        self.hook.submit(job_script())

    def kill(self) -> None:
        """Stop the running job (``on_kill``): spark-submit, and the YARN app / driver pod."""
        if self.hook is not None:
            self.hook.on_kill()
