"""Auditing a table against Kafka: the reconciliation core (:mod:`.findings`) and the run that feeds it (:mod:`.run`)."""
