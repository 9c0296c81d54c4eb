"""Spark Connect: run each attempt on a long-lived (warm) Spark server, from this process.

The attempt's driver logic (:func:`airflow_eo.driver.main.run_attempt`) runs here, in the
Airflow worker or the CLI, as a Spark Connect client: the server reads the planned ranges
and writes the staged Parquet; the compare-and-set Delta commit happens here, as it does in
a spark-submit driver. A batch then costs seconds instead of a JVM start.

Every attempt gets a Spark Connect session of its own, tagged with the attempt id and
released when the attempt ends, so nothing (temp views, cached data, registered sources)
is left on the server between runs; :meth:`ConnectSubmitter.kill` interrupts the attempt's
operations on the server (``interruptTag``), so a killed task stops using the cluster.
A server on another airflow-eo version than the client is refused before anything runs.

Example::

    >>> Ingestion(config, ConnectSubmitter("sc://127.0.0.1:15002")).run(run)   # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading

from airflow_eo import __version__
from airflow_eo.attempt import Attempt, Secrets
from airflow_eo.driver.main import run_attempt
from airflow_eo.errors import ConfigError, SparkUnavailableError

log = logging.getLogger(__name__)

TAG_PREFIX = "airflow-eo-"
RETRIES = 4  # ~3 s of backoff before "the server went away" is reported
VERSION_CONF = "spark.airflow_eo.version"  # set by `airflow-eo connect-server`
_verified: set[str] = set()  # servers whose airflow-eo version matched, per process


def server_version(spark) -> str:
    """The airflow-eo version of the server's Python workers (the ones that read Kafka)."""
    declared = spark.conf.get(VERSION_CONF, None)
    if declared:
        return declared
    from pyspark.sql.functions import udf

    def installed(_):
        import airflow_eo

        return airflow_eo.__version__

    return spark.range(1).select(udf(installed, "string")("id").alias("v")).first()["v"]


def check_version(spark, url: str) -> None:
    if url in _verified:
        return
    theirs = server_version(spark)
    if theirs != __version__:
        raise ConfigError(f"the Spark Connect server at {redact_url(url)} runs airflow-eo {theirs}, this client "
                          f"runs {__version__}: install the same airflow-eo version on both")
    _verified.add(url)


def redact_url(url: str) -> str:
    """An ``sc://`` URL without its parameters (they may hold a token)."""
    return url.split(";", 1)[0].split("/;", 1)[0]


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the server cannot be reached (retryable), not that the job failed."""
    text = f"{exc.__class__.__name__} {exc}"
    return any(s in text for s in ("UNAVAILABLE", "Connection refused", "failed to connect", "Socket closed",
                                   "DEADLINE_EXCEEDED", "RetriesExceeded", "SESSION_CLOSED",
                                   "INVALID_HANDLE.SESSION_NOT_FOUND"))


class ConnectSubmitter:
    """Runs attempts on the Spark Connect server at ``url`` (``sc://host:port[/;token=…]``)."""

    def __init__(self, url: str, conf: dict | None = None):
        if not url.startswith("sc://"):
            raise ConfigError(f"{redact_url(url)!r} is not a Spark Connect URL: use sc://host:port")
        self.url = url
        self.conf = dict(conf or {})
        self._lock = threading.Lock()
        self._session = None
        self._tag: str | None = None
        self.submissions = 0

    def session(self):
        """A new session of its own, which gives up within seconds when the server is gone."""
        from pyspark.sql import SparkSession
        from pyspark.sql.connect.client.retries import DefaultPolicy

        from airflow_eo.attempt import SPARK_DEFAULTS

        spark = SparkSession.builder.remote(self.url).create()
        # pyspark's default retries for up to 10 minutes; a task retry is the better place
        # to wait for a server that went away, so fail within a few seconds instead.
        spark.client.set_retry_policies([DefaultPolicy(max_retries=RETRIES, initial_backoff=200,
                                                       backoff_multiplier=2.0, max_backoff=2000)])
        for key, value in {**SPARK_DEFAULTS, **self.conf}.items():
            spark.conf.set(key, value)
        return spark

    def submit(self, attempt: Attempt, secrets: Secrets) -> None:
        tag = TAG_PREFIX + attempt.attempt_id
        try:
            spark = self.session()
        except Exception as exc:
            raise SparkUnavailableError(f"cannot open a session on the Spark Connect server {redact_url(self.url)} "
                                        f"({exc.__class__.__name__}); is it running? Retry when it is") from exc
        with self._lock:
            self._session, self._tag = spark, tag
        self.submissions += 1
        try:
            check_version(spark, self.url)
            spark.addTag(tag)
            run_attempt(spark, attempt, secrets)
        except Exception as exc:
            if is_unavailable(exc):
                raise SparkUnavailableError(
                    f"the Spark Connect server {redact_url(self.url)} went away during batch {attempt.plan.batch} "
                    f"({exc.__class__.__name__}); nothing was committed by this attempt unless the table says so. "
                    "Retry when the server is back: the retry replays the same offsets") from exc
            raise
        finally:
            with self._lock:
                self._session = self._tag = None
            spark.stop()  # releases the server-side session: views, caches, registered sources

    def kill(self) -> None:
        """Interrupt the running attempt's operations on the server (``on_kill``, SIGTERM)."""
        with self._lock:
            spark, tag = self._session, self._tag
        if spark is not None and tag is not None:
            try:
                interrupted = spark.interruptTag(tag)
                log.info("interrupted %d Spark operation(s) of %s", len(interrupted), tag)
            except Exception as exc:  # the server may be gone already: nothing left to stop
                log.warning("could not interrupt %s on the Spark Connect server: %s", tag, exc)
