"""The table's lease: runs of one table take turns *before* they plan, not after Spark.

A run (an ingest, a reprocess, maintenance) holds its table's lease from planning to the end of
its verify step; a run that finds it held waits (logging every 30 s who holds it), at most
``table_wait_timeout``, and then plans from the table as it is. The lease is never needed for
correctness: the compare-and-set commit stays the guard, so a run that stopped waiting, a run of
an earlier version that takes no lease, or two holders after a wrong takeover still cannot lose
or duplicate a record; the lease only keeps runs from doing work that would lose its commit.

Where it lives: a small Delta log of its own beside the table (``<table>/_airflow_eo/lease``, no
data files), one commit per change: taken, renewed, released. deltalake writes each version
*if absent*, as it writes a table's commits (an atomic rename-if-absent on local paths, a
conditional put on S3, which :func:`airflow_eo.table.storage.check_commit_safety` already
requires; the other stores deltalake supports have their own put-if-absent), and every lease commit
is made on the version it read (``max_commit_retries=0``): of two runs that take a free lease
from the same version one lands, the other's commit fails and it reads the lease again. The
newest commit's metadata (:data:`LEASE_KEY`) names the holder (:class:`LeaseHolder`); a
checkpoint every few commits and a short log retention keep the log small.

Who may take it: nobody holds it (never taken, or released), or its holder is dead by the one
liveness rule (:func:`airflow_eo.table.liveness.liveness`): the holder's process ran on this host
and is gone (and the attempt it started is not running, e.g. a spark-submit job that outlived
it), or it ran on another host and has not renewed the lease for ``staging_grace_seconds``; or
the holder is an earlier try of the same run key (Airflow runs one try of a run at a time).
While it holds the lease a run renews it in the background (:meth:`HeldLease.renew`) and
records the attempt it started, which ``airflow-eo status`` and the UI page show.

One lease per table: a table holds one ingest id (:meth:`airflow_eo.table.ledger.Ledger.check_owner`),
whose runs, reprocesses and maintenance all queue on it.

Example::

    >>> lease = TableLease(TableLocation.of("/data/orders"))                                  # doctest: +SKIP
    >>> held = lease.wait(Claim(LeasePurpose.INGEST, "dag/run/ingest/-1", "orders"), timeout=900)  # doctest: +SKIP
    >>> lease.holder().run_key                                                                 # doctest: +SKIP
    'dag/run/ingest/-1'
"""

from __future__ import annotations

import enum
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone

from deltalake import DeltaTable, Field, Schema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.schema import PrimitiveType
from deltalake.transaction import CommitProperties, create_table_with_add_actions

from airflow_eo.spec import DEFAULT_GRACE_SECONDS
from airflow_eo.table.liveness import Liveness, ProcessId, liveness, renew_every
from airflow_eo.table.storage import TableLocation

log = logging.getLogger(__name__)

LEASE_DIR = "_airflow_eo/lease"
LEASE_KEY = "airflow_eo.lease"  # the commitInfo key naming the holder
WAIT_LOG_SECONDS = 30.0
# The lease log: a checkpoint every few commits, and commits older than an hour (and a checkpoint)
# removed after the next one, so reading it stays one small listing however long the table lives.
_LOG_CONFIGURATION = {"delta.checkpointInterval": "10", "delta.logRetentionDuration": "interval 1 hours",
                      "delta.enableExpiredLogCleanup": "true"}
_SCHEMA = Schema([Field("holder", PrimitiveType("string"), nullable=True)])  # a Delta log needs one; no rows
LEASE_ERRORS = (DeltaError, OSError, ValueError, KeyError, TypeError)  # what reading or writing it may raise


class LeasePurpose(str, enum.Enum):
    """What the holder does with the table."""

    INGEST = "ingest"
    REPROCESS = "reprocess"
    MAINTAIN = "maintain"


def iso_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Claim:
    """Who asks for the lease: what for, the run (its stable key) and the ingest."""

    purpose: LeasePurpose
    run_key: str
    ingest_id: str = ""


@dataclass(frozen=True)
class LeaseHolder:
    """One holding of the lease, as its commit records it (no secrets: a run key, a host, a PID)."""

    token: str  # this holding's own id: renewals and the release name it
    purpose: LeasePurpose
    run_key: str
    ingest_id: str
    host: str
    pid: int
    pid_started: float
    since: float  # epoch seconds: when it was taken
    renewed_at: float
    attempt_id: str = ""  # the attempt it started, once it has
    released_at: float | None = None

    @classmethod
    def of(cls, claim: Claim, now: float | None = None) -> "LeaseHolder":
        me, now = ProcessId.current(), time.time() if now is None else now
        return cls(uuid.uuid4().hex[:16], claim.purpose, claim.run_key, claim.ingest_id, me.host, me.pid, me.started,
                   now, now)

    # what the liveness rule reads (airflow_eo.table.liveness.Marker): renewals restart its clock
    @property
    def started_at(self) -> float:
        return self.renewed_at

    @property
    def ended_at(self) -> float | None:
        return self.released_at

    @property
    def submitter(self) -> ProcessId:
        return ProcessId(self.host, self.pid, self.pid_started)

    @property
    def driver(self) -> ProcessId:
        return ProcessId("", 0)  # the attempt's driver is in its marker (TableLease.holder looks there)

    def describe(self) -> str:
        attempt = f", attempt {self.attempt_id}" if self.attempt_id else ""
        return f"{self.purpose.value} run {self.run_key or '(no run key)'}{attempt} on {self.host} pid {self.pid} " \
               f"since {iso_time(self.since)}"

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "purpose": self.purpose.value})

    @classmethod
    def from_json(cls, text: str) -> "LeaseHolder":
        raw = json.loads(text)
        raw = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}  # a later version's additions
        return cls(**{**raw, "purpose": LeasePurpose(raw["purpose"])})


class TableLease:
    """The lease of one table (see the module doc)."""

    def __init__(self, location: TableLocation, storage_options: dict | None = None,
                 grace_seconds: float = DEFAULT_GRACE_SECONDS, check_first: Callable[[], object] | None = None):
        """``check_first``: called before the lease's log is created (a table's first lease), to
        refuse a path that is not this ingest's table before anything is written there."""
        self.location, self.storage_options, self.grace_seconds = location, storage_options, grace_seconds
        self.check_first = check_first
        self.uri = f"{location.uri.rstrip('/')}/{LEASE_DIR}"
        self._table: DeltaTable | None = None  # the lease's log as last read (brought up to date, not opened again)

    # -- reading ------------------------------------------------------------------------------
    def newest(self) -> tuple[int | None, LeaseHolder | None]:
        """The lease log's version and the holder its newest commit names (released or not);
        (None, None) before the lease was ever taken."""
        try:
            if self._table is None:
                self._table = DeltaTable(self.uri, storage_options=self.storage_options)
            else:  # a few new commits at most: far cheaper than opening the log again
                self._table.update_incremental()
        except TableNotFoundError:
            return None, None
        table = self._table
        version = table.version()
        info = table.history(1)
        text = info[0].get(LEASE_KEY) if info else None
        return version, LeaseHolder.from_json(text) if text else None

    def holder(self, now: float | None = None) -> LeaseHolder | None:
        """Who holds the lease now; None when it is free (see the module doc for who may take it)."""
        _, holder = self.newest()
        return holder if holder is not None and self.holds(holder, now) else None

    def holds(self, holder: LeaseHolder, now: float | None = None) -> bool:
        """Whether ``holder`` still holds the lease: not released, and alive by the liveness rule or,
        once its process is gone, the attempt it started is still running."""
        state = liveness(holder, self.grace_seconds, now)
        if state is Liveness.RUNNING:
            return True
        if state is Liveness.DEAD and holder.attempt_id:
            from airflow_eo.table.staging import StagingArea  # staging is the attempts' side; it imports no lease

            marker = StagingArea(self.location).read_marker(holder.attempt_id)
            return marker is not None and liveness(marker, self.grace_seconds, now) is Liveness.RUNNING
        return False

    # -- taking -------------------------------------------------------------------------------
    def try_take(self, claim: Claim) -> "HeldLease | LeaseHolder":
        """Take the lease if it is free (or held by an earlier try of ``claim``'s run); else who holds it."""
        while True:
            version, current = self.newest()
            if current is not None and self.holds(current) and \
                    not (claim.run_key and current.run_key == claim.run_key):
                return current
            if current is not None and current.released_at is None:
                log.info("lease of %s: taking it over from %s (%s)", self.location.uri, current.describe(),
                         "an earlier try of this run" if current.run_key == claim.run_key else "its holder is dead")
            if version is None and self.check_first is not None:
                self.check_first()
            mine = LeaseHolder.of(claim)
            if self._commit(version, mine):
                return HeldLease(self, mine)
            # another run committed the version this one read: read the lease again

    def wait(self, claim: Claim, timeout: float, poll: float = 1.0) -> "HeldLease | None":
        """Take the lease, waiting (up to ``timeout`` s) while another run holds it. None when the
        wait timed out, or the lease could not be read or written: the run goes on without it
        (the compare-and-set commit still guards the table)."""
        started, next_log = time.monotonic(), 0.0
        try:
            while True:
                got = self.try_take(claim)
                if isinstance(got, HeldLease):
                    waited = time.monotonic() - started
                    if waited >= 1:
                        log.info("took the lease of %s after waiting %.0f s", self.location.uri, waited)
                    return got
                waited = time.monotonic() - started
                if waited >= timeout:
                    log.warning("waited %.0f s (table_wait_timeout) for the lease of %s, held by %s: planning from "
                                "the table as it is (its compare-and-set commit still guards it)", waited,
                                self.location.uri, got.describe())
                    return None
                if waited >= next_log:
                    log.info("waiting for the lease of %s: held by %s (waited %.0f s of %.0f s)", self.location.uri,
                             got.describe(), waited, timeout)
                    next_log += WAIT_LOG_SECONDS
                # jittered, so waiters woken by one release do not all read the lease at once
                time.sleep(min(poll * random.uniform(0.5, 1.5), max(timeout - waited, 0.01)))
        except LEASE_ERRORS as exc:
            log.warning("the lease of %s could not be read or taken (%s): going on without it (the compare-and-set "
                        "commit still guards the table)", self.location.uri, str(exc).splitlines()[0] if str(exc)
                        else exc.__class__.__name__)
            return None

    def _commit(self, version: int | None, holder: LeaseHolder) -> bool:
        """Commit ``holder`` as the version after ``version``; False when another commit took it."""
        properties = CommitProperties(custom_metadata={LEASE_KEY: holder.to_json()}, max_commit_retries=0)
        try:
            if version is None:
                create_table_with_add_actions(self.uri, _SCHEMA, [], mode="error", storage_options=self.storage_options,
                                              configuration=_LOG_CONFIGURATION, commit_properties=properties)
            else:
                table = self._table if self._table is not None and self._table.version() == version else \
                    DeltaTable(self.uri, version=version, storage_options=self.storage_options)
                table.create_write_transaction([], mode="append", schema=table.schema(), commit_properties=properties)
        except CommitFailedError:
            return False
        except DeltaError as exc:
            if "already exists" in str(exc).lower():  # another run created the log meanwhile
                return False
            raise
        return True


class HeldLease:
    """The lease as this process holds it: renewed in the background until :meth:`release`."""

    def __init__(self, lease: TableLease, holder: LeaseHolder):
        self.lease, self.holder = lease, holder
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.lost = False
        # often enough that another host never sees it stale (its rule waits staging_grace_seconds)
        self.renew_every = renew_every(lease.grace_seconds)
        self._thread = threading.Thread(target=self._renewing, name="airflow-eo-lease", daemon=True)
        self._thread.start()

    def attempt(self, attempt_id: str) -> None:
        """Record the attempt this run started (status and the UI show it)."""
        self.renew(attempt_id=attempt_id)

    def renew(self, attempt_id: str | None = None, released: bool = False) -> None:
        """Commit the holder again (renewed now; with its attempt, or released), if it still holds the lease."""
        with self._lock:
            if self.lost:
                return
            now = time.time()
            want = replace(self.holder, renewed_at=now, attempt_id=self.holder.attempt_id if attempt_id is None
                           else attempt_id, released_at=now if released else None)
            try:
                for _ in range(3):  # a commit that fails is a takeover, read below
                    version, current = self.lease.newest()
                    if current is None or current.token != self.holder.token:
                        self.lost = True
                        log.warning("the lease of %s was taken over by %s while this run held it (its holder was "
                                    "thought dead); going on: the compare-and-set commit guards the table",
                                    self.lease.location.uri, current.describe() if current else "nobody")
                        return
                    if self.lease._commit(version, want):
                        self.holder = want
                        return
            except LEASE_ERRORS as exc:  # advisory: a renewal that fails is retried by the next
                log.warning("could not renew the lease of %s: %s", self.lease.location.uri, exc)

    def release(self) -> None:
        """Give the lease up (a waiting run takes it at once); the background renewal ends first, so no
        thread of it is left when the task returns (Airflow's listeners may fork the process then)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        self.renew(released=True)
        self.lost = True

    def _renewing(self) -> None:
        while not self._stop.wait(self.renew_every):
            self.renew()


@contextmanager
def turn(lease: TableLease, claim: Claim, timeout: float, poll: float = 1.0) -> Iterator[HeldLease | None]:
    """Hold ``lease`` for the block (waiting up to ``timeout`` s for it; None: going on without it)."""
    held = lease.wait(claim, timeout, poll)
    try:
        yield held
    finally:
        if held is not None:
            held.release()
