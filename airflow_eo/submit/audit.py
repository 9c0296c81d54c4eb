"""The audit's slices as Spark tasks: one task per slice, on a classic session or a Spark Connect one.

A large audit reads its coordinates where the ingest reads its records: ``mapInArrow`` over a
one-row-per-slice range DataFrame, each task running :func:`airflow_eo.audit.slices.run_slice`
with its own consumer and returning the slice's small result as one JSON row; the results are
merged in the auditing process. The Kafka client config and storage options travel inside the
pickled task function, never as a column or a Spark conf.

The session is opened on first use, so an audit small enough to run in process starts no JVM:

* ``remote="sc://…"``: the warm Spark Connect server the ingest uses (its shared session,
  :class:`airflow_eo.submit.connect.ConnectSubmitter`; the server must run the same airflow-eo);
* ``master="local[*]"`` (or ``spark://…``, ``yarn``: client mode): a classic session in this
  process, stopped by :meth:`SparkSlices.close`;
* ``spark=``: a session the caller holds (tests, a job that has one).

A warm session (Connect, or one given) is used from :data:`~airflow_eo.audit.SPARK_THRESHOLD_WARM`
offsets, one to start from :data:`~airflow_eo.audit.SPARK_THRESHOLD_COLD` (:attr:`SparkSlices.default_threshold`).

Example::

    >>> report = run_audit(request, spark=SparkSlices(remote="sc://127.0.0.1:15002"))   # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import uuid
from typing import Iterator, Sequence

from airflow_eo.attempt import Env, Secrets
from airflow_eo.audit import SPARK_THRESHOLD_COLD, SPARK_THRESHOLD_WARM
from airflow_eo.audit.findings import SliceResult
from airflow_eo.audit.slices import SliceTask
from airflow_eo.core.errors import AirflowEoError, ConfigError, SparkJobError, SparkUnavailableError, error_from_line, \
    error_line

log = logging.getLogger(__name__)

RESULT_SCHEMA = "result string"


def _slice_runner(tasks: Sequence[SliceTask], secrets: Secrets):
    """The function each Spark task runs (pickled to the Python workers): row ``i`` means "run slice ``i``"."""

    def run(batches):
        import pyarrow as pa

        from airflow_eo.audit.coordinates import KafkaCoordinates  # imported in the executor's Python worker
        from airflow_eo.audit.slices import run_slice

        with KafkaCoordinates(secrets.kafka_config) as kafka:
            for batch in batches:
                for i in batch.column(0).to_pylist():
                    result = run_slice(tasks[i], kafka, secrets.storage_options)
                    yield pa.RecordBatch.from_pydict({"result": [json.dumps(result.to_dict())]})

    return run


class SparkSlices:
    """Runs an audit's slices as Spark tasks (see the module doc)."""

    engine = "spark"

    def __init__(self, *, spark=None, master: str | None = None, remote: str | None = None,
                 conf: dict[str, str] | None = None):
        if sum(x is not None for x in (spark, master, remote)) != 1:
            raise ConfigError("the audit's Spark is one of: a session, a master (local[*], spark://…) or a Spark "
                              "Connect URL (sc://…)")
        self._spark, self.master, self.remote, self.conf = spark, master, remote, dict(conf or {})
        self._owned = False  # a classic session this object started (stopped by close)
        self._tag: str | None = None
        self._lock = threading.Lock()

    @property
    def default_threshold(self) -> int:
        """Warm (a Spark Connect server, a session given): worth it from 2M offsets; a session to
        start pays a JVM start first (see :mod:`airflow_eo.audit`)."""
        return SPARK_THRESHOLD_COLD if self.master is not None else SPARK_THRESHOLD_WARM

    @property
    def started(self) -> bool:
        """Whether a session is open (an audit below the threshold opens none)."""
        return self._spark is not None

    def session(self):
        if self._spark is not None:
            return self._spark
        if self.remote is not None:
            from airflow_eo.submit.connect import ConnectSubmitter, check_version, wait_until_ready

            self._spark = ConnectSubmitter(self.remote, conf=self.conf).session()
            check_version(self._spark, self.remote)  # the tasks import this airflow-eo on the server
            wait_until_ready(self._spark, self.remote)  # its slices are Spark tasks: not beside a warm-up
        else:
            from pyspark.sql import SparkSession

            from airflow_eo.driver.session import build_session, for_session

            with for_session(None):  # a classic session this process already runs is used, never stopped here
                running = SparkSession.getActiveSession()
            if str(self.master).startswith("local"):  # the local JVM and its Python workers
                os.environ.setdefault(Env.SPARK_LOCAL_IP, "127.0.0.1")
            python = os.environ.get(Env.PYSPARK_PYTHON, sys.executable)  # workers need airflow-eo
            self._spark = running or build_session("airflow-eo audit", {
                "spark.master": str(self.master), "spark.ui.enabled": "false", "spark.pyspark.python": python,
                **self.conf})
            self._owned = running is None
        return self._spark

    def run(self, tasks: Sequence[SliceTask], secrets: Secrets) -> Iterator[SliceResult]:
        if not tasks:
            return iter(())
        from airflow_eo.driver.session import for_session

        try:
            spark = self.session()
        except AirflowEoError:
            raise
        except Exception as exc:
            raise SparkUnavailableError(f"cannot start Spark for the audit ({error_line(exc)}): check the master "
                                        "or the Spark Connect server; nothing was changed") from exc
        tag = f"airflow-eo-audit-{uuid.uuid4().hex[:12]}"  # what kill() interrupts, on either kind of session
        with self._lock:
            self._tag = tag
        spark.addTag(tag)
        try:
            with for_session(spark):  # build the plan for this session's kind; run it outside
                frame = spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(_slice_runner(tasks, secrets),
                                                                              RESULT_SCHEMA)
            rows = frame.collect()
        except Exception as exc:
            raise self._typed(exc) from exc
        finally:
            with self._lock:
                self._tag = None
            spark.removeTag(tag)
        return iter([SliceResult.from_dict(json.loads(r["result"])) for r in rows])

    @staticmethod
    def _typed(exc: Exception) -> Exception:
        """Our error raised in a task (its line survives Spark's wrapping), else a retryable job error."""
        from airflow_eo.submit.connect import is_unavailable

        found = error_from_line(error_line(exc))
        if found is not None:
            return found
        if is_unavailable(exc):
            return SparkUnavailableError(f"the Spark Connect server went away during the audit ({error_line(exc)}); "
                                         "run it again when the server is back")
        return SparkJobError(f"the audit's Spark job failed: {error_line(exc)}")

    def kill(self) -> None:
        """Stop the running slices (``on_kill``, SIGTERM)."""
        with self._lock:
            spark, tag = self._spark, self._tag
        if spark is None or tag is None:
            return
        try:
            spark.interruptTag(tag)
        except Exception as exc:  # the session may be gone already: nothing left to stop
            log.warning("could not stop the audit's Spark tasks: %s", exc)

    def close(self) -> None:
        """Stop a classic session this object started (a Connect client stays for the next use)."""
        if self._owned and self._spark is not None:
            self._spark.stop()
            self._spark, self._owned = None, False
