"""OpenLineage for an ingest run: the Kafka topics in, the Delta table out (a fan-out: each of its
tables), the offsets committed.

Used by :meth:`KafkaToDeltaOperator.get_openlineage_facets_on_complete` (and ``_on_failure``)
when apache-airflow-providers-openlineage is installed (``airflow-eo[openlineage]``).
Dataset names follow OpenLineage's naming spec through the client's own naming classes:
``kafka://<first bootstrap host>:<port>`` / topic, ``file`` / path for a local table,
``s3://<bucket>`` / key for an S3 table. The run carries an ``airflow_eo`` facet with the
batch, table version and the offset ranges the run committed.

Example::

    >>> source = LineageSource("/data/orders", "orders", ("orders",), "broker:9092")       # doctest: +SKIP
    >>> lineage = ingest_lineage(summary, source)                                            # doctest: +SKIP
    >>> [d.namespace for d in lineage.inputs]                                                  # doctest: +SKIP
    ['kafka://broker:9092']
"""

from __future__ import annotations

from typing import Protocol, Sequence
from urllib.parse import urlparse

import attr
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import (
    RunFacet, data_quality_assertions_dataset, output_statistics_output_dataset, schema_dataset,
)
from openlineage.client.naming.dataset import S3, Kafka, LocalFileSystem

from airflow_eo.core.outcomes import RunStatus
from airflow_eo.table.storage import is_local


class LineageSource(Protocol):
    """What lineage names (:class:`airflow_eo.operators.kafka_to_delta.LineageSource`, recorded by execute)."""

    table_uri: str
    ingest_id: str
    topics: tuple[str, ...]
    bootstrap_servers: str | None
    columns: tuple[tuple[str, str], ...]

PRODUCER = "https://github.com/airflow-eo/airflow-eo"


@attr.define
class AirflowEoBatchRunFacet(RunFacet):
    """What this run committed: batch, table version, status and offset ranges ``[start, end)``."""

    ingest_id: str
    status: str
    batch: int | None = None
    version: int | None = None
    ranges: list = attr.field(factory=list)  # [{"topic", "partition", "start", "end"}]
    merge: dict | None = None  # write_mode=merge: {"inserted", "updated", "deleted", "files_rewritten"}
    tables: list | None = None  # a fan-out: each table's {"table_uri", "ingest_id", "status", "batch", ...}

    @staticmethod
    def _get_schema() -> str:
        return f"{PRODUCER}/blob/main/README.md#openlineage"


def kafka_dataset(bootstrap_servers: str, topic: str) -> InputDataset:
    host, _, port = bootstrap_servers.split(",")[0].strip().rpartition(":")
    naming = Kafka(bootstrap_server_host=host or port, port=port if host else "9092", topic=topic)
    return InputDataset(namespace=naming.get_namespace(), name=naming.get_name())


def table_dataset(table_uri: str, columns: list[tuple[str, str]], summary: dict | None) -> OutputDataset:
    if is_local(table_uri):
        naming = LocalFileSystem(path=table_uri)
    else:
        url = urlparse(table_uri)
        naming = S3(bucket_name=url.netloc, object_key=url.path.lstrip("/"))
    facets: dict = {}
    if columns:
        facets["schema"] = schema_dataset.SchemaDatasetFacet(
            fields=[schema_dataset.SchemaDatasetFacetFields(name=n, type=t) for n, t in columns])
    output_facets: dict = {}
    if summary and RunStatus(summary["status"]).wrote_commit:
        output_facets["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
            rowCount=summary.get("rows"), size=summary.get("bytes"), fileCount=summary.get("files"))
    return OutputDataset(namespace=naming.get_namespace(), name=naming.get_name(), facets=facets,
                         outputFacets=output_facets)


def _batch(summary: dict) -> dict:
    """What the ``airflow_eo`` facet says of one table's batch."""
    # the run imported the sinks already (this reads what its run wrote): no import at DAG parse time
    from airflow_eo.sinks import recorded_sink

    return {"status": summary["status"], "batch": summary.get("batch"), "version": summary.get("version"),
            "ranges": list(summary.get("ranges") or []),
            "merge": recorded_sink(summary.get("write_mode") or "append").counts_facet(summary)}


def _inputs(bootstrap_servers: str | None, topics: Sequence[str]) -> list[InputDataset]:
    """The topics read (without bootstrap servers, Kafka's namespace is unknown: none)."""
    return [kafka_dataset(bootstrap_servers, t) for t in topics] if bootstrap_servers else []


def ingest_lineage(summary: dict | None, source: LineageSource) -> OperatorLineage:
    """Inputs, output and the batch facet of one run (``summary`` is None before the run ends or
    when it failed early)."""
    run_facets = {"airflow_eo": AirflowEoBatchRunFacet(ingest_id=source.ingest_id, **_batch(summary))} if summary else {}
    return OperatorLineage(inputs=_inputs(source.bootstrap_servers, source.topics),
                           outputs=[table_dataset(source.table_uri, list(source.columns), summary)],
                           run_facets=run_facets)


def run_lineage(summary: dict | None, tables: Sequence[LineageSource]) -> OperatorLineage:
    """A run's lineage: the single-table form's summary is its one table's (:func:`ingest_lineage`, as it
    always was); else each table's (:func:`fan_out_lineage`)."""
    if summary is not None and "tables" not in summary and len(tables) == 1:
        return ingest_lineage(summary, tables[0])
    return fan_out_lineage(summary, tables)


def fan_out_lineage(summary: dict | None, tables: Sequence[LineageSource]) -> OperatorLineage:
    """A fan-out's run: one input per topic it reads, one output per table (the run's tables, from
    ``summary``: each with its schema and counts; before the run, the ``tables`` known), and the
    ``airflow_eo`` facet listing each table's batch."""
    sources = {t.table_uri: t for t in tables}
    results = list((summary or {}).get("tables") or [])
    outputs = [table_dataset(r["table_uri"], list(getattr(sources.get(r["table_uri"]), "columns", ())), r)
               for r in results] or [table_dataset(t.table_uri, list(t.columns), None) for t in tables]
    bootstrap = next((t.bootstrap_servers for t in tables if t.bootstrap_servers), None)
    run_facets = {}
    if summary:
        run_facets["airflow_eo"] = AirflowEoBatchRunFacet(
            ingest_id=tables[0].ingest_id if tables else "", status=summary["status"],
            tables=[{"table_uri": r["table_uri"], "ingest_id": r["ingest_id"], **_batch(r)} for r in results])
    return OperatorLineage(inputs=_inputs(bootstrap, list(dict.fromkeys(t for s in tables for t in s.topics))),
                           outputs=outputs, run_facets=run_facets)


# The assertions an audit makes of a table: each finding kind that is drift, named for OpenLineage.
AUDIT_ASSERTIONS = (("no_lost_records", "lost"), ("no_duplicates", "duplicated"), ("no_stray_records", "stray"),
                    ("contiguous_ranges", "gap", "overlap"), ("txn_matches_last_range", "txn_mismatch"))


def audit_lineage(report, table_uri: str) -> OperatorLineage:
    """The audited table as input, with a ``dataQualityAssertions`` facet (one assertion per
    check of :class:`airflow_eo.audit.findings.AuditReport`; none before the audit ran)."""
    dataset = table_dataset(table_uri, [], None)
    input_facets: dict = {}
    if report is not None:
        counts = report.counts()
        input_facets["dataQualityAssertions"] = data_quality_assertions_dataset.DataQualityAssertionsDatasetFacet(
            assertions=[data_quality_assertions_dataset.Assertion(
                assertion=name, success=not any(counts[k] for k in kinds),
                actual=str(sum(counts[k] for k in kinds)), expected="0") for name, *kinds in AUDIT_ASSERTIONS])
    return OperatorLineage(inputs=[InputDataset(namespace=dataset.namespace, name=dataset.name,
                                                inputFacets=input_facets)], outputs=[])
