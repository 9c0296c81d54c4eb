"""The append sink's Spark step, the base of every write mode's (:mod:`airflow_eo.driver.stages`).

:func:`airflow_eo.driver.batch._stage_with_spark` asks it for what a write mode adds to the steps every
batch takes: before the transform (:meth:`SparkStage.source`: dedup drops repeated keys, merge builds its
change view), after it (:meth:`SparkStage.output`), the write (:meth:`SparkStage.write`: Spark's Parquet
writer, or a merge's winners and rewritten files) and what the sink's commit rule takes beside the files
(:attr:`SparkStage.extra`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from airflow_eo.attempt import Attempt
from airflow_eo.table.features import TableFeatures
from airflow_eo.table.staging import StagingArea
from airflow_eo.table.files import StagedFile

if TYPE_CHECKING:
    from airflow_eo.driver.dead_letters import DeadLetters


class SparkStage:
    """An append's Spark step: the transform's output staged by Spark's Parquet writer."""

    def __init__(self, attempt: Attempt, staging: StagingArea, features: TableFeatures,
                 dead: "DeadLetters | None", storage_options: dict | None):
        self.attempt, self.staging, self.features = attempt, staging, features
        self.dead, self.storage_options = dead, storage_options
        self.extra: Any = None  # what the sink's commit rule takes beside the files
        self.notes: list[str] = []  # what the step reports once the batch is staged (one line each)

    def source(self, source):
        """The decoded records as the transform sees them."""
        return source

    def output(self, out):
        """The transform's output as the table's rules see it, and the rows that delete (None: none do)."""
        return out, None

    def arrow_schema(self, out) -> pa.Schema:
        """The columns the staged files hold."""
        from airflow_eo.compat import arrow_schema_of

        return arrow_schema_of(out.schema)

    def write(self, out, arrow_schema: pa.Schema, stage) -> list[StagedFile]:
        """Stage the rows (``stage``: :func:`airflow_eo.driver.writer.stage`); under column mapping the
        files hold physical names and field ids."""
        return stage(out, self.staging.loc, self.staging.attempt_path(self.attempt.plan), self.storage_options,
                     arrow_schema, self.attempt.partition_by, self.features.names)

    def rows(self, files: list[StagedFile]) -> dict[str, int]:
        return self.staging.rows_per_partition(files, self.features.names)

    def late_inputs(self, arrow_schema: pa.Schema, source) -> tuple[pa.Schema, Any]:
        """What interval mode counts late records over: the files' columns (the partition columns
        are in their paths) and, where the files cannot say, the records."""
        return pa.schema([f for f in arrow_schema if f.name not in self.attempt.partition_by]), source

    def dropped(self, planned_offsets: int) -> int | None:
        """Records the step dropped (None: it drops none)."""
        return None

    def release(self) -> None:
        """Leave nothing behind in the session (cached rows)."""
