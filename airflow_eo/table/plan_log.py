"""The plan log: a run's choices, written beside the table before Spark starts.

"Read up to the current end offset" is a nondeterministic choice: a retry made later
would see a different end. Logging the plan under the run's stable key before any data
is read lets every retry or clear of that run replay exactly the same ranges. The same
holds for a reprocess request (which batch, from which reprocess counter). The logs live
with the table (``<table>/_airflow_eo/plans/``, ``…/reprocess/``), so they survive task
retries, Airflow clears (which drop XCom) and worker loss.

Example::

    >>> plans = PlanLog(TableLocation.of("/data/orders"))           # doctest: +SKIP
    >>> plans.record(plan); plans.load(plan.run.run_key) == plan   # doctest: +SKIP
    True
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass

from airflow_eo.core.planning import BatchPlan
from airflow_eo.table.storage import TableLocation

log = logging.getLogger(__name__)

PLANS_DIR = "_airflow_eo/plans"
REPROCESS_DIR = "_airflow_eo/reprocess"


class _KeyedLog:
    """Small JSON documents beside the table, one per run key (atomic replace)."""

    directory = ""

    def __init__(self, location: TableLocation):
        self.loc = location

    def path(self, run_key: str) -> str:
        digest = hashlib.sha256(run_key.encode()).hexdigest()[:32]
        return self.loc.join(self.directory, f"{digest}.json")

    def _write(self, run_key: str, text: str) -> None:
        if run_key:  # one-off runs have nothing to replay
            self.loc.write_text(self.path(run_key), text)

    def _read(self, run_key: str) -> str | None:
        return self.loc.read_text(self.path(run_key)) if run_key else None


class PlanLog(_KeyedLog):
    directory = PLANS_DIR

    def record(self, plan: BatchPlan) -> None:
        """Log a plan before anything of it is read (replaces a stale plan of the run)."""
        self._write(plan.run.run_key, plan.to_json())
        if plan.run.run_key:
            log.info("logged plan of batch %s for run %s", plan.batch, plan.run.run_key)

    def load(self, run_key: str) -> BatchPlan | None:
        text = self._read(run_key)
        if text is None:
            return None
        try:
            return BatchPlan.from_json(text)
        except (ValueError, KeyError, TypeError):
            # A torn write means Spark never started for it: planning anew is safe.
            log.warning("ignoring unreadable plan log entry for run %s", run_key)
            return None


@dataclass(frozen=True)
class ReprocessRequest:
    """A reprocess asked for by ``requester_key``; replayed by that key's retries until done."""

    requester_key: str
    target_run_key: str
    batch: int
    from_version: int
    done: bool = False


class ReprocessLog(_KeyedLog):
    """Pending reprocess requests, one per requesting run key."""

    directory = REPROCESS_DIR

    def record(self, request: ReprocessRequest) -> None:
        self._write(request.requester_key, json.dumps(asdict(request)))

    def load(self, requester_key: str) -> ReprocessRequest | None:
        text = self._read(requester_key)
        try:
            return ReprocessRequest(**json.loads(text)) if text else None
        except (ValueError, TypeError):
            return None
