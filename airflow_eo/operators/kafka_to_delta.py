"""KafkaToDeltaOperator: one exactly-once batch from Kafka topics into a Delta table.

The operator is thin: it builds an :class:`~airflow_eo.loop.config.IngestConfig` from its
(templated) arguments and the ``kafka`` / ``spark`` connections, runs
:class:`~airflow_eo.loop.ingest.Ingestion` with a :class:`~airflow_eo.submit.spark_hook.SparkSubmitHookSubmitter`
and returns the run's summary (XCom), which is also the extra of the table's Asset event
and what the "Delta batch" extra link shows.

Run semantics (see README "Reruns, clears and backfills"): the run key is
``<dag_id>/<run_id>/<task_id>/<map_index>``, stable across retries and clears and never
derived from the try number or logical date (manual runs have none). A retry or clear
replays the run's logged plan, or reports its committed batch without starting Spark.
With ``reprocess`` (operator argument or DAG param ``reprocess``) the run's batch (or the
one of ``reprocess_run_id``) is re-read and its rows are replaced in one commit.

Concurrency is per table, not per DAG: a run holds its table's lease from planning to the end of
its verify step and waits (``table_wait_timeout``) while another run of the table holds it, so
mapped ingests of different tables run in parallel and runs of one table take turns before they
plan (:mod:`airflow_eo.table.lease`); interval runs of disjoint intervals never conflict, and an
offset run that still races loses at the compare-and-set commit with a (retryable) conflict.

Fan-out: with ``sinks`` (a list of tables, each with its own options over the operator's) or
``topic_pattern``, a run reads Kafka once and commits each table exactly once in its own Delta
commit (:mod:`airflow_eo.loop.fanout`); its XCom lists each table's result, each table that committed
gets its Asset event, and lineage has the topics as inputs and each table as an output.

Interval mode waits for its interval to close: a deferrable operator (``deferrable``, default
Airflow's ``[operators] default_deferrable``, which a deployment with a triggerer turns on)
defers to :class:`~airflow_eo.triggers.interval_closed.IntervalClosedTrigger` until every
partition has a record past the interval's end or ``close_after`` passes, then plans; without
deferral the run fails with the retryable ``IntervalNotClosedError`` and Airflow's retries wait.

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

import inspect
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NoReturn
from urllib.parse import urlencode

# Asset and AssetAlias are Dataset and DatasetAlias on Airflow 2.11 (common-compat resolves them)
from airflow.providers.common.compat.sdk import Asset, AssetAlias, BaseOperator, BaseOperatorLink, conf

from airflow_eo.attempt import Secrets
from airflow_eo.core.errors import AirflowEoError, ConfigError, IntervalNotClosedError
from airflow_eo.hooks.kafka import kafka_config_of
from airflow_eo.hooks.schema_registry import schema_registry_config_of
from airflow_eo.hooks.spark import submitter_for
from airflow_eo.hooks.storage import storage_options_of
from airflow_eo.loop.ingest import FanOut
from airflow_eo.loop.config import IngestConfig
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.sinks import recorded_sink
from airflow_eo.operators.failures import raise_for_airflow
from airflow_eo.operators.metrics import emit_run_metrics
from airflow_eo.operators.task_end import released_at_end
from airflow_eo.core.intervals import interval_of
from airflow_eo.core.offsets import Interval, RunIdentity
from airflow_eo.spec import (
    OPTIONS, all_options, default_of, dump_option, operator_param_docs, operator_signature, required, templated_options,
    normalize_table_uri,
)
from airflow_eo.spec.fanout import FanOutSpec, fans_out
from airflow_eo.spec.options import topic_list
from airflow_eo.table.storage import is_local
from airflow_eo.triggers.interval_closed import IntervalClosedTrigger
from airflow_eo.triggers.polling import error_of_event
from airflow_eo.version_compat import AIRFLOW_V_3_0_PLUS, asset_event_extra, xcom_of_task


def run_key_of(dag_id: str, run_id: str, task_id: str, map_index: int | None) -> str:
    """The stable key of one task of one DAG run: the same for all its retries and clears."""
    return f"{dag_id}/{run_id}/{task_id}/{-1 if map_index is None else map_index}"


def table_asset(table_uri: str) -> Asset:
    """The Asset a table's events are emitted on (``file://`` URI for local tables)."""
    uri = normalize_table_uri(table_uri)
    return Asset(uri=f"file://{uri}" if is_local(uri) else uri)


def table_columns(table_uri: str, storage_options: dict | None) -> tuple[tuple[str, str], ...]:
    """(name, type) of the table's columns, for lineage; empty before the first commit."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        schema = DeltaTable(table_uri, storage_options=storage_options).schema()
    except TableNotFoundError:
        return ()
    return tuple((f.name, str(f.type.type) if hasattr(f.type, "type") else type(f.type).__name__)
                 for f in schema.fields)


def summary_link(summary: dict | None) -> str:
    """A link to the table, with the batch, version and ranges of a run in its fragment."""
    if summary and "tables" in summary:  # a fan-out: its first table that changed, else its first
        tables = summary["tables"]
        summary = next((t for t in tables if RunStatus(t["status"]).wrote_commit), tables[0] if tables else None)
    if not summary:
        return ""
    uri = summary["table_uri"]
    base = f"file://{uri}" if is_local(uri) else uri
    ranges = ",".join(f"{r['topic']}[{r['partition']}]:{r['start']}-{r['end']}" for r in summary.get("ranges", []))
    query = {"status": summary.get("status"), "batch": summary.get("batch"), "version": summary.get("version"),
             "rows": summary.get("rows"), "ranges": ranges}
    return f"{base}#{urlencode({k: v for k, v in query.items() if v is not None})}"


@dataclass(frozen=True)
class LineageSource:
    """What lineage names, recorded by ``execute`` (no secret: the bootstrap servers are an address)."""

    table_uri: str
    ingest_id: str
    topics: tuple[str, ...]
    bootstrap_servers: str | None = None
    columns: tuple[tuple[str, str], ...] = ()  # the table's (name, type) after the run

    @classmethod
    def of(cls, config: IngestConfig) -> "LineageSource":
        bootstrap = config.kafka_config.get("bootstrap.servers")
        return cls(config.table_uri, config.ingest_id, tuple(config.topics), str(bootstrap) if bootstrap else None)

    @classmethod
    def tables_before_run(cls, operator: "KafkaToDeltaOperator") -> tuple["LineageSource", ...]:
        """The tables known from the (rendered) arguments alone, when ``execute`` failed before it knew more:
        those without ``{topic}``."""
        topics = topic_list(operator.topics) if operator.topics else ()
        return tuple(cls(uri, operator.default_ingest_id(), topics) for uri in static_tables(operator.sinks,
                                                                                           operator.table_uri))


def static_tables(sinks: Any, table_uri: str | None) -> tuple[str, ...]:
    """The tables of a fan-out known before it runs: each sink's ``table_uri`` (else the shared one)
    that names one table (no ``{topic}``, no Jinja left); none while ``sinks`` is still a template."""
    if not isinstance(sinks, (list, tuple)):
        return (normalize_table_uri(table_uri),) if isinstance(table_uri, str) and "{" not in table_uri else ()
    uris = (s.get("table_uri", table_uri) if isinstance(s, dict) else None for s in sinks)
    return tuple(dict.fromkeys(normalize_table_uri(u) for u in uris if isinstance(u, str) and "{" not in u))


def optional(signature: inspect.Signature, *names: str) -> inspect.Signature:
    """``signature`` with the keywords ``names`` defaulting to None: a fan-out's sinks carry the
    ``table_uri`` an operator of one table requires (``__init__`` checks that one is given)."""
    return signature.replace(parameters=[p.replace(default=None) if p.name in names and p.default is p.empty else p
                                         for p in signature.parameters.values()])


class DeltaBatchLink(BaseOperatorLink):
    """Extra link "Delta batch": the table, the version this run produced and its offsets."""

    name = "Delta batch"

    def get_link(self, operator, *, ti_key) -> str:
        # Airflow 3 computes links in the task process as it finishes: the operator still holds
        # its summary (None after a failed try: no link, and no XCom lookup that logs an error).
        # Airflow 2's webserver computes them later, from the serialised operator: the XCom then.
        if not AIRFLOW_V_3_0_PLUS:
            return summary_link(xcom_of_task(ti_key))
        return summary_link(getattr(operator, "summary", None))


class KafkaToDeltaOperator(BaseOperator):
    """Ingest the next batch of ``topics`` into the Delta table at ``table_uri``, exactly once.

    Every option of the ingest spec (:mod:`airflow_eo.spec`: ``topics``, ``table_uri``,
    ``starting_offsets``, ``transform_sql``, ``partition_by``, ``mode``…) is a keyword argument
    of the same name, listed below the operator's own; the templated ones are in
    ``template_fields``. ``ingest_id`` defaults to ``<dag_id>.<task_id>``.

    :param kafka_conn_id: a ``kafka`` connection (apache-airflow-providers-apache-kafka's type).
    :param spark_conn_id: a ``spark`` connection (spark-submit through SparkSubmitHook: ``local[*]``,
        ``spark://…``, ``yarn``, ``k8s://…``) or a ``spark_connect`` connection (each batch runs on
        that warm Spark Connect server; URL, token and TLS from SparkConnectHook).
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
    :param schema_registry_conn_id: connection of a Confluent-compatible Schema Registry (Avro in
        the Confluent wire format); see :mod:`airflow_eo.hooks.schema_registry`.
    :param asset: the Asset the table's events are emitted on (default ``file://<path>`` or the
        ``s3://`` URI); an event is emitted only by a run that committed or reprocessed.
    :param deferrable: interval mode: while the run's interval is not closed, wait in the
        triggerer (:class:`~airflow_eo.triggers.interval_closed.IntervalClosedTrigger`) instead of
        failing for a retry; default Airflow's ``[operators] default_deferrable``.
    :param poll_interval: seconds between the trigger's checks of whether the interval closed.
    :param sinks: the tables of a fan-out (templated), one object per table with that table's options
        (``table_uri``, ``write_mode``, ``merge_key``, ``transform_sql``, ``filter``, ``partition_by``,
        ``dead_letter_table_uri``, ``ingest_id``, ``topics``: some of the source's…) over the operator's
        own; a ``table_uri`` with ``{topic}`` makes one table per topic. A run reads Kafka once and
        commits each table exactly once in its own Delta commit (``airflow_eo.loop.fanout``); its XCom
        lists each table's result; each table that committed gets an Asset event (its
        ``file://`` / ``s3://`` URI) and is an OpenLineage output. Default: the one table of ``table_uri``.
    """

    template_fields: Sequence[str] = (*templated_options(), "spark_conf", "spark_env_vars", "reprocess_run_id", "sinks")
    template_fields_renderers = {"transform_sql": "sql", "spark_conf": "json", "spark_env_vars": "json", "sinks": "json"}
    operator_extra_links = (DeltaBatchLink(),)
    ui_color = "#c9e8f5"

    def __init__(
        self,
        *,
        kafka_conn_id: str = "kafka_default",
        spark_conn_id: str = "spark_default",
        spark_conf: dict[str, Any] | None = None,
        spark_env_vars: dict[str, str] | None = None,
        spark_hook_kwargs: dict[str, Any] | None = None,
        reprocess: bool | None = None,
        reprocess_run_id: str | None = None,
        reprocess_dag_id: str | None = None,
        storage_conn_id: str | None = None,
        storage_options: dict[str, str] | None = None,
        schema_registry_conn_id: str | None = None,
        asset: Asset | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 60.0,
        sinks: list[dict[str, Any]] | None = None,
        **kwargs,
    ):
        # the spec's options (airflow_eo.spec), each a keyword of its own name (in the signature
        # below, so Airflow checks required ones and applies default_args); the rest is BaseOperator's
        options = {name: kwargs.pop(name) for name in OPTIONS if name in kwargs}
        super().__init__(**kwargs)
        for opt in all_options():  # kept raw (templates render them); parsed once, in ingest_config()
            setattr(self, opt.name, options[opt.name] if opt.name in options else
                    (None if required(opt) else dump_option(opt, default_of(opt))))
        # The table's Asset event is added at run time through an alias, and only when the
        # run changed the table: a run with nothing new (or a replay) emits no event.
        self.asset_alias = AssetAlias(name=f"airflow-eo:{self.dag_id}.{self.task_id}")
        self.outlets = [*self.outlets, self.asset_alias]
        self.kafka_conn_id = kafka_conn_id
        self.spark_conn_id = spark_conn_id
        self.spark_conf = spark_conf or {}
        self.spark_env_vars = spark_env_vars or {}
        self.spark_hook_kwargs = spark_hook_kwargs or {}
        self.reprocess = reprocess
        self.reprocess_run_id = reprocess_run_id
        self.reprocess_dag_id = reprocess_dag_id
        self.storage_conn_id = storage_conn_id
        self.storage_options = storage_options
        self.schema_registry_conn_id = schema_registry_conn_id
        self.sinks = sinks
        if sinks is None and self.table_uri is None:  # the signature cannot say it: sinks carry their own
            raise TypeError("missing keyword argument 'table_uri' (or sinks, each with its table_uri)")
        if self.fans_out and asset is not None:
            raise ConfigError("asset names the Asset of the one table of table_uri; with sinks or topic_pattern each "
                              "table gets the Asset of its own table_uri: drop asset")
        # the one table's Asset; a fan-out's, each table's: those known now, the {topic} ones at run time
        self.asset = asset if asset is not None or self.fans_out or "{{" in self.table_uri else \
            table_asset(self.table_uri)
        self.sink_assets = tuple(table_asset(uri) for uri in static_tables(sinks, self.table_uri)) \
            if self.fans_out else ()
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self.submitter = None
        self.summary: dict | None = None
        self.lineage_sources: tuple[LineageSource, ...] = ()  # one per table

    __init__.__signature__ = optional(operator_signature(inspect.signature(__init__)),  # type: ignore[attr-defined]
                                      "table_uri")

    @property
    def fans_out(self) -> bool:
        """Several tables, a pattern's topics or a table per topic: the fan-out loop (:mod:`airflow_eo.loop.fanout`)."""
        return fans_out({"sinks": self.sinks, "topic_pattern": getattr(self, "topic_pattern", None),
                         "table_uri": getattr(self, "table_uri", None),
                         "dead_letter_table_uri": getattr(self, "dead_letter_table_uri", None)})

    def default_ingest_id(self) -> str:
        return self.ingest_id or f"{self.dag_id}.{self.task_id}"

    # -- building blocks (each replaceable in tests at its boundary) ------------------
    def options(self) -> dict[str, Any]:
        """This operator's (rendered) options by name, raw."""
        options = {opt.name: getattr(self, opt.name) for opt in all_options()}
        options["ingest_id"] = self.default_ingest_id()
        return options

    def credentials(self) -> Secrets:
        """The secrets the run needs, from the connections (never in the spec, XCom or logs)."""
        return Secrets(kafka_config_of(self.kafka_conn_id), self.resolved_storage_options(),
                       schema_registry_config_of(self.schema_registry_conn_id) if self.schema_registry_conn_id else None)

    def ingest_config(self) -> IngestConfig:
        """The spec from this operator's (rendered) options, in one call; secrets from the connections."""
        return IngestConfig(credentials=self.credentials(), **self.options())

    def fan_out(self, submitter) -> FanOut:
        """The fan-out of this operator's options and ``sinks``: the options left unset (None) are
        the spec's defaults, each sink's own options overlay the rest."""
        options = {name: value for name, value in self.options().items() if value is not None}
        return FanOut(FanOutSpec.of(sinks=self.sinks, **options), self.credentials(), submitter)

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
        with released_at_end():  # before the listeners fork this process
            return self._execute(context)

    def _execute(self, context) -> dict:
        run = self.run_identity(context)
        self.submitter = self.make_submitter()
        try:
            target = self.reprocess_target(context, run)
            result = self._run(context, run, target)
        except AirflowEoError as exc:
            raise_for_airflow(self.log, exc)
        self.summary = result.to_dict()
        for table in result.tables:
            self.report_table(table.to_dict(), context)
        return self.summary

    def _run(self, context, run: RunIdentity, target: str | None):
        """The ingest of this task's tables (its one table, or each of its sinks: :mod:`airflow_eo.loop.ingest`),
        or the reprocess of ``target``'s batch in each of them."""
        ingest = self.fan_out(self.submitter)
        configs = ingest.configs()  # the tables now (a pattern resolved): lineage's, and where a wait looks
        topics = tuple(dict.fromkeys(t for c in configs for t in c.topics))
        bootstrap = LineageSource.of(configs[0]).bootstrap_servers if configs else None
        self.lineage_sources = tuple(LineageSource(c.table_uri, c.ingest_id, c.topics if ingest.one_table else topics,
                                                   bootstrap) for c in configs)
        if target is not None:
            from airflow_eo.loop.reprocess import reprocess

            self.log.info("reprocess requested for run %s", target)
            result = reprocess(ingest, run, target_run_key=target)
        else:
            result = self._run_or_defer(ingest.run, run, self.data_interval(context), configs[0] if configs else None,
                                        topics)
        storage = configs[0].storage_options if configs else None  # every table's: the operator's connection
        self.lineage_sources = tuple(replace(source, columns=self.committed_columns(source.table_uri, storage))
                                     for source in self.lineage_sources
                                     if source.table_uri in {t.table_uri for t in result.tables})
        return result

    def _run_or_defer(self, run_batch, run: RunIdentity, interval: Interval | None, config: IngestConfig | None,
                      topics: Sequence[str] | None = None):
        """``run_batch(run, interval)``; in interval mode, while the interval is open, deferred until it closes."""
        try:
            return run_batch(run, interval)
        except IntervalNotClosedError as exc:
            if not self.deferrable or interval is None or config is None:
                raise
            self.defer_until_closed(config, interval, exc, topics)

    def report_table(self, summary: dict, context) -> None:
        """One table's result: its log lines, metrics and (when the run changed it) Asset event."""
        counts = recorded_sink(summary.get("write_mode") or "append").counts_text(summary)
        self.log.info("airflow-eo %s: table %s, batch %s, table version %s, %s rows, ranges %s, lag %s%s",
                      summary["status"], summary["table_uri"], summary["batch"],
                      summary["version"], summary["rows"], json.dumps(summary["ranges"]), json.dumps(summary["lag"]),
                      f", {counts}" if counts else "")
        self.log.info("Delta batch: %s", summary_link(summary))
        emit_run_metrics(summary)
        if RunStatus(summary["status"]).wrote_commit and "outlet_events" in context:
            asset = self.asset or table_asset(summary["table_uri"])
            context["outlet_events"][self.asset_alias].add(asset, extra=asset_event_extra(summary))

    def defer_until_closed(self, config: IngestConfig, interval: Interval, why: IntervalNotClosedError,
                           topics: Sequence[str] | None = None) -> NoReturn:
        """Wait in the triggerer for the interval to close, then plan (:meth:`execute_complete`).
        Nothing was planned or logged for the run yet, so the resumed run plans as a first try would.
        A fan-out waits on its first table for all its ``topics`` (the interval closes in Kafka, not in a table)."""
        self.log.info("%s; deferring until every partition has a record past the interval's end or close_after "
                      "passes (checked every %.0f s)", str(why).split("; it closes when")[0], self.poll_interval)
        self.defer(trigger=IntervalClosedTrigger(
            table_uri=config.table_uri, ingest_id=config.ingest_id, topics=list(topics or config.topics),
            interval_start_ms=interval.start_ms, interval_end_ms=interval.end_ms, close_after=config.spec.planning.close_after,
            kafka_conn_id=self.kafka_conn_id, storage_conn_id=self.storage_conn_id,
            storage_options=self.storage_options, poll_interval=self.poll_interval, adopt_table=config.spec.table.adopt_table,
        ), method_name="execute_complete")

    def execute_complete(self, context, event: dict) -> dict:
        """Resumed from :class:`~airflow_eo.triggers.interval_closed.IntervalClosedTrigger`: plan
        and run now (a run that finds the interval open again defers again)."""
        error = error_of_event(event)
        if error is not None:
            raise_for_airflow(self.log, error)
        self.log.info("interval %s closed after %s s in the triggerer: planning", event.get("interval"),
                      event.get("waited_seconds"))
        return self.execute(context)

    def dry_run(self, context=None):
        """Print what the next run of this task would read and write, writing nothing: Airflow's
        dry run (the template fields, as ``BaseOperator.dry_run`` logs them), then the plan preview
        (:mod:`airflow_eo.loop.preview`: batch, ranges and records per partition, interval, reader schemas,
        the tables it writes). It reads the table and Kafka through the task's connections; it logs no
        plan, stages nothing, waits for no turn and starts no Spark job. Returns the preview.

        Airflow 2 calls it from ``airflow tasks test --dry-run`` after rendering the templates; Airflow 3
        has no command that calls it: call ``dag.get_task("ingest").dry_run()`` (a new run), or pass a
        task ``context`` (rendered) to preview that run: its logged plan if it has one, its data interval
        in interval mode."""
        from airflow_eo.loop.preview import NO_SPARK, plan_previews

        super().dry_run()
        unrendered = [f for f in ("table_uri", "topics", "ingest_id") if "{{" in str(getattr(self, f) or "")]
        if unrendered:
            raise ConfigError(f"{', '.join(unrendered)} still hold Jinja templates: a preview needs them rendered "
                              "(Airflow 2: airflow tasks test --dry-run; or call render_template_fields(context) first)")
        run = self.run_identity(context) if context is not None else RunIdentity("")
        interval = self.data_interval(context) if context is not None else None
        if self.mode == "interval" and interval is None:
            raise ConfigError("mode='interval': a preview needs the run's data interval: call dry_run(context) with "
                              "the run's context, or run airflow-eo plan with --interval-start and --interval-end")
        try:
            previews = plan_previews(self.fan_out(NO_SPARK), run, interval)
        except AirflowEoError as exc:
            raise_for_airflow(self.log, exc)
        print("\n".join(previews.lines()))
        return previews.tables[0] if previews.one_table else list(previews.tables)

    def committed_columns(self, table_uri: str, storage_options) -> tuple[tuple[str, str], ...]:
        """A table's columns after the run, for lineage (read here, in the task: see below)."""
        try:
            return table_columns(table_uri, storage_options)
        except Exception as exc:  # lineage never fails a run that committed
            self.log.info("lineage will name no columns: the table's schema could not be read (%s)", exc)
            return ()

    # -- OpenLineage (apache-airflow-providers-openlineage calls these) -------------------
    # They read only what :meth:`execute` recorded (``lineage_source``, ``summary``): the provider
    # calls them in a forked child by default, where deltalake's runtime panics and a connection
    # lookup would share the supervisor's socket with the task; so no table, Kafka or connection here.
    def get_openlineage_facets_on_start(self):  # the provider passes no task instance here
        """Output: the table (nothing of Kafka is known before ``execute`` resolved the connection)."""
        return self._lineage(None)

    def get_openlineage_facets_on_complete(self, task_instance):
        """Inputs: the topics (``kafka://<bootstrap>``); output: the table with its schema and
        row/byte counts (a fan-out: each table); run facet ``airflow_eo``: batch, version and
        committed offset ranges (a fan-out: each table's)."""
        return self._lineage(self.summary)

    def _lineage(self, summary: dict | None):
        from airflow_eo.operators.lineage import run_lineage

        return run_lineage(summary, self.lineage_sources or LineageSource.tables_before_run(self))

    def get_openlineage_facets_on_failure(self, task_instance):
        return self.get_openlineage_facets_on_complete(task_instance)

    def on_kill(self) -> None:
        if self.submitter is not None:
            self.submitter.kill()


# the spec's options, documented from their fields like the CLI's help and README's table
KafkaToDeltaOperator.__doc__ = (KafkaToDeltaOperator.__doc__ or "").rstrip() + "\n\n" + operator_param_docs()
