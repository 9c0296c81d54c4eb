"""The attempt's main: run a recorded attempt where the Spark driver runs.

Runs inside ``spark-submit`` (``spark_jobs/kafka_to_delta.py``) or, with :class:`InProcessSubmitter`,
in the calling process (a local SparkSession, or a Spark Connect session whose server does the
reading and writing). The plan was logged and the attempt recorded before it starts; this code
only executes it: its tables over one read (:mod:`airflow_eo.driver.tables`; a single table is one
of them), each table's batch (:mod:`airflow_eo.driver.batch`: decode, filter and transform, stage,
compare-and-set commit).

Secrets (Kafka client config, storage credentials) arrive as :class:`airflow_eo.attempt.Secrets`
(through environment variables under spark-submit), never as command-line arguments.

Example::

    >>> run_attempt(spark, attempt, Secrets({"bootstrap.servers": "127.0.0.1:9092"}))  # doctest: +SKIP
    CommitOutcome(status='committed', batch=3, version=7, rows=1000, ...)
"""

from __future__ import annotations

import argparse
import json
import logging
import os

from airflow_eo.attempt import Attempt, Secrets
from airflow_eo.driver.batch import features_of
from airflow_eo.driver.tables import attempts_of, needs_spark, run_tables
from airflow_eo.driver.session import build_session, classic_process
from airflow_eo.core.errors import ConfigError
from airflow_eo.spec import add_arguments, options_from_args
from airflow_eo.table.commit import CommitOutcome
from airflow_eo.table.staging import StagingArea
from airflow_eo.table.storage import TableLocation

log = logging.getLogger(__name__)

RESULT_PREFIX = "AIRFLOW_EO_RESULT "


def run_attempt(spark, attempt: Attempt, secrets: Secrets) -> CommitOutcome:
    """Execute a recorded attempt: one read of its tables' ranges, then each table's decode, transform,
    stage and compare-and-set commit (:mod:`airflow_eo.driver.tables`).

    A failure is also recorded in each attempt's marker as one typed line, so a caller that
    only sees an exit code (spark-submit) re-raises the same error (:mod:`airflow_eo.core.errors`)."""
    return run_tables(spark, attempt, secrets)


def run_recorded_attempt(spark, table_uri: str, attempt_id: str, secrets: Secrets) -> CommitOutcome:
    """Run the attempt recorded beside the table under ``attempt_id`` (what spark-submit runs)."""
    attempt = StagingArea(TableLocation.of(table_uri, secrets.storage_options)).read_attempt(attempt_id)
    return run_attempt(spark, attempt, secrets)


class InProcessSubmitter:
    """Runs attempts in a SparkSession of this process: a local one (tests, the standalone
    job) or a Spark Connect session (the warm path)."""

    def __init__(self, spark):
        self.spark = spark

    def submit(self, attempt: Attempt, secrets: Secrets) -> None:
        run_attempt(self.spark, attempt, secrets)


def _read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def job_parser() -> argparse.ArgumentParser:
    """The job's flags: a recorded attempt's id, or (standalone) the spec's options."""
    parser = argparse.ArgumentParser(prog="kafka_to_delta.py", description=__doc__.splitlines()[0])
    parser.add_argument("--table-uri", required=True)
    parser.add_argument("--attempt-id", help="execute an attempt logged by airflow-eo ingest / the operator")
    parser.add_argument("--run-key", default="", help="standalone: stable key that makes reruns replay")
    # standalone (no --attempt-id): every option of `airflow-eo ingest`, derived from the same spec
    add_arguments(parser, skip=("table_uri",), require=False)
    return parser


def main(argv: list[str]) -> int:
    """``spark_jobs/kafka_to_delta.py``: run a recorded attempt, or plan and run one batch."""
    parser = job_parser()
    args = parser.parse_args(argv)
    # our lines at INFO; py4j and other libraries only from WARN, like Spark itself
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_eo").setLevel(logging.INFO)
    if not args.attempt_id and not (args.ingest_id and args.topics):
        parser.error("give --attempt-id, or --ingest-id and --topics for a standalone run")
    classic_process()  # a Spark Connect client that started this job left its mark in the environment
    job = _JobSession()
    try:
        secrets = job.secrets()
        if args.attempt_id:
            attempt = StagingArea(TableLocation.of(args.table_uri, secrets.storage_options)).read_attempt(args.attempt_id)
            # a batch the driver reads itself needs no SparkContext: its start and stop are most of a small job
            attempts = [a for a, _ in attempts_of(attempt, secrets.storage_options)]
            spark = job.session() if needs_spark(attempts, lambda a: features_of(a, secrets.storage_options)) else None
            outcome = run_attempt(spark, attempt, secrets)
            print(RESULT_PREFIX + json.dumps(outcome.__dict__), flush=True)
            return 0
        # Standalone: this driver plans too, running the same loop as `airflow-eo ingest`.
        from airflow_eo.loop.ingest import Ingestion
        from airflow_eo.loop.config import IngestConfig
        from airflow_eo.core.offsets import RunIdentity

        config = IngestConfig(credentials=secrets, **options_from_args(args, _read_text))  # with --table-uri
        result = Ingestion(config, InProcessSubmitter(job.session())).run(RunIdentity(run_key=args.run_key))
        print(RESULT_PREFIX + json.dumps(result.to_dict()), flush=True)
        return 0
    finally:
        job.stop()


class _JobSession:
    """The spark-submit job's SparkSession, started only when the job needs it."""

    def __init__(self):
        self._spark = None

    def session(self):
        if self._spark is None:
            self._spark = build_session("airflow-eo kafka_to_delta")
        return self._spark

    def secrets(self) -> Secrets:
        """The job's secrets: from its environment, or the secrets file in its working directory or,
        where Spark put ``--files`` elsewhere (Kubernetes), in SparkFiles' directory (which needs the session)."""
        try:
            return Secrets.from_env(search=(os.getcwd(),))
        except ConfigError:
            from pyspark import SparkFiles

            self.session()
            return Secrets.from_env(search=(os.getcwd(), SparkFiles.getRootDirectory()))

    def stop(self) -> None:
        if self._spark is not None:
            self._spark.stop()
