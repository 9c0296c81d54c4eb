"""airflow-eo Airflow triggers."""
