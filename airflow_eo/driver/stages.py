"""Which Spark step stages a sink's batch: the one its sink names (:attr:`~airflow_eo.sinks.base.Sink.stage`).

:func:`airflow_eo.driver.batch._stage_with_spark` runs the steps every batch takes (read, decode, the
transform, the table's rules, the dead letters, the late records) once, and asks the table's
:class:`~airflow_eo.driver.append.SparkStage` for what its write mode adds: the append's
(:mod:`airflow_eo.driver.append`, the base), dedup's (:class:`airflow_eo.driver.dedup.DedupStage`) and
merge's (:class:`airflow_eo.driver.merge.MergeStage`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from airflow_eo.attempt import Attempt
from airflow_eo.driver.append import SparkStage
from airflow_eo.sinks import Sink
from airflow_eo.table.features import TableFeatures
from airflow_eo.table.staging import StagingArea

if TYPE_CHECKING:
    from airflow_eo.driver.dead_letters import DeadLetters


def stage_class(sink: Sink) -> type[SparkStage]:
    """The Spark step ``sink`` names, imported when a batch runs through Spark (its module imports pyspark's
    helpers)."""
    module, _, name = sink.stage.partition(":")
    stage = getattr(importlib.import_module(module), name)
    assert isinstance(stage, type) and issubclass(stage, SparkStage), f"{sink.stage} is no SparkStage"
    return stage


def spark_stage(sink: Sink, attempt: Attempt, staging: StagingArea, features: TableFeatures,
                dead: "DeadLetters | None", storage_options: dict | None) -> SparkStage:
    """The Spark step of ``sink``."""
    return stage_class(sink)(attempt, staging, features, dead, storage_options)
