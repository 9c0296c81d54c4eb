"""The provider's registration info: every component it declares imports (no Airflow database)."""

from __future__ import annotations

import importlib

from airflow_eo.provider_info import provider_info


def test_provider_info_declares_every_component_and_reuses_kafka_connection():
    info = provider_info()
    assert info["package-name"] == "airflow-eo"
    for key in ("hooks", "operators", "sensors", "triggers"):
        for module in info[key][0]["python-modules"]:
            importlib.import_module(module)
    module, _, cls = info["extra-links"][0].rpartition(".")
    assert getattr(importlib.import_module(module), cls).name == "Delta batch"
    assert "connection-types" not in info  # the `kafka` type belongs to the Kafka provider
