"""What an Airflow user meets around a run: fail-fast vs retried errors, metrics, OpenLineage.

Real broker, real Delta, real planning and the real job (``run_recorded_attempt``) run by a
stand-in for SparkSubmitHook that fails the way the real hook does: with only an exit code
(and the command line) in its exception, so the job's own error must cross back by itself.
"""

from __future__ import annotations

import json

import pytest
from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException
from deltalake import DeltaTable
from openlineage.client.serde import Serde

from airflow_eo.core.errors import (
    ConfigError, SparkJobError,
)
from tests.helpers import new_topic, produce
from tests.integration.operators.conftest import InProcessHook, context_for, make_operator, spark_submit_hooks


class ExitCodeHook(InProcessHook):
    """Like SparkSubmitHook: a failed job surfaces as 'Cannot execute: <cmd>. Error code is: 1.'"""

    def submit(self, application):
        try:
            super().submit(application)
        except Exception:
            raise AirflowException(f"Cannot execute: ['spark-submit', '{application}', '--secret-ish']. "
                                   "Error code is: 1.") from None


@pytest.fixture
def exit_code_hooks(hooks, monkeypatch):
    monkeypatch.setattr(spark_submit_hooks, "SparkSubmitHook", ExitCodeHook)
    return hooks


def test_a_config_error_inside_the_spark_job_fails_the_task_without_retry(exit_code_hooks, kafka_env,
                                                                           kafka_config, table_uri):
    topic = new_topic(kafka_config)
    produce(kafka_config, topic, 5)
    op = make_operator("unit_err", table_uri, topic, kafka_env, transform_sql="SELECT no_such_column FROM source")
    with pytest.raises(AirflowFailException) as failed:
        op.execute(context_for(op, "manual__1"))
    message = str(failed.value)
    # the job's own error, as one line: not the hook's command line or exit code
    assert message.startswith("transform_sql failed") and "Cannot execute" not in message
    assert "\n" not in message and isinstance(failed.value.__cause__, ConfigError)
    assert not DeltaTable.is_deltatable(table_uri)  # nothing committed
    assert op.summary is None


def test_nothing_to_reprocess_fails_without_retry(hooks, kafka_env, kafka_config, table_uri):
    topic = new_topic(kafka_config)
    op = make_operator("unit_rep", table_uri, topic, kafka_env)
    with pytest.raises(AirflowFailException, match="nothing to reprocess"):
        op.execute(context_for(op, "never_ran", params={"reprocess": True}))
    assert hooks == []


def test_a_job_killed_before_it_reports_is_retried_with_its_exit_code_not_its_command_line(
        exit_code_hooks, kafka_env, kafka_config, table_uri, monkeypatch):
    topic = new_topic(kafka_config)
    produce(kafka_config, topic, 5)
    monkeypatch.setattr(ExitCodeHook, "submit", lambda self, app: (_ for _ in ()).throw(
        AirflowException(f"Cannot execute: ['spark-submit', '{app}']. Error code is: 137.")))
    op = make_operator("unit_kill", table_uri, topic, kafka_env)
    with pytest.raises(SparkJobError) as failed:  # retryable: not an AirflowFailException
        op.execute(context_for(op, "manual__1"))
    assert "spark-submit exited with code 137" in str(failed.value) and "Cannot execute" not in str(failed.value)


def test_metrics_and_openlineage_of_a_committed_run(hooks, kafka_env, kafka_config, table_uri, monkeypatch):
    calls = []

    class Recorder:  # Airflow's Stats, at its boundary
        def __getattr__(self, kind):
            return lambda name, value, tags=None: calls.append((kind, name, value, tags))

    monkeypatch.setattr("airflow_eo.operators.metrics._stats", Recorder)
    topic = new_topic(kafka_config)
    produce(kafka_config, topic, 12)
    op = make_operator("unit_metrics", table_uri, topic, kafka_env, ingest_id="orders_metrics")
    summary = op.execute(context_for(op, "manual__1"))

    tagged = {name: (kind, value, tags) for kind, name, value, tags in calls if tags}
    assert tagged["airflow_eo.records_committed"][:2] == ("incr", 12)
    assert tagged["airflow_eo.bytes_committed"][1] == summary["bytes"] > 0
    assert tagged["airflow_eo.lag"][:2] == ("gauge", 0)
    assert tagged["airflow_eo.batch_duration"][0] == "timing"
    assert tagged["airflow_eo.runs"][2] == {"table": table_uri, "ingest_id": "orders_metrics", "status": "committed"}
    assert ("incr", "airflow_eo.orders_metrics.records_committed", 12, None) in calls

    lineage = op.get_openlineage_facets_on_complete(None)
    host, port = kafka_config["bootstrap.servers"].split(",")[0].rsplit(":", 1)
    assert [(d.namespace, d.name) for d in lineage.inputs] == [(f"kafka://{host}:{port}", topic)]
    (out,) = lineage.outputs
    assert (out.namespace, out.name) == ("file", table_uri)
    assert [f.name for f in out.facets["schema"].fields] == ["topic", "partition", "offset", "body"]
    assert out.outputFacets["outputStatistics"].rowCount == 12
    facet = json.loads(Serde.to_json(lineage.run_facets["airflow_eo"]))
    assert facet["batch"] == 1 and facet["version"] == summary["version"]
    assert facet["ranges"] == summary["ranges"] and sum(r["end"] - r["start"] for r in facet["ranges"]) == 12
    # a run that committed nothing: no output statistics, its status in the facet
    calls.clear()
    again = op.execute(context_for(op, "manual__2"))
    assert again["status"] == "nothing_new"
    assert not [c for c in calls if c[1] == "airflow_eo.records_committed"]
    lineage = op.get_openlineage_facets_on_failure(None)
    assert "outputStatistics" not in lineage.outputs[0].outputFacets
    assert lineage.run_facets["airflow_eo"].status == "nothing_new"
