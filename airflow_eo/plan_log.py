"""The plan log: a run's plan, written beside the table before Spark starts.

"Read up to the current end offset" is a nondeterministic choice: a retry made later
would see a different end. Logging the plan under the run's stable key before any data
is read lets every retry or clear of that run replay exactly the same ranges. The log
lives with the table (``<table>/_airflow_eo/plans/``), so it survives task retries,
Airflow clears (which drop XCom) and worker loss.

Example::

    >>> plans = PlanLog(TableLocation.of("/data/orders"))           # doctest: +SKIP
    >>> plans.record(plan); plans.load(plan.run.run_key) == plan   # doctest: +SKIP
    True
"""

from __future__ import annotations

import hashlib
import logging

from airflow_eo.planning import BatchPlan
from airflow_eo.storage import TableLocation

log = logging.getLogger(__name__)

PLANS_DIR = "_airflow_eo/plans"


class PlanLog:
    def __init__(self, location: TableLocation):
        self.loc = location

    def path(self, run_key: str) -> str:
        digest = hashlib.sha256(run_key.encode()).hexdigest()[:32]
        return self.loc.join(PLANS_DIR, f"{digest}.json")

    def record(self, plan: BatchPlan) -> None:
        """Log a plan before anything of it is read (replaces a stale plan of the run)."""
        if not plan.run.run_key:
            return  # one-off runs have nothing to replay
        self.loc.write_text(self.path(plan.run.run_key), plan.to_json())
        log.info("logged plan of batch %s for run %s", plan.batch, plan.run.run_key)

    def load(self, run_key: str) -> BatchPlan | None:
        if not run_key:
            return None
        text = self.loc.read_text(self.path(run_key))
        if text is None:
            return None
        try:
            return BatchPlan.from_json(text)
        except (ValueError, KeyError, TypeError):
            # A torn write means Spark never started for it: planning anew is safe.
            log.warning("ignoring unreadable plan log entry for run %s", run_key)
            return None
