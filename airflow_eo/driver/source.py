"""The Kafka source: a DataFrame of exactly a plan's offset ranges, read by Spark tasks.

Spark's own Kafka source (spark-sql-kafka) is a JVM jar that cannot be installed on the
machines this project targets, and it plans its own offsets. Both readers here read exactly
the ranges of a :class:`~airflow_eo.planning.BatchPlan`, nothing more: each Spark task reads
one slice of a range (:func:`~airflow_eo.planning.split_range`) with ``read_committed``
through :func:`airflow_eo.driver.reader.read_range`, which yields Arrow batches.

* ``arrow`` (the default, :func:`read_with_map_in_arrow`): ``mapInArrow`` over a one-row-per-
  slice range DataFrame. Cheapest to plan: no Python planning workers, so a warm Spark Connect
  server starts reading at once (benchmark: README "Performance").
* ``datasource`` (:class:`KafkaRangeSource`): a PySpark Python Data Source, format
  ``airflow_eo_kafka``; Spark plans it with three Python workers of its own per session.

Example::

    >>> df = read_plan(spark, plan.data_ranges, {"bootstrap.servers": "127.0.0.1:9092"}, 1_000_000)  # doctest: +SKIP
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Iterable, Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from airflow_eo.attempt import DEFAULT_MAX_OFFSETS_PER_TASK
from airflow_eo.planning import OffsetRange, read_slices

SOURCE_NAME = "airflow_eo_kafka"
KAFKA_OPTION_PREFIX = "kafka."


def source_options(
    ranges: Iterable[OffsetRange], kafka_config: dict[str, object],
    max_offsets_per_task: int = DEFAULT_MAX_OFFSETS_PER_TASK,
) -> dict[str, str]:
    """Reader options for a plan. Client settings travel as ``kafka.*`` options so that
    Spark's option redaction (``spark.redaction.regex``) hides secrets in plans and UIs."""
    options = {
        "ranges": json.dumps([asdict(r) for r in ranges]),
        "maxOffsetsPerTask": str(max_offsets_per_task),
    }
    options.update({KAFKA_OPTION_PREFIX + k: str(v) for k, v in kafka_config.items()})
    return options


class RangePartition(InputPartition):
    def __init__(self, r: OffsetRange):
        super().__init__(r)
        self.range = r


class KafkaRangeReader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        # Spark hands option keys over lower-cased.
        self.ranges = [OffsetRange(**r) for r in json.loads(options["ranges"])]
        self.max_per_task = int(options.get("maxoffsetspertask", DEFAULT_MAX_OFFSETS_PER_TASK))
        self.kafka_config = {
            k[len(KAFKA_OPTION_PREFIX):]: v for k, v in options.items() if k.startswith(KAFKA_OPTION_PREFIX)
        }

    def partitions(self) -> list[RangePartition]:
        pieces = read_slices(self.ranges, self.max_per_task)
        return [RangePartition(p) for p in pieces] or [RangePartition(OffsetRange("", 0, 0, 0))]

    def read(self, partition: RangePartition) -> Iterator:
        from airflow_eo.driver.reader import read_range  # imported in the executor's Python worker

        yield from read_range(self.kafka_config, partition.range)


class KafkaRangeSource(DataSource):
    """``spark.read.format("airflow_eo_kafka")``: options ``ranges`` and ``kafka.*``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        from airflow_eo.driver.reader import SPARK_KAFKA_SCHEMA

        return SPARK_KAFKA_SCHEMA

    def reader(self, schema) -> KafkaRangeReader:
        return KafkaRangeReader(self.options)


def register(spark) -> None:
    """Register the source once per SparkSession."""
    from airflow_eo.compat import flag_session, session_flagged

    if not session_flagged(spark, "_airflow_eo_source"):
        spark.dataSource.register(KafkaRangeSource)
        flag_session(spark, "_airflow_eo_source")


def read_with_data_source(spark, ranges: Iterable[OffsetRange], kafka_config: dict, max_offsets_per_task: int):
    """The records of ``ranges`` through the Python Data Source."""
    register(spark)
    options = source_options(ranges, kafka_config, max_offsets_per_task)
    return spark.read.format(SOURCE_NAME).options(**options).load()


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


READERS = {"arrow": read_with_map_in_arrow, "datasource": read_with_data_source}
DEFAULT_READER = "arrow"


def read_plan(spark, ranges: Iterable[OffsetRange], kafka_config: dict, max_offsets_per_task: int,
              reader: str = DEFAULT_READER, decoder=None):
    """A DataFrame of exactly the records of ``ranges`` (read_committed); with a ``decoder``
    (:class:`airflow_eo.driver.avro.AvroDecoder`) each batch is decoded by the task that read it."""
    if reader == "arrow":
        return read_with_map_in_arrow(spark, list(ranges), kafka_config, max_offsets_per_task, decoder)
    df = READERS[reader](spark, list(ranges), kafka_config, max_offsets_per_task)
    return df if decoder is None else decoder.apply(df)

