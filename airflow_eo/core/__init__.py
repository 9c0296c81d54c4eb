"""The pure core: offsets and ranges, plans, intervals, statuses and errors.

Values and rules only: no Kafka, Spark, Delta, Arrow or Airflow (an import-linter contract).
"""
