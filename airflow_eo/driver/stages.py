"""Which Spark step stages a sink's batch: one registration per :class:`~airflow_eo.sinks.base.SinkKind`.

:func:`airflow_eo.driver.batch._stage_with_spark` runs the steps every batch takes (read, decode, the
transform, the table's rules, the dead letters, the late records) once, and asks the table's
:class:`~airflow_eo.driver.append.SparkStage` for what its write mode adds: the append's
(:mod:`airflow_eo.driver.append`, the base), dedup's (:class:`airflow_eo.driver.dedup.DedupStage`) and
merge's (:class:`airflow_eo.driver.merge.MergeStage`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_eo.attempt import Attempt
from airflow_eo.driver.append import SparkStage
from airflow_eo.sinks import Sink, SinkKind
from airflow_eo.table.features import TableFeatures
from airflow_eo.table.staging import StagingArea

if TYPE_CHECKING:
    from airflow_eo.driver.dead_letters import DeadLetters


def _stages() -> dict[SinkKind, type[SparkStage]]:
    # imported when a batch runs through Spark: the modules import pyspark's helpers
    from airflow_eo.driver.dedup import DedupStage
    from airflow_eo.driver.merge import MergeStage

    return {SinkKind.APPEND: SparkStage, SinkKind.DEDUP: DedupStage, SinkKind.MERGE: MergeStage}


def spark_stage(sink: Sink, attempt: Attempt, staging: StagingArea, features: TableFeatures,
                dead: "DeadLetters | None", storage_options: dict | None) -> SparkStage:
    """The Spark step of ``sink``'s kind."""
    return _stages()[sink.kind](attempt, staging, features, dead, storage_options)
