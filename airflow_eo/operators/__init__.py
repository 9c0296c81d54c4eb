"""airflow-eo Airflow operators."""
