"""KafkaBacklogSensor: wait until Kafka holds at least ``min_records`` a table has not ingested.

Put it before :class:`~airflow_eo.operators.kafka_to_delta.KafkaToDeltaOperator` so a
DAG run does not start Spark for nothing. Deferrable by default: the waiting happens in
the triggerer (:class:`~airflow_eo.triggers.kafka_backlog.KafkaBacklogTrigger`), not in a
worker slot.

Example::

    wait = KafkaBacklogSensor(task_id="wait", topics=["orders"], table_uri="/data/orders",
                              ingest_id="orders_dag.ingest", min_records=1000, timeout=3600)
    wait >> KafkaToDeltaOperator(task_id="ingest", topics=["orders"], table_uri="/data/orders")
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from airflow.providers.common.compat.sdk import BaseSensorOperator

from airflow_eo.core.errors import AirflowEoError
from airflow_eo.hooks.kafka import kafka_config_of
from airflow_eo.hooks.storage import storage_options_of
from airflow_eo.spec import parse_option
from airflow_eo.triggers.kafka_backlog import KafkaBacklogTrigger, measure_backlog


class KafkaBacklogSensor(BaseSensorOperator):
    """Succeeds (returning the backlog per partition) once the backlog reaches ``min_records``.

    :param ingest_id: the ingest whose offsets count; default ``<dag_id>.ingest``, the
        operator's default for a task named ``ingest`` in the same DAG.
    :param min_records: backlog (in offsets) to wait for.
    :param starting_offsets: the operator's ``starting_offsets``: where partitions the table
        never read start counting (``latest`` waits for records produced from now on).
    :param storage_conn_id: the ``aws`` connection of an ``s3://`` table (as the operator's).
    :param adopt_table: the operator's ``adopt_table``: a table created elsewhere that this ingest has
        not written yet counts as one without offsets (its backlog from ``starting_offsets``), not
        as another ingest's table.
    :param deferrable: wait in the triggerer (default) instead of poking from a worker.
    """

    template_fields: Sequence[str] = ("topics", "table_uri", "ingest_id", "starting_offsets")

    def __init__(self, *, topics: list[str] | str, table_uri: str, ingest_id: str | None = None,
                 kafka_conn_id: str = "kafka_default", min_records: int = 1, deferrable: bool = True,
                 starting_offsets: object = "earliest", storage_conn_id: str | None = None,
                 adopt_table: bool = False, **kwargs):
        super().__init__(**kwargs)
        # the ingest whose backlog counts (templated, as the operator's options), its connections, the wait
        self.topics, self.table_uri, self.ingest_id = topics, table_uri, ingest_id
        self.starting_offsets = starting_offsets
        self.kafka_conn_id, self.storage_conn_id = kafka_conn_id, storage_conn_id
        self.min_records, self.deferrable = min_records, deferrable
        self.adopt_table = adopt_table

    def _topics(self) -> list[str]:
        return list(parse_option("topics", self.topics))

    def _ingest_id(self) -> str:
        return self.ingest_id or f"{self.dag_id}.ingest"

    def backlog(self) -> dict[str, int]:
        """The backlog per partition; a table another ingest owns fails without retry."""
        try:
            return self._measure()
        except AirflowEoError as exc:
            if exc.retryable:
                raise
            from airflow.providers.common.compat.sdk import AirflowFailException

            raise AirflowFailException(str(exc)) from exc

    def _measure(self) -> dict[str, int]:
        return measure_backlog(kafka_config_of(self.kafka_conn_id), self._topics(), self.table_uri,
                               self._ingest_id(), storage_options_of(self.storage_conn_id), self.starting_offsets,
                               self.adopt_table)

    def poke(self, context) -> bool:
        per_partition = self.backlog()
        total = sum(per_partition.values())
        self.log.info("backlog %d of %d wanted: %s", total, self.min_records, per_partition)
        return total >= self.min_records

    def execute(self, context):
        if not self.deferrable:
            return super().execute(context)
        per_partition = self.backlog()
        if sum(per_partition.values()) >= self.min_records:  # no need to wait in the triggerer
            return per_partition
        self.defer(
            trigger=KafkaBacklogTrigger(
                topics=self._topics(), table_uri=self.table_uri, ingest_id=self._ingest_id(),
                kafka_conn_id=self.kafka_conn_id, min_records=self.min_records,
                poll_interval=self.poke_interval, timeout=self.timeout,
                starting_offsets=self.starting_offsets, storage_conn_id=self.storage_conn_id,
                adopt_table=self.adopt_table,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def execute_complete(self, context, event: dict):
        if event.get("status") == "error":
            from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException

            raise (AirflowException if event.get("retryable") else AirflowFailException)(event["error"])
        if event.get("status") != "ready":
            from airflow.providers.common.compat.sdk import AirflowSensorTimeout, AirflowSkipException

            message = (f"backlog stayed at {event.get('backlog')} < {self.min_records} records for "
                       f"{self.timeout}s")
            if self.soft_fail:
                raise AirflowSkipException(message)
            raise AirflowSensorTimeout(message)
        self.log.info("backlog %s reached %s", event["backlog"], self.min_records)
        return event["per_partition"]
