"""The Python Data Source reader of a plan's ranges, kept to compare against the package's reader.

The package reads with ``mapInArrow`` over a one-row-per-slice DataFrame
(:func:`airflow_eo.driver.source.read_plan`). This reader reads the same slices with the same
:func:`airflow_eo.driver.reader.read_range` through a PySpark Python Data Source (format
``airflow_eo_kafka``), which Spark plans with three Python workers of its own per session;
``benchmarks/bench_warm.py`` measures both (docs/performance.md, "The read").

This module is not importable in Spark's Python workers (``benchmarks/`` is not installed), so
cloudpickle sends its classes by value.

Example::

    >>> df = read_with_data_source(spark, plan.data_ranges, {"bootstrap.servers": "127.0.0.1:9092"},
    ...                            1_000_000)                                            # doctest: +SKIP
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Iterable, Iterator

from pyspark import cloudpickle
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from airflow_eo.attempt import DEFAULT_MAX_OFFSETS_PER_TASK
from airflow_eo.compat import flag_session, session_flagged
from airflow_eo.planning import OffsetRange, read_slices

SOURCE_NAME = "airflow_eo_kafka"
KAFKA_OPTION_PREFIX = "kafka."
REGISTERED = "_airflow_eo_source"  # the flag on a session that has the source registered

cloudpickle.register_pickle_by_value(sys.modules[__name__])


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
    if not session_flagged(spark, REGISTERED):
        spark.dataSource.register(KafkaRangeSource)
        flag_session(spark, REGISTERED)


def read_with_data_source(spark, ranges: Iterable[OffsetRange], kafka_config: dict, max_offsets_per_task: int):
    """The records of ``ranges`` through the Python Data Source."""
    register(spark)
    options = source_options(ranges, kafka_config, max_offsets_per_task)
    return spark.read.format(SOURCE_NAME).options(**options).load()
