"""Testing a DAG that ingests with airflow-eo, as a user does: only the pytest plugin's fixtures
(``kafka_broker``, ``kafka_topic``, ``delta_table``, ``airflow_dag_runner``) and its assertions.

This file is the complete example of docs/how-to/testing.md (the page includes it as it is), and
runs in the integration lane: the embedded broker, spark-submit on local[2], a real Delta table
(local, and one in the local S3 stand-in), Airflow's ``dag.test()``.
"""

import pytest

from airflow_eo.testing import assert_exactly_once, assert_last_write_per_key
from tests.integration.testing.orders_dag import orders_dag


@pytest.mark.parametrize("delta_table", ["local", "s3"], indirect=True)
def test_every_order_lands_once(kafka_broker, kafka_topic, delta_table, airflow_dag_runner):
    kafka_broker.produce_keyed(kafka_topic, {f"o{i}": {"amount": i} for i in range(20)})
    kafka_broker.produce_transaction(kafka_topic, [{"amount": 100}], keys=["o100"])
    kafka_broker.produce_transaction(kafka_topic, [{"amount": -1}] * 5, keys=["bad"] * 5, abort=True)

    dag = orders_dag(kafka_topic, delta_table.uri, storage_conn_id=delta_table.storage_conn_id)
    outcome = airflow_dag_runner.run(dag)

    assert outcome.state("ingest") == "success"
    assert outcome.xcom("ingest")["rows"] == 21
    # every committed record once, nothing of the aborted transaction, offsets at the topic's end
    assert_exactly_once(delta_table, kafka_broker, [kafka_topic], ingest_id="orders", caught_up=True)


def test_a_driver_killed_before_its_commit_is_retried_without_loss_or_duplicates(
        kafka_broker, kafka_topic, delta_table, airflow_dag_runner):
    kafka_broker.produce(kafka_topic, [{"amount": i} for i in range(30)], keys=[f"o{i}" for i in range(30)])
    dag = orders_dag(kafka_topic, delta_table.uri)

    outcome = airflow_dag_runner.run(dag, fail_at="before_commit")  # once: the retry is not killed

    assert outcome.fault_fired and outcome.state("ingest") == "success" and outcome.try_number("ingest") == 2
    assert_exactly_once(delta_table, kafka_broker, [kafka_topic], ingest_id="orders", caught_up=True)


def test_a_merge_table_holds_each_orders_last_change(kafka_broker, kafka_topic, delta_table, airflow_dag_runner):
    kafka_broker.produce_keyed(kafka_topic, [("o1", {"amount": 1}), ("o2", {"amount": 2}), ("o1", {"amount": 10})])
    kafka_broker.produce_keyed(kafka_topic, [("o2", None)])  # a tombstone: order o2 is deleted
    dag = orders_dag(kafka_topic, delta_table.uri, write_mode="merge")

    assert airflow_dag_runner.run(dag).state("ingest") == "success"

    assert_last_write_per_key(
        delta_table, kafka_broker, [kafka_topic], ingest_id="orders", key_columns=["order_id"],
        key_of=lambda record: record.key.decode(),
        row_of=lambda record: {"order_id": record.key.decode(), "amount": record.json()["amount"]})
    assert delta_table.read(["order_id", "amount"]).to_pylist() == [{"order_id": "o1", "amount": 10.0}]
