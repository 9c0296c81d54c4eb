"""Auditing a table against Kafka: the reconciliation core (:mod:`.findings`), the slices it is
compared in (:mod:`.slices`, :mod:`.coordinates`) and the run that feeds it (:mod:`.run`)."""

SLICE_OFFSETS = 1_000_000  # offsets of one partition compared at a time: ~50 MB of arrays at most
# Offsets checked from which the slices run as Spark tasks (when the audit is given Spark): where
# Spark's parallel reading outweighs starting it. A warm session (Spark Connect) costs well under a
# second; a session the audit starts costs a JVM start (~8 s idle), what this process reads ~10M
# records in at the rate of one consumer.
SPARK_THRESHOLD_WARM = 1_000_000
SPARK_THRESHOLD_COLD = 10_000_000
