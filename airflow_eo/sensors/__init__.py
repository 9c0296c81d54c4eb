"""airflow-eo Airflow sensors."""
