"""Auditing a table against Kafka: the reconciliation core (:mod:`.findings`), the slices it is
compared in (:mod:`.slices`, :mod:`.coordinates`) and the run that feeds it (:mod:`.run`)."""

from __future__ import annotations

from airflow_eo.core.errors import KafkaUnavailableError, ReadIncompleteError

SLICE_OFFSETS = 1_000_000  # offsets of one partition compared at a time: ~50 MB of arrays at most
# Offsets checked from which the slices run as Spark tasks (when the audit is given Spark): where
# Spark's parallel reading outweighs its fixed cost against one consumer here (~0.7M records/s on
# an idle 2-core machine). On a warm Spark Connect server a job and its workers' imports cost
# ~1-2 s: worth it from a few million records with a handful of cores (on 2 cores, 1M records took
# 2.1 s either way: docs/audit.md); a session the audit starts also pays
# a JVM start (~8 s idle).
SPARK_THRESHOLD_WARM = 2_000_000
SPARK_THRESHOLD_COLD = 10_000_000


# The errors of the audit's Kafka reads, one wording for both (record batches, records).
def read_failed(tp: object, cause: object) -> KafkaUnavailableError:
    return KafkaUnavailableError(f"reading {tp} for the audit failed ({cause}): check the broker; nothing was changed")


def retention_took(tp: object, start: int, end: int) -> ReadIncompleteError:
    return ReadIncompleteError(f"{tp}: retention deleted offsets of {start}..{end} while the audit read them: "
                               "run the audit again; nothing was changed")


def stalled(tp: object, start: int, end: int, seconds: float, cause: str | None = None) -> KafkaUnavailableError:
    why = f" ({cause})" if cause else ""
    return KafkaUnavailableError(f"Kafka delivered nothing of {tp} {start}..{end} for {seconds:.0f} s{why}: check the "
                                 "broker is up and reachable; nothing was changed")
