"""The Kafka source: a PySpark Python Data Source that reads a planned set of offset ranges.

Spark's own Kafka source (spark-sql-kafka) is a JVM jar that cannot be installed on the
machines this project targets, and it plans its own offsets. This source reads exactly
the ranges of a :class:`~airflow_eo.planning.BatchPlan`, nothing more: each input
partition is one slice of a range, read by one Spark task with ``read_committed``.

Example::

    >>> register(spark)                                                    # doctest: +SKIP
    >>> df = (spark.read.format(SOURCE_NAME)
    ...       .option("ranges", json.dumps([asdict(r) for r in plan.data_ranges]))
    ...       .option("kafka.bootstrap.servers", "127.0.0.1:9092").load())  # doctest: +SKIP
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Iterable, Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from airflow_eo.attempt import DEFAULT_MAX_OFFSETS_PER_TASK
from airflow_eo.planning import OffsetRange, split_range

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
        pieces = [p for r in self.ranges for p in split_range(r, self.max_per_task)]
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
    if not getattr(spark, "_airflow_eo_source", False):
        spark.dataSource.register(KafkaRangeSource)
        spark._airflow_eo_source = True


def read_plan(spark, ranges: Iterable[OffsetRange], kafka_config: dict, max_offsets_per_task: int):
    """A DataFrame of exactly the records of ``ranges`` (read_committed)."""
    register(spark)
    options = source_options(ranges, kafka_config, max_offsets_per_task)
    return spark.read.format(SOURCE_NAME).options(**options).load()

