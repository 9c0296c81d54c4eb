"""The dedup sink (``write_mode="append"`` with ``dedup_key``): an append that drops records whose
producer key is already in the table or earlier in the batch.

It commits with the append sink's rules; what differs is its Spark step
(:class:`airflow_eo.driver.dedup.DedupStage`: keys read from the table, duplicates dropped or sent to
the dead letters), the duplicates its commit records, and what its table is used for (its rows' keys
are read: :attr:`~airflow_eo.table.features.TableUse.DEDUP`).
"""

from __future__ import annotations

from airflow_eo.attempt import Attempt
from airflow_eo.sinks.append import AppendSink
from airflow_eo.table.features import TableUse
from airflow_eo.table.metadata import BatchFindings, DeadLetterManifest, Duplicates, LateRecords


class DedupSink(AppendSink):
    """``dedup_key``: see the module."""

    kind = "dedup"
    stage = "airflow_eo.driver.dedup:DedupStage"
    use = TableUse.DEDUP
    direct = False  # keys are computed and looked up in Spark

    @property
    def sends_dead_letters(self) -> bool:
        return self.spec.dedup.to_dead_letters  # dropped duplicates, when asked

    def findings(self, attempt: Attempt, dead_letters: DeadLetterManifest | None = None, dropped: int | None = None,
                 late: LateRecords | None = None, reader_schemas=()) -> BatchFindings:
        """Also the duplicates it dropped (zero for a batch that measured none: an empty one)."""
        duplicates = Duplicates(dropped or 0, self.spec.dedup.to_dead_letters)
        return BatchFindings.of(attempt, dead_letters, duplicates, late, reader_schemas)
