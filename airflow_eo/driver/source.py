"""The Kafka source: a DataFrame of exactly a plan's offset ranges, read by Spark tasks.

Spark's own Kafka source (spark-sql-kafka) is a JVM jar that cannot be installed on the
machines this project targets, and it plans its own offsets. The reader here reads exactly
the ranges of a :class:`~airflow_eo.planning.BatchPlan`, nothing more: ``mapInArrow`` over a
one-row-per-slice range DataFrame, each Spark task reading one slice of a range
(:func:`~airflow_eo.planning.split_range`) with ``read_committed`` through
:func:`airflow_eo.driver.reader.read_range`, which yields Arrow batches. It needs no Python
planning workers, so a warm Spark Connect server starts reading at once; a PySpark Python
Data Source reading the same slices was slower to plan and is kept only in
``benchmarks/datasource.py`` for the comparison (README "Performance").

Example::

    >>> df = read_plan(spark, plan.data_ranges, {"bootstrap.servers": "127.0.0.1:9092"}, 1_000_000)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Iterable

from airflow_eo.planning import OffsetRange, read_slices


def _slice_reader(slices: list[OffsetRange], kafka_config: dict, decoder=None):
    """The function each Spark task runs (pickled to the Python workers): row ``i`` of the
    range DataFrame means "read slice ``i``"; a ``decoder`` decodes each batch right there."""

    def read(batches):
        from airflow_eo.driver.reader import read_range  # imported in the executor's Python worker

        for batch in batches:
            for i in batch.column(0).to_pylist():
                for records in read_range(kafka_config, slices[i]):
                    yield records if decoder is None else decoder(records)

    return read


def read_with_map_in_arrow(spark, ranges: Iterable[OffsetRange], kafka_config: dict, max_offsets_per_task: int,
                           decoder=None):
    """The records of ``ranges`` through ``mapInArrow``: one task per slice. The client config
    travels inside the pickled task function, never as a plan option or a column."""
    from airflow_eo.driver.reader import SPARK_KAFKA_SCHEMA, spark_kafka_struct

    from airflow_eo.driver.session import for_session

    slices = read_slices(ranges, max_offsets_per_task)
    schema = SPARK_KAFKA_SCHEMA if decoder is None else decoder.schema(spark_kafka_struct())
    with for_session(spark):
        tasks = spark.range(0, len(slices), 1, max(1, len(slices)))  # row i alone in partition i
        return tasks.mapInArrow(_slice_reader(slices, dict(kafka_config), decoder), schema)


def read_plan(spark, ranges: Iterable[OffsetRange], kafka_config: dict, max_offsets_per_task: int, decoder=None):
    """A DataFrame of exactly the records of ``ranges`` (read_committed); with a ``decoder``
    (:class:`airflow_eo.driver.avro.AvroDecoder`) each batch is decoded by the task that read it."""
    return read_with_map_in_arrow(spark, list(ranges), kafka_config, max_offsets_per_task, decoder)
