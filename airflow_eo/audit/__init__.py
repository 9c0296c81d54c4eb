"""Auditing a table against Kafka: the reconciliation core (:mod:`.findings`), the slices it is
compared in (:mod:`.slices`, :mod:`.coordinates`) and the run that feeds it (:mod:`.run`)."""

SLICE_OFFSETS = 1_000_000  # offsets of one partition compared at a time: ~50 MB of arrays at most
SPARK_THRESHOLD = 1_000_000  # offsets checked from which the slices run as Spark tasks, when Spark is given
