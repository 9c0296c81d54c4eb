"""KafkaToDeltaOperator: one exactly-once batch from Kafka topics into a Delta table.

The operator is thin: it builds an :class:`~airflow_eo.ingest.IngestConfig` from its
(templated) arguments and the ``kafka`` / ``spark`` connections, runs
:class:`~airflow_eo.ingest.Ingestion` with a :class:`~airflow_eo.submit.spark_hook.SparkSubmitHookSubmitter`
and returns the run's summary (XCom), which is also the extra of the table's Asset event
and what the "Delta batch" extra link shows.

Run semantics (see README "Reruns, clears and backfills"): the run key is
``<dag_id>/<run_id>/<task_id>/<map_index>``, stable across retries and clears and never
derived from the try number or logical date (manual runs have none). A retry or clear
replays the run's logged plan, or reports its committed batch without starting Spark.
With ``reprocess`` (operator argument or DAG param ``reprocess``) the run's batch (or the
one of ``reprocess_run_id``) is re-read and its rows are replaced in one commit.

Concurrency is per table, not per DAG: a run waits (``table_wait_timeout``) while another
attempt on its table is running, so mapped ingests of different tables run in parallel and
runs of one table take turns; a run that still races loses at the compare-and-set commit
with a (retryable) conflict and plans anew on retry.

Errors: what a retry cannot fix (configuration, data loss, a recreated topic, an
incompatible table, nothing to reprocess) fails with ``AirflowFailException``; an
unreachable broker or Spark server, a commit conflict or a failed Spark job is retried.

Example::

    KafkaToDeltaOperator(
        task_id="ingest", topics=["orders"], table_uri="/data/orders",
        kafka_conn_id="kafka_default", spark_conn_id="spark_default",
        transform_sql="SELECT topic, partition, offset, CAST(value AS STRING) AS body FROM source",
        max_records_per_run=1_000_000,
    )
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

from airflow.sdk import Asset, AssetAlias, BaseOperator, BaseOperatorLink

from airflow_eo.attempt import Transform
from airflow_eo.errors import AirflowEoError, ConfigError
from airflow_eo.hooks.kafka import kafka_config_of
from airflow_eo.hooks.schema_registry import schema_registry_config_of
from airflow_eo.hooks.spark import submitter_for
from airflow_eo.hooks.storage import storage_options_of
from airflow_eo.ingest import IngestConfig, Ingestion
from airflow_eo.operators.failures import raise_for_airflow
from airflow_eo.operators.metrics import emit_run_metrics
from airflow_eo.intervals import interval_of
from airflow_eo.planning import Interval, RunIdentity
from airflow_eo.table.storage import is_local, normalize_table_uri


CHANGED_TABLE = ("committed", "reprocessed")  # the result kinds that wrote a commit of their own


def run_key_of(dag_id: str, run_id: str, task_id: str, map_index: int | None) -> str:
    """The stable key of one task of one DAG run: the same for all its retries and clears."""
    return f"{dag_id}/{run_id}/{task_id}/{-1 if map_index is None else map_index}"


def table_asset(table_uri: str) -> Asset:
    """The Asset a table's events are emitted on (``file://`` URI for local tables)."""
    uri = normalize_table_uri(table_uri)
    return Asset(uri=f"file://{uri}" if is_local(uri) else uri)


def table_columns(table_uri: str, storage_options: dict | None) -> list[tuple[str, str]]:
    """(name, type) of the table's columns, for lineage; empty before the first commit."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        schema = DeltaTable(table_uri, storage_options=storage_options).schema()
    except TableNotFoundError:
        return []
    return [(f.name, str(f.type.type) if hasattr(f.type, "type") else type(f.type).__name__) for f in schema.fields]


def summary_link(summary: dict | None) -> str:
    """A link to the table, with the batch, version and ranges of a run in its fragment."""
    if not summary:
        return ""
    uri = summary["table_uri"]
    base = f"file://{uri}" if is_local(uri) else uri
    ranges = ",".join(f"{r['topic']}[{r['partition']}]:{r['start']}-{r['end']}" for r in summary.get("ranges", []))
    query = {"status": summary.get("status"), "batch": summary.get("batch"), "version": summary.get("version"),
             "rows": summary.get("rows"), "ranges": ranges}
    return f"{base}#{urlencode({k: v for k, v in query.items() if v is not None})}"


class DeltaBatchLink(BaseOperatorLink):
    """Extra link "Delta batch": the table, the version this run produced and its offsets."""

    name = "Delta batch"

    def get_link(self, operator, *, ti_key) -> str:
        # Airflow 3 computes links in the task process as it finishes: the operator still holds
        # its summary (None after a failed try: no link, and no XCom lookup that logs an error)
        return summary_link(getattr(operator, "summary", None))


class KafkaToDeltaOperator(BaseOperator):
    """Ingest the next batch of ``topics`` into the Delta table at ``table_uri``, exactly once.

    :param topics: Kafka topics (templated).
    :param table_uri: the Delta table, a local path or ``s3://…`` (templated).
    :param ingest_id: stable id of this ingest in the table's log (default ``<dag_id>.<task_id>``).
    :param kafka_conn_id: a ``kafka`` connection (apache-airflow-providers-apache-kafka's type).
    :param spark_conn_id: a ``spark`` connection (spark-submit through SparkSubmitHook: ``local[*]``,
        ``spark://…``, ``yarn``, ``k8s://…``) or a ``spark_connect`` connection (each batch runs on
        that warm Spark Connect server; URL, token and TLS from SparkConnectHook).
    :param starting_offsets: where partitions never read start: ``earliest``, ``latest``,
        ``{"timestamp": ms}`` or ``{"topic": {"0": 42}}`` (templated).
    :param max_records_per_run: cap on offsets per run, split fairly over partitions.
    :param transform_sql: Spark SQL over the view ``source`` (templated); or
    :param transform: ``"package.module:function"`` taking and returning a DataFrame.
    :param on_data_loss: ``fail`` (default) or ``skip`` offsets deleted by retention.
    :param spark_conf: extra Spark conf (templated).
    :param spark_env_vars: extra, non-secret environment variables for the job (templated).
    :param reprocess: replace this run's rows (or those of ``reprocess_run_id``); default: the
        DAG param ``reprocess``.
    :param reprocess_run_id: run id (of ``reprocess_dag_id``, default this DAG) to reprocess;
        default: the DAG param ``reprocess_run_id``, else this run.
    :param storage_conn_id: an ``aws`` connection whose credentials and extras (``endpoint_url``,
        ``region_name``, ``conditional_put``…) become the deltalake storage options of an
        ``s3://`` table (see README "Running at scale"); merged under ``storage_options``.
    :param storage_options: non-secret deltalake storage options set in code.
    :param value_schema: Spark DDL of the JSON value, e.g. ``"id INT, name STRING"``: the value
        is decoded into column ``data`` and undecodable records become dead letters.
    :param value_format: ``json`` (with ``value_schema``), ``avro`` or ``raw``.
    :param key_format: ``raw`` (default), ``json`` (with ``key_schema``) or ``avro``: the key is
        decoded into column ``key_data``.
    :param schema_registry_conn_id: connection of a Confluent-compatible Schema Registry (Avro in
        the Confluent wire format); see :mod:`airflow_eo.hooks.schema_registry`.
    :param avro_schema: inline Avro schema (JSON) of plain Avro values, instead of a registry;
        ``key_avro_schema`` the same for keys.
    :param value_subject: registry subject of the reader schema (default ``<first topic>-value``),
        at ``value_schema_version`` (``latest`` or a number); ``key_subject`` for keys.
    :param max_value_bytes: values larger than this are dead letters.
    :param dead_letter_table_uri: the Delta table undecodable records go to (templated).
    :param max_dead_letters: fail the run (committing nothing) above this many dead letters;
    :param max_dead_letter_fraction: or above this fraction of the batch.
    :param schema_evolution: add new columns of the transform's output to the table.
    :param table_properties: Delta table properties of the table the first batch creates (e.g.
        ``{"delta.checkpointInterval": "50"}``); an existing table keeps its own.
    :param partition_by: partition columns of the table the first batch creates, produced by the
        transform (e.g. ``["date"]`` with ``to_date(timestamp) AS date``); an existing table must
        be partitioned by the same columns.
    :param mode: ``"offsets"`` (default: everything new since the last commit) or ``"interval"``:
        the records of the run's data interval by Kafka timestamp, so a backfill of a day loads that
        day, in any order, and a rerun of a committed interval is a no-op (README "Interval mode").
    :param close_after: interval mode: an idle partition's interval closes this long after its end
        (seconds or ``"15m"``; default 15 minutes).
    :param dedup_key: drop a record whose producer key (a Spark SQL expression over the source, e.g.
        ``headers['event-id']``) is already in the table or earlier in the batch (README "Dedup by key");
        ``dedup_horizon`` bounds the look-back (``"1d"``, ``"10 batches"``), ``duplicates_to_dead_letters``
        also writes the dropped records to the dead-letter table.
    :param mirror_consumer_group: also commit the table's offsets to this consumer group, for
        lag tools; the Delta log stays the source of truth.
    :param asset: the Asset the table's events are emitted on (default ``file://<path>`` or the
        ``s3://`` URI); an event is emitted only by a run that committed or reprocessed.
    :param table_wait_timeout: seconds to wait while another attempt on the same table is
        running before planning (runs of one table take turns; of different tables, not).
    """

    template_fields: Sequence[str] = (
        "topics", "table_uri", "starting_offsets", "transform_sql", "spark_conf", "spark_env_vars",
        "reprocess_run_id", "ingest_id", "dead_letter_table_uri", "value_schema", "avro_schema",
        "value_schema_version", "table_properties", "partition_by", "mode", "dedup_key",
    )
    template_fields_renderers = {"transform_sql": "sql", "spark_conf": "json", "spark_env_vars": "json"}
    operator_extra_links = (DeltaBatchLink(),)
    ui_color = "#c9e8f5"

    def __init__(
        self,
        *,
        topics: list[str] | str,
        table_uri: str,
        ingest_id: str | None = None,
        kafka_conn_id: str = "kafka_default",
        spark_conn_id: str = "spark_default",
        starting_offsets: Any = "earliest",
        max_records_per_run: int | None = None,
        transform_sql: str | None = None,
        transform: str | None = None,
        on_data_loss: str = "fail",
        spark_conf: dict[str, Any] | None = None,
        spark_env_vars: dict[str, str] | None = None,
        spark_hook_kwargs: dict[str, Any] | None = None,
        reprocess: bool | None = None,
        reprocess_run_id: str | None = None,
        reprocess_dag_id: str | None = None,
        storage_conn_id: str | None = None,
        storage_options: dict[str, str] | None = None,
        value_schema: str | None = None,
        value_format: str = "json",
        max_value_bytes: int | None = None,
        key_format: str = "raw",
        key_schema: str | None = None,
        schema_registry_conn_id: str | None = None,
        avro_schema: str | None = None,
        key_avro_schema: str | None = None,
        value_subject: str | None = None,
        value_schema_version: str | int = "latest",
        key_subject: str | None = None,
        dead_letter_table_uri: str | None = None,
        max_dead_letters: int | None = None,
        max_dead_letter_fraction: float | None = None,
        schema_evolution: bool = False,
        table_properties: dict[str, str] | None = None,
        partition_by: Sequence[str] | str | None = None,
        mode: str = "offsets",
        close_after: str | float | None = None,
        dedup_key: str | None = None,
        dedup_horizon: str | int | None = None,
        duplicates_to_dead_letters: bool = False,
        mirror_consumer_group: str | None = None,
        asset: Asset | None = None,
        table_wait_timeout: float = 900.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        # The table's Asset event is added at run time through an alias, and only when the
        # run changed the table: a run with nothing new (or a replay) emits no event.
        self.asset_alias = AssetAlias(name=f"airflow-eo:{self.dag_id}.{self.task_id}")
        self.outlets = [*self.outlets, self.asset_alias]
        self.topics = topics
        self.table_uri = table_uri
        self.ingest_id = ingest_id
        self.kafka_conn_id = kafka_conn_id
        self.spark_conn_id = spark_conn_id
        self.starting_offsets = starting_offsets
        self.max_records_per_run = max_records_per_run
        self.transform_sql = transform_sql
        self.transform = transform
        self.on_data_loss = on_data_loss
        self.spark_conf = spark_conf or {}
        self.spark_env_vars = spark_env_vars or {}
        self.spark_hook_kwargs = spark_hook_kwargs or {}
        self.reprocess = reprocess
        self.reprocess_run_id = reprocess_run_id
        self.reprocess_dag_id = reprocess_dag_id
        self.storage_conn_id = storage_conn_id
        self.storage_options = storage_options
        self.value_schema = value_schema
        self.value_format = value_format
        self.max_value_bytes = max_value_bytes
        self.key_format, self.key_schema = key_format, key_schema
        self.schema_registry_conn_id = schema_registry_conn_id
        self.avro_schema, self.key_avro_schema = avro_schema, key_avro_schema
        self.value_subject, self.value_schema_version, self.key_subject = value_subject, value_schema_version, key_subject
        self.dead_letter_table_uri = dead_letter_table_uri
        self.max_dead_letters = max_dead_letters
        self.max_dead_letter_fraction = max_dead_letter_fraction
        self.schema_evolution = schema_evolution
        self.table_properties = table_properties or {}
        self.partition_by = partition_by or ()
        self.mode, self.close_after = mode, close_after
        self.dedup_key, self.dedup_horizon = dedup_key, dedup_horizon
        self.duplicates_to_dead_letters = duplicates_to_dead_letters
        self.mirror_consumer_group = mirror_consumer_group
        self.asset = asset if asset is not None or "{{" in table_uri else table_asset(table_uri)
        self.table_wait_timeout = table_wait_timeout
        self.submitter = None
        self.summary: dict | None = None

    # -- building blocks (each replaceable in tests at its boundary) ------------------
    def ingest_config(self) -> IngestConfig:
        topics = [t.strip() for t in self.topics.split(",")] if isinstance(self.topics, str) else list(self.topics)
        return IngestConfig(
            table_uri=self.table_uri, ingest_id=self.ingest_id or f"{self.dag_id}.{self.task_id}",
            topics=topics, kafka_config=kafka_config_of(self.kafka_conn_id),
            starting_offsets=self.starting_offsets, max_records_per_run=self.max_records_per_run,
            on_data_loss=self.on_data_loss, transform=Transform(sql=self.transform_sql or None,
                                                                callable=self.transform or None),
            storage_options=self.resolved_storage_options(), mirror_consumer_group=self.mirror_consumer_group,
            value_schema=self.value_schema or None, value_format=self.value_format,
            max_value_bytes=self.max_value_bytes, dead_letter_table_uri=self.dead_letter_table_uri or None,
            max_dead_letters=self.max_dead_letters, max_dead_letter_fraction=self.max_dead_letter_fraction,
            schema_evolution=self.schema_evolution, key_format=self.key_format, key_schema=self.key_schema,
            schema_registry=schema_registry_config_of(self.schema_registry_conn_id)
            if self.schema_registry_conn_id else None,
            avro_schema=self.avro_schema or None, key_avro_schema=self.key_avro_schema or None,
            value_subject=self.value_subject, value_schema_version=str(self.value_schema_version),
            key_subject=self.key_subject, table_properties={str(k): str(v) for k, v in self.table_properties.items()},
            partition_by=self.partition_by, mode=self.mode, close_after=self.close_after,
            dedup_key=self.dedup_key or None, dedup_horizon=self.dedup_horizon,
            duplicates_to_dead_letters=self.duplicates_to_dead_letters,
        )

    def resolved_storage_options(self) -> dict[str, str] | None:
        """The ``storage_conn_id`` connection's options, overridden by ``storage_options``."""
        return storage_options_of(self.storage_conn_id, self.storage_options)

    def make_submitter(self):
        """spark-submit through SparkSubmitHook for a ``spark`` connection; the warm Spark
        Connect path for a ``spark_connect`` connection (:mod:`airflow_eo.hooks.spark`)."""
        conf = {k: str(v) for k, v in (self.spark_conf or {}).items()}
        env = {k: str(v) for k, v in (self.spark_env_vars or {}).items() if v not in (None, "")}
        return submitter_for(self.spark_conn_id, conf=conf, env_vars=env,
                             name=f"airflow-eo {self.dag_id}.{self.task_id}", hook_kwargs=self.spark_hook_kwargs)

    @staticmethod
    def run_identity(context) -> RunIdentity:
        ti = context["ti"]
        return RunIdentity(
            run_key=run_key_of(ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1)),
            dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, try_number=ti.try_number,
        )

    def data_interval(self, context) -> Interval | None:
        """Interval mode: the run's ``[data_interval_start, data_interval_end)``."""
        if self.mode != "interval":
            return None
        start, end = context.get("data_interval_start"), context.get("data_interval_end")
        if start is None or end is None or end <= start:
            raise ConfigError(f"mode='interval' needs a run with a data interval; this run has [{start}, {end}) "
                              "(a manual run of an unscheduled DAG): give the DAG a schedule, or trigger with a "
                              "logical date of a scheduled interval")
        return interval_of(start, end)

    def reprocess_target(self, context, run: RunIdentity) -> str | None:
        """The run key to reprocess, or None for a normal ingest."""
        params = context.get("params") or {}
        flag = self.reprocess if self.reprocess is not None else params.get("reprocess", False)
        if isinstance(flag, str):
            flag = flag.strip().lower() in ("1", "true", "yes", "on")
        if not flag:
            return None
        run_id = self.reprocess_run_id or params.get("reprocess_run_id") or run.run_id
        dag_id = self.reprocess_dag_id or params.get("reprocess_dag_id") or run.dag_id
        ti = context["ti"]
        return run_key_of(dag_id, run_id, self.task_id, getattr(ti, "map_index", -1))

    # -- execution ---------------------------------------------------------------
    def execute(self, context) -> dict:
        run = self.run_identity(context)
        self.submitter = self.make_submitter()
        try:
            ingestion = Ingestion(self.ingest_config(), self.submitter)
            target = self.reprocess_target(context, run)
            if target is None:
                ingestion.wait_for_turn(self.table_wait_timeout)  # runs of one table take turns
                result = ingestion.run(run, self.data_interval(context))
            else:
                from airflow_eo.reprocess import Reprocessor

                self.log.info("reprocess requested for run %s", target)
                result = Reprocessor(ingestion).run(run, target_run_key=target)
        except AirflowEoError as exc:
            raise_for_airflow(self.log, exc)
        self.summary = summary = result.to_dict()
        self.log.info("airflow-eo %s: batch %s, table version %s, %s rows, ranges %s, lag %s",
                      summary["status"], summary["batch"], summary["version"], summary["rows"],
                      json.dumps(summary["ranges"]), json.dumps(summary["lag"]))
        self.log.info("Delta batch: %s", summary_link(summary))
        emit_run_metrics(summary)
        if summary["status"] in CHANGED_TABLE and "outlet_events" in context:
            context["outlet_events"][self.asset_alias].add(self.asset or table_asset(self.table_uri), extra=summary)
        return summary

    # -- OpenLineage (apache-airflow-providers-openlineage calls these) -------------------
    def get_openlineage_facets_on_complete(self, task_instance):
        """Inputs: the topics (``kafka://<bootstrap>``); output: the table with its schema and
        row/byte counts; run facet ``airflow_eo``: batch, version and committed offset ranges."""
        from airflow_eo.operators.lineage import ingest_lineage

        config = self.ingest_config()
        return ingest_lineage(self.summary, str(config.kafka_config["bootstrap.servers"]), config.topics,
                              config.table_uri, table_columns(config.table_uri, config.storage_options),
                              config.ingest_id)

    def get_openlineage_facets_on_failure(self, task_instance):
        return self.get_openlineage_facets_on_complete(task_instance)

    def on_kill(self) -> None:
        if self.submitter is not None:
            self.submitter.kill()
