"""airflow-eo: exactly-once batch ingestion from Kafka into Delta Lake tables, on Spark, from Airflow."""

__version__ = "0.1.0"


def get_provider_info() -> dict:
    """Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""
    from airflow_eo.provider_info import provider_info

    return provider_info()
