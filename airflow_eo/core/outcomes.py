"""Run statuses: what a run (and a commit) did, as the strings XCom, JSON and metrics carry."""

from __future__ import annotations

import enum


class RunStatus(str, enum.Enum):
    """A run's (or a commit's) status; ``str``-valued, so summaries keep the same strings."""

    COMMITTED = "committed"  # this run's attempt committed its batch
    ALREADY_COMMITTED = "already_committed"  # an earlier attempt (or run) committed it: nothing started or done twice
    NOTHING_NEW = "nothing_new"  # Kafka held nothing beyond the table's offsets
    REPROCESSED = "reprocessed"  # this run replaced a committed batch's rows
    ALREADY_REPROCESSED = "already_reprocessed"  # a retry found its reprocess committed

    def __str__(self) -> str:  # the value, not "RunStatus.COMMITTED", in messages and f-strings
        return self.value

    @property
    def wrote_commit(self) -> bool:
        """Whether the run made a commit of its own (what metrics count and Asset events announce)."""
        return self in (RunStatus.COMMITTED, RunStatus.REPROCESSED)
