"""A slice of the audit: one partition's offsets ``[lo, hi)`` read from Kafka and the table, then compared.

The audit cuts each audited partition into slices of at most ``slice_offsets`` offsets
(:func:`airflow_eo.audit.findings.plan_slices`); each slice reads only its own coordinates
(:mod:`airflow_eo.audit.coordinates`) and returns a small :class:`~airflow_eo.audit.findings.SliceResult`
(counts, the first offsets of each finding), so memory follows the slice, not the table or the
number of records. Where the slices run is a :class:`SliceRunner`: :class:`InProcessSlices`
here, a few at a time in threads; or Spark tasks, one per slice, on a classic or a
Spark Connect session (:class:`airflow_eo.submit.audit.SparkSlices`), for large audits.

Example::

    >>> results = list(InProcessSlices().run(tasks, Secrets({"bootstrap.servers": "127.0.0.1:9092"})))  # doctest: +SKIP
"""

from __future__ import annotations

import os
import queue
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterator, Protocol, Sequence

import numpy as np

from airflow_eo.attempt import Secrets
from airflow_eo.audit.coordinates import FileRef, KafkaCoordinates, table_offsets
from airflow_eo.audit.findings import SliceResult, SliceSpec, compare_slice
from airflow_eo.table.storage import TableLocation

IN_PROCESS_WORKERS = 4  # slices read at a time in process, and no more than the cores


@dataclass(frozen=True)
class SliceTask:
    """A slice and where its rows are: the table's (and dead-letter table's) files that may hold them."""

    spec: SliceSpec
    table_uri: str
    files: tuple[FileRef, ...] = ()
    dead_letter_uri: str | None = None
    dead_files: tuple[FileRef, ...] = ()
    ingest_id: str = ""  # a dead-letter table may hold other ingests' records too
    names: dict = field(default_factory=dict)  # the table's logical → physical column names (column mapping)

    @property
    def size(self) -> int:
        """Offsets Kafka is asked for: what a slice's time mostly goes to."""
        return self.spec.checked_offsets


def run_slice(task: SliceTask, kafka: KafkaCoordinates, storage_options=None,
              locations: dict[str, TableLocation] | None = None) -> SliceResult:
    """Read one slice's coordinates and compare them."""
    spec, locations = task.spec, {} if locations is None else locations

    def location(uri: str) -> TableLocation:
        if uri not in locations:
            locations[uri] = TableLocation.of(uri, storage_options)
        return locations[uri]

    delivered = [kafka.offsets(spec.tp, s, e) for s, e in spec.kafka_spans]
    deleted: dict[str, list[np.ndarray]] = {}  # rows later commits deleted (deletion vectors), by commit
    table = table_offsets(location(task.table_uri), task.files, spec.tp, spec.lo, spec.hi, deleted=deleted,
                          names=task.names)
    dead = table_offsets(location(task.dead_letter_uri), task.dead_files, spec.tp, spec.lo, spec.hi, task.ingest_id) \
        if task.dead_letter_uri else np.array([], dtype=np.int64)
    kafka_offsets = np.concatenate(delivered) if delivered else np.array([], dtype=np.int64)
    return compare_slice(spec, kafka_offsets, table, dead, {by: np.concatenate(a) for by, a in deleted.items()})


class SliceRunner(Protocol):
    """Where an audit's slices run."""

    engine: str  # named in the report: "in_process" or "spark"
    default_threshold: int  # offsets checked from which an audit given this runner uses it

    def run(self, tasks: Sequence[SliceTask], secrets: Secrets) -> Iterator[SliceResult]: ...


class InProcessSlices:
    """The slices in this process, up to ``workers`` at a time, each worker with a consumer of its
    own reassigned per span. Threads suffice: the client fetches and parses in its own threads
    and Parquet reads release the GIL, so one slice's Kafka wait overlaps another's table read
    (and, on a broker of several nodes, partitions are fetched in parallel). Memory: ``workers``
    slices at a time."""

    engine = "in_process"
    default_threshold = 0

    def __init__(self, workers: int | None = None):
        self.workers = workers or min(IN_PROCESS_WORKERS, os.cpu_count() or 1)

    def run(self, tasks: Sequence[SliceTask], secrets: Secrets) -> Iterator[SliceResult]:
        locations: dict[str, TableLocation] = {}
        idle: queue.SimpleQueue[KafkaCoordinates] = queue.SimpleQueue()
        made: list[KafkaCoordinates] = []

        def one(task: SliceTask) -> SliceResult:
            try:
                kafka = idle.get_nowait()
            except queue.Empty:
                kafka = KafkaCoordinates(secrets.kafka_config)
                made.append(kafka)
            try:
                return run_slice(task, kafka, secrets.storage_options, locations)
            finally:
                idle.put(kafka)

        pool = ThreadPoolExecutor(max(1, min(self.workers, len(tasks))), thread_name_prefix="audit-slice")
        try:
            yield from pool.map(one, tasks)
        finally:  # a failed slice ends the audit: the slices not started never start
            pool.shutdown(wait=True, cancel_futures=True)
            for kafka in made:
                kafka.close()
