"""PySpark entry point: one exactly-once batch from Kafka into a Delta table.

Two ways to run it with plain spark-submit:

* execute an attempt prepared by ``airflow-eo ingest`` or the operator (plan logged):
  ``spark-submit spark_jobs/kafka_to_delta.py --table-uri /data/orders --attempt-id 3f2a…``
* standalone, planning in the driver:
  ``spark-submit spark_jobs/kafka_to_delta.py --table-uri /data/orders --ingest-id orders_raw
  --topics orders --run-key nightly-2026-11-22`` with the Kafka client config in the
  ``AIRFLOW_EO_KAFKA_CONFIG`` environment variable (JSON), e.g.
  ``{"bootstrap.servers": "127.0.0.1:9092"}``.

The job itself is :mod:`airflow_eo.driver.main`; this script only hands it the arguments.
"""

import sys

from airflow_eo.driver.main import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
