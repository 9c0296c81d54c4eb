"""KafkaToDeltaOperator with ``sinks``: it builds one fan-out from its options and connections and
returns the fan-out's result as XCom; each table that committed gets its Asset event and metrics,
lineage has the topics in and each table out. The fan-out loop is replaced at its boundary (the
``FanOut`` class: no broker, no Spark); the spec, connections, Assets and lineage are the real ones."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from airflow.providers.common.compat.sdk import DAG, TaskDeferred
from deltalake import write_deltalake

from airflow_eo.core.errors import ConfigError, IntervalNotClosedError
from airflow_eo.loop.ingest import FanOut, FanOutResult
from airflow_eo.operators import kafka_to_delta
from airflow_eo.operators.kafka_to_delta import KafkaToDeltaOperator, table_asset
from airflow_eo.core.outcomes import RunStatus
from airflow_eo.loop.result import IngestResult
from airflow_eo.spec.fanout import FanOutSpec
from tests.airflow_context import context_for
from tests.unit.fakes import FakeKafka

SECRET = "s3cr3t-never-in-xcom"
MERGE = {"write_mode": "merge", "merge_key": "id",
         "transform_sql": "SELECT CAST(key AS STRING) AS id, topic, partition, offset, "
                           "CAST(value AS STRING) AS body FROM source"}


class RecordingFanOut(FanOut):
    """The fan-out loop with its run replaced at the boundary (its tables are the real ones): what the
    operator built it from, and a result in which the first table committed and the others had
    nothing new (or ``fail`` raised instead)."""

    made: list["RecordingFanOut"] = []
    fail: Exception | None = None
    kafka: FakeKafka | None = None  # the cluster a topic pattern is resolved against

    def __init__(self, spec, credentials, submitter, kafka=None):
        super().__init__(spec, credentials, submitter, kafka or RecordingFanOut.kafka)
        self.runs: list = []
        RecordingFanOut.made.append(self)

    def run(self, run, interval=None):
        self.runs.append((run, interval))
        if self.fail is not None:
            raise self.fail
        return FanOutResult(tables=tuple(
            IngestResult(RunStatus.COMMITTED, c.ingest_id, c.table_uri, run.run_key, batch=4, version=9, rows=12,
                         files=1, bytes=2048, ranges=[{"topic": "orders", "partition": 0, "start": 0, "end": 12}])
            if i == 0 else IngestResult(RunStatus.NOTHING_NEW, c.ingest_id, c.table_uri, run.run_key)
            for i, c in enumerate(self.configs())))


@pytest.fixture
def fan_out(monkeypatch):
    RecordingFanOut.made, RecordingFanOut.fail, RecordingFanOut.kafka = [], None, None
    monkeypatch.setattr(kafka_to_delta, "FanOut", RecordingFanOut)
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_UNIT", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": "broker-1:9092,broker-2:9092", "sasl.password": SECRET}}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    return RecordingFanOut.made


def operator(**kwargs) -> KafkaToDeltaOperator:
    with DAG("fan_dag", schedule=None, start_date=datetime(2026, 1, 1)):
        return KafkaToDeltaOperator(task_id="ingest", kafka_conn_id="kafka_unit", **kwargs)


def tables(tmp_path) -> tuple[str, str]:
    return str(tmp_path / "orders_now"), str(tmp_path / "orders_raw")


def test_sinks_build_one_fan_out_from_the_options_and_connections_and_its_result_is_the_xcom(fan_out, tmp_path):
    now, raw = tables(tmp_path)
    op = operator(topics="orders,refunds", ingest_id="orders", max_records_per_run=500,
                  sinks=[{"table_uri": now, **MERGE}, {"table_uri": raw, "topics": ["orders"]}])
    summary = op.execute(context_for(op, "manual__1"))

    (made,) = fan_out
    assert isinstance(made.spec, FanOutSpec)
    specs = {s.table_uri: s for s in made.spec.tables(("orders", "refunds"))}
    assert set(specs) == {now, raw}
    assert specs[now].value("write_mode").value == "merge" and specs[now].value("merge_key") == ("id",)
    assert specs[raw].value("write_mode").value == "append" and specs[raw].topics == ("orders",)
    assert {s.ingest_id for s in specs.values()} == {"orders"}  # the sinks share the operator's ingest_id
    assert {s.value("max_records_per_run") for s in specs.values()} == {500}
    assert made.credentials.kafka_config["sasl.password"] == SECRET  # from the connection, never the spec
    assert type(made.submitter).__name__ == "SparkSubmitHookSubmitter" and op.submitter is made.submitter
    ((run, interval),) = made.runs
    assert (run.run_key, interval) == ("fan_dag/manual__1/ingest/-1", None)

    # XCom: the fan-out's result, one entry per table, JSON as it is, no secret
    assert summary == made.run(run).to_dict() == json.loads(json.dumps(summary))
    assert summary["status"] == "committed"
    assert [(t["table_uri"], t["status"]) for t in summary["tables"]] == [(now, "committed"), (raw, "nothing_new")]
    assert SECRET not in json.dumps(summary) and op.summary == summary


def test_each_table_that_committed_gets_its_asset_event_and_metrics(fan_out, tmp_path, monkeypatch):
    from airflow_eo.operators import metrics

    sent = []

    class Stats:  # Airflow's Stats, at its boundary
        def __getattr__(self, kind):
            return lambda name, value, tags=None: sent.append((name, value, tags))

    monkeypatch.setattr(metrics, "_stats", Stats)
    now, raw = tables(tmp_path)
    op = operator(topics="orders", sinks=[{"table_uri": now, **MERGE}, {"table_uri": raw},
                                          {"table_uri": str(tmp_path / "by_topic_{topic}")}])
    # the tables known when the DAG is parsed (no {topic}); events go through the alias: only on a commit
    assert op.sink_assets == (table_asset(now), table_asset(raw)) and op.outlets == [op.asset_alias]
    assert op.asset is None
    ctx = context_for(op, "manual__1")
    summary = op.execute(ctx)
    (emitted,) = ctx["outlet_events"][op.asset_alias].emitted
    assert emitted[0] == table_asset(summary["tables"][0]["table_uri"]) and emitted[1]["status"] == "committed"
    runs = [(tags["table"], tags["status"]) for name, _, tags in sent if name == "airflow_eo.runs"]
    assert runs == [(t["table_uri"], t["status"]) for t in summary["tables"]] and len(runs) == 3
    assert [v for name, v, tags in sent if name == "airflow_eo.records_committed" and tags] == [12]


def test_lineage_has_the_topics_in_and_each_table_out(fan_out, tmp_path):
    now, raw = tables(tmp_path)
    write_deltalake(now, pa.table({"id": ["a"], "body": ["x"]}))  # a table with a schema to name
    op = operator(topics="orders,refunds", sinks=[{"table_uri": now, **MERGE}, {"table_uri": raw}])
    before = op.get_openlineage_facets_on_start()
    assert before.inputs == [] and [o.name for o in before.outputs] == [now, raw]  # Kafka unknown before execute

    summary = op.execute(context_for(op, "manual__1"))
    lineage = op.get_openlineage_facets_on_complete(None)
    assert [(i.namespace, i.name) for i in lineage.inputs] == [("kafka://broker-1:9092", "orders"),
                                                              ("kafka://broker-1:9092", "refunds")]
    assert [(o.namespace, o.name) for o in lineage.outputs] == [("file", now), ("file", raw)]
    committed, idle = lineage.outputs
    assert [f.name for f in committed.facets["schema"].fields] == ["id", "body"] and "schema" not in idle.facets
    assert committed.outputFacets["outputStatistics"].rowCount == 12 and idle.outputFacets == {}
    facet = lineage.run_facets["airflow_eo"]
    assert facet.status == "committed" and facet.batch is None
    assert [(t["table_uri"], t["status"], t["batch"], t["ranges"]) for t in facet.tables] == \
        [(t["table_uri"], t["status"], t["batch"], t["ranges"]) for t in summary["tables"]]


class Cluster(FakeKafka):
    def topics(self):
        return (*sorted({tp.topic for tp in self.records}), "__consumer_offsets")


def test_a_topic_pattern_writes_a_table_per_matching_topic_each_with_its_asset_at_run_time(fan_out, tmp_path):
    RecordingFanOut.kafka = Cluster(**{"orders.eu": 1, "orders.us": 2, "refunds": 1})
    template = str(tmp_path / "orders_{topic}")
    op = operator(topic_pattern=r"orders\..*", table_uri=template, ingest_id="orders")
    assert op.fans_out and op.sink_assets == () and op.asset is None  # which tables: known when it runs
    ctx = context_for(op, "manual__1")
    summary = op.execute(ctx)
    (made,) = fan_out
    assert made.spec.topic_pattern == r"orders\..*" and made.spec.sinks == ({},)
    assert [t["table_uri"] for t in summary["tables"]] == [template.format(topic="orders.eu"),
                                                           template.format(topic="orders.us")]
    assert [a for a, _ in ctx["outlet_events"][op.asset_alias].emitted] == [
        table_asset(template.format(topic="orders.eu"))]
    lineage = op.get_openlineage_facets_on_complete(None)
    assert [i.name for i in lineage.inputs] == ["orders.eu", "orders.us"] and len(lineage.outputs) == 2


def test_a_reprocess_of_a_fan_out_reprocesses_the_batch_of_the_run_in_every_table(fan_out, tmp_path, monkeypatch):
    from airflow_eo.loop import reprocess as reprocess_module

    now, raw = tables(tmp_path)
    asked = []

    def recording(ingest, requester, target_run_key=None, table=None):
        asked.append((ingest, requester.run_key, target_run_key, table))
        return FanOutResult(tuple(IngestResult(RunStatus.REPROCESSED, c.ingest_id, c.table_uri, requester.run_key,
                                               batch=3, version=7) for c in ingest.configs()))

    monkeypatch.setattr(reprocess_module, "reprocess", recording)
    op = operator(topics="orders", sinks=[{"table_uri": now}, {"table_uri": raw}])
    summary = op.execute(context_for(op, "r2", params={"reprocess": True, "reprocess_run_id": "r1"}))
    ((ingest, requester, target, table),) = asked
    assert ingest is fan_out[0] and fan_out[0].runs == []  # one ingest of both tables; nothing ingested
    assert (requester, target, table) == ("fan_dag/r2/ingest/-1", "fan_dag/r1/ingest/-1", None)
    assert summary["status"] == "reprocessed" and summary["table_uris"] == sorted([now, raw])


def test_an_open_interval_defers_on_the_first_table_for_every_topic(fan_out, tmp_path):
    now, raw = tables(tmp_path)
    RecordingFanOut.fail = IntervalNotClosedError("orders[0] has no record past 01:00 yet")
    op = operator(topics="orders,refunds", mode="interval", deferrable=True,
                  sinks=[{"table_uri": now, "topics": ["refunds"]}, {"table_uri": raw, "topics": ["orders"]}])
    start, end = datetime(2026, 11, 27, 0, tzinfo=timezone.utc), datetime(2026, 11, 27, 1, tzinfo=timezone.utc)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context_for(op, "scheduled__1", data_interval_start=start, data_interval_end=end))
    trigger = deferred.value.trigger
    (made,) = fan_out
    assert trigger.topics == ["refunds", "orders"] and trigger.table_uri == made.configs()[0].table_uri
    assert (trigger.interval.start_ms, trigger.interval.end_ms) == (int(start.timestamp() * 1000),
                                                                     int(end.timestamp() * 1000))
    assert made.runs[0][1] == trigger.interval


def test_sinks_are_templated_with_the_other_arguments(fan_out):
    op = operator(topics="orders", sinks=[{"table_uri": "/data/{{ params.env }}/orders", **MERGE}])
    assert "sinks" in op.template_fields and op.sink_assets == ()  # not known before it is rendered
    op.render_template_fields({"params": {"env": "prod"}})
    assert op.sinks == [{"table_uri": "/data/prod/orders", **MERGE}]


def test_one_table_stays_as_it_was_and_what_does_not_fit_a_fan_out_is_refused(fan_out):
    single = operator(topics="orders", table_uri="/data/orders")
    assert not single.fans_out and single.asset == table_asset("/data/orders") and single.sink_assets == ()
    assert single.ingest_config().table_uri == "/data/orders"
    with pytest.raises(TypeError, match="missing keyword argument 'table_uri' \\(or sinks"):
        operator(topics="orders")
    with pytest.raises(ConfigError, match="with sinks or topic_pattern each table gets the Asset of its own"):
        operator(topics="orders", sinks=[{"table_uri": "/a"}], asset=table_asset("/a"))
    assert fan_out == []


def test_a_fan_out_summary_links_its_first_table_that_changed():
    result = FanOutResult(tables=(IngestResult(RunStatus.NOTHING_NEW, "o", "/data/a", "k"),
                                  IngestResult(RunStatus.COMMITTED, "o", "/data/b", "k", batch=2, version=5)))
    link = kafka_to_delta.summary_link(result.to_dict())
    assert link.startswith("file:///data/b#") and "batch=2" in link and "version=5" in link
