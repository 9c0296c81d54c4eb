"""DeltaKafkaAuditOperator: reconcile an airflow-eo table with Kafka, failing the task on drift.

Thin, like the ingest operator: the (templated) table, ingest id and selection, the same
``kafka`` and storage connections, then :func:`~airflow_eo.audit.run.run_audit`. The report is
the XCom. Drift (lost, duplicated or stray records, gaps, overlaps, a moved ``txn``) fails the
task with ``AirflowFailException`` (a retry would find the same) after logging each finding
with its offsets; an unreachable broker is retried. Emits StatsD metrics ``audit.lost``,
``audit.duplicated``, ``audit.stray``, ``audit.unverifiable`` (:mod:`airflow_eo.operators.metrics`'
naming) and an OpenLineage ``DataQualityAssertionsDatasetFacet`` on the table. An audit checking
``spark_threshold`` offsets or more reads them in Spark tasks on ``spark_conn_id`` (the ingest's
connection: its Spark Connect server, or a session of its master in this process), a smaller one
in the task itself.

Example::

    DeltaKafkaAuditOperator(task_id="audit", table_uri="/data/orders", ingest_id="orders_raw",
                            dead_letter_table_uri="/data/orders_dlq")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.providers.common.compat.sdk import AirflowFailException, BaseOperator

from airflow_eo.audit.findings import AuditReport, FindingKind
from airflow_eo.audit.run import AuditRequest, Selection, run_audit
from airflow_eo.core.errors import AirflowEoError
from airflow_eo.hooks.kafka import kafka_config_of
from airflow_eo.hooks.spark import audit_spark_for
from airflow_eo.hooks.storage import storage_options_of
from airflow_eo.operators.failures import raise_for_airflow
from airflow_eo.operators.task_end import released_at_end
from airflow_eo.spec import normalize_table_uri

METRICS = (FindingKind.LOST, FindingKind.DUPLICATED, FindingKind.STRAY, FindingKind.UNVERIFIABLE)


def emit_audit_metrics(report: AuditReport) -> None:
    """``airflow_eo.audit.<kind>`` (tagged) and ``airflow_eo.<ingest_id>.audit.<kind>``, as gauges:
    each audit states the current count, it does not add to the last one."""
    from airflow_eo.operators.metrics import PREFIX, _stats

    stats = _stats()
    tags = {"table": report.table_uri, "ingest_id": report.ingest_id}
    for kind in METRICS:
        stats.gauge(f"{PREFIX}.audit.{kind.value}", report.count(kind), tags=tags)
        stats.gauge(f"{PREFIX}.{report.ingest_id}.audit.{kind.value}", report.count(kind))


class DeltaKafkaAuditOperator(BaseOperator):
    """Audit the table at ``table_uri`` written by ingest ``ingest_id`` against Kafka.

    :param table_uri: the table (templated).
    :param ingest_id: the ingest that wrote it (templated; the ingest operator's default is ``<dag_id>.<task_id>``).
    :param batches: audit the newest N batches; ``since_version``: the batches committed at that
        table version or later; ``audit_all``: every batch. Default: the batches since the last
        recorded audit (a daily audit reads only the new ones).
    :param dead_letter_table_uri: the ingest's dead-letter table (templated).
    :param kafka_conn_id: the ``kafka`` connection of the ingest.
    :param storage_conn_id: the ``aws`` connection of the ingest, for object storage;
        ``storage_options`` override it.
    :param spark_conn_id: where a large audit's Spark tasks run: a ``spark_connect`` connection
        (its server), or a ``spark`` connection (a session of its master in this process, client
        mode); None, or a connection that does not exist: every slice in the task's process.
    :param spark_conf: extra Spark conf for that session.
    :param spark_threshold: offsets checked from which the audit uses Spark (default 2,000,000 on a
        Spark Connect server, 10,000,000 with a session of a master, which costs a JVM start).
    """

    template_fields: Sequence[str] = ("table_uri", "ingest_id", "dead_letter_table_uri", "batches", "since_version")
    ui_color = "#d9f5c9"

    def __init__(self, *, table_uri: str, ingest_id: str, batches: int | None = None, since_version: int | None = None,
                 audit_all: bool = False, dead_letter_table_uri: str | None = None,
                 kafka_conn_id: str = "kafka_default", storage_conn_id: str | None = None,
                 storage_options: dict[str, str] | None = None, spark_conn_id: str | None = "spark_default",
                 spark_conf: dict[str, str] | None = None, spark_threshold: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.table_uri, self.ingest_id, self.dead_letter_table_uri = table_uri, ingest_id, dead_letter_table_uri
        self.batches, self.since_version, self.audit_all = batches, since_version, audit_all
        self.kafka_conn_id, self.storage_conn_id, self.storage_options = kafka_conn_id, storage_conn_id, storage_options
        self.spark_conn_id, self.spark_conf, self.spark_threshold = spark_conn_id, spark_conf or {}, spark_threshold
        self.spark = None
        self.report: AuditReport | None = None

    def request(self) -> AuditRequest:
        if self.audit_all:
            selection, value = Selection.ALL, None
        elif self.batches not in (None, ""):
            selection, value = Selection.BATCHES, int(self.batches)  # type: ignore[arg-type]
        elif self.since_version not in (None, ""):
            selection, value = Selection.SINCE_VERSION, int(self.since_version)  # type: ignore[arg-type]
        else:
            selection, value = Selection.SINCE_LAST_AUDIT, None
        return AuditRequest(self.table_uri, self.ingest_id, kafka_config_of(self.kafka_conn_id),
                            storage_options_of(self.storage_conn_id, self.storage_options), selection, value,
                            self.dead_letter_table_uri or None, spark_threshold=None if self.spark_threshold in (None, "") else int(self.spark_threshold))

    def execute(self, context) -> dict:
        try:
            with released_at_end():  # before the listeners fork this process (see task_end)
                self.spark = audit_spark_for(self.spark_conn_id, {k: str(v) for k, v in self.spark_conf.items()})
                try:
                    self.report = report = run_audit(self.request(), spark=self.spark)
                finally:
                    if self.spark is not None:
                        self.spark.close()
        except AirflowEoError as exc:
            raise_for_airflow(self.log, exc)
        emit_audit_metrics(report)
        for line in report.lines():
            self.log.info("%s", line)
        if report.drift:
            for finding in report.findings:
                if finding.drift:
                    self.log.error("audit drift: %s", finding)
            raise AirflowFailException(f"{report.summary()} (see docs/audit.md for what each finding means)")
        return report.to_dict()

    def on_kill(self) -> None:
        if self.spark is not None:
            self.spark.kill()

    # -- OpenLineage: the table as input, with the audit's assertions (what execute recorded only)
    def get_openlineage_facets_on_complete(self, task_instance):
        from airflow_eo.operators.lineage import audit_lineage

        return audit_lineage(self.report, normalize_table_uri(self.table_uri))

    def get_openlineage_facets_on_failure(self, task_instance):
        return self.get_openlineage_facets_on_complete(task_instance)
