"""airflow-eo Airflow hooks."""
