"""OpenLineage for an ingest run: the Kafka topics in, the Delta table out, the offsets committed.

Used by :meth:`KafkaToDeltaOperator.get_openlineage_facets_on_complete` (and ``_on_failure``)
when apache-airflow-providers-openlineage is installed (``airflow-eo[openlineage]``).
Dataset names follow OpenLineage's naming spec through the client's own naming classes:
``kafka://<first bootstrap host>:<port>`` / topic, ``file`` / path for a local table,
``s3://<bucket>`` / key for an S3 table. The run carries an ``airflow_eo`` facet with the
batch, table version and the offset ranges the run committed.

Example::

    >>> lineage = ingest_lineage(summary, "broker:9092", ["orders"], "/data/orders", columns)  # doctest: +SKIP
    >>> [d.namespace for d in lineage.inputs]                                                  # doctest: +SKIP
    ['kafka://broker:9092']
"""

from __future__ import annotations

from urllib.parse import urlparse

import attr
from airflow.providers.openlineage.extractors import OperatorLineage
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import RunFacet, output_statistics_output_dataset, schema_dataset
from openlineage.client.naming.dataset import S3, Kafka, LocalFileSystem

from airflow_eo.outcomes import RunStatus
from airflow_eo.table.storage import is_local

PRODUCER = "https://github.com/airflow-eo/airflow-eo"


@attr.define
class AirflowEoBatchRunFacet(RunFacet):
    """What this run committed: batch, table version, status and offset ranges ``[start, end)``."""

    ingest_id: str
    status: str
    batch: int | None = None
    version: int | None = None
    ranges: list = attr.field(factory=list)  # [{"topic", "partition", "start", "end"}]

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


def ingest_lineage(summary: dict | None, bootstrap_servers: str, topics: list[str], table_uri: str,
                   columns: list[tuple[str, str]], ingest_id: str) -> OperatorLineage:
    """Inputs, output and the batch facet of one run (``summary`` is None when it failed early)."""
    run_facets = {}
    if summary:
        run_facets["airflow_eo"] = AirflowEoBatchRunFacet(
            ingest_id=ingest_id, status=summary["status"], batch=summary.get("batch"),
            version=summary.get("version"), ranges=list(summary.get("ranges") or []))
    return OperatorLineage(inputs=[kafka_dataset(bootstrap_servers, t) for t in topics],
                           outputs=[table_dataset(table_uri, columns, summary)], run_facets=run_facets)
