"""What runs in the Spark driver: the Kafka source, decoding, transforms, staging writes,
and the attempt's main (:mod:`airflow_eo.driver.main`)."""
