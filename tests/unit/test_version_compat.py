"""airflow_eo.version_compat and the common-compat names the package imports, pinned on the installed Airflow.

Every lane runs this file on its own Airflow (2.11, 3.0, 3.1, 3.2 or 3.3): the flags must match
the installed version, each name the package takes from ``airflow.providers.common.compat.sdk``
must resolve there (to a ``Dataset`` on 2.11), ``mask_secret`` must reach the masker the task's
logs go through, and the Airflow records the UI page reads (3.1+) must still have the shape
:mod:`airflow_eo.ui.events` and :mod:`airflow_eo.ui.app` query. A failure names the version.
No Airflow database: models are inspected, not queried.
"""

from __future__ import annotations

import inspect

import pytest
from packaging.version import Version

from airflow_eo import version_compat as vc

AIRFLOW = f"Airflow {vc.AIRFLOW_VERSION}"

# what the package imports from common-compat (grep "common.compat.sdk import" airflow_eo dags)
COMPAT_NAMES = ("AirflowException", "AirflowFailException", "AirflowPlugin", "AirflowSensorTimeout",
                "AirflowSkipException", "Asset", "AssetAlias", "BaseHook", "BaseOperator", "BaseOperatorLink",
                "BaseSensorOperator", "DAG", "Param", "Stats", "TaskDeferred", "XCom", "conf")


def test_the_flags_match_the_installed_version():
    release = Version(vc.AIRFLOW_VERSION).release
    assert (vc.AIRFLOW_V_3_0_PLUS, vc.AIRFLOW_V_3_1_PLUS, vc.AIRFLOW_V_3_2_PLUS, vc.AIRFLOW_V_3_3_PLUS) == tuple(
        release[:2] >= minor for minor in ((3, 0), (3, 1), (3, 2), (3, 3))), AIRFLOW
    assert (2, 11) <= release[:2] < (3, 4), f"{AIRFLOW} is outside the supported 2.11-3.3"
    assert vc.UI_PAGE_SUPPORTED == vc.AIRFLOW_V_3_1_PLUS


@pytest.mark.parametrize("name", COMPAT_NAMES)
def test_every_name_taken_from_common_compat_resolves(name):
    from airflow.providers.common.compat import sdk

    assert getattr(sdk, name) is not None, f"{AIRFLOW}: common-compat has no {name}"


def test_assets_are_datasets_on_airflow_2():
    from airflow.providers.common.compat.sdk import Asset, AssetAlias

    expected = ("Asset", "AssetAlias") if vc.AIRFLOW_V_3_0_PLUS else ("Dataset", "DatasetAlias")
    assert (Asset.__name__, AssetAlias.__name__) == expected, AIRFLOW
    assert Asset(uri="file:///data/orders").uri == "file:///data/orders"


def test_mask_secret_reaches_the_masker_the_logs_go_through():
    from airflow.providers.common.compat.sdk import redact

    secret = "s3cr3t-only-this-test-knows"
    vc.mask_secret(secret, "password")
    assert secret not in str(redact(f"token={secret}")), f"{AIRFLOW}: mask_secret did not mask"


def test_dag_test_passes_the_logical_date_as_this_airflow_names_it():
    calls = []

    class Dag:
        def test(self, **kwargs):
            calls.append(kwargs)

    when = object()
    vc.dag_test(Dag(), when, run_conf={"a": 1})
    vc.dag_test(Dag(), None)
    if vc.AIRFLOW_V_3_0_PLUS:
        assert calls == [{"logical_date": when, "run_after": when, "run_conf": {"a": 1}}, {"logical_date": None}]
    else:
        assert calls == [{"execution_date": when, "run_conf": {"a": 1}}, {"execution_date": None}]
    from airflow.providers.common.compat.sdk import DAG

    keyword = "logical_date" if vc.AIRFLOW_V_3_0_PLUS else "execution_date"
    assert keyword in inspect.signature(DAG.test).parameters, f"{AIRFLOW}: DAG.test() takes no {keyword}"


def test_the_plugin_registers_the_page_only_where_airflow_can_host_it():
    from airflow_eo.ui.plugin import ExactlyOnceTablesPlugin

    plugin = ExactlyOnceTablesPlugin()
    registered = (len(plugin.fastapi_apps), len(plugin.external_views))
    assert registered == ((1, 1) if vc.UI_PAGE_SUPPORTED else (0, 0)), AIRFLOW


@pytest.mark.skipif(not vc.UI_PAGE_SUPPORTED, reason="the page's Airflow records: 3.1+ only (see the test above)")
def test_the_airflow_records_the_page_reads_have_the_shape_it_queries():
    """What airflow_eo/ui/events.py and app.py read, as it was in apache-airflow-core 3.1.0-3.3.2."""
    from airflow.api_fastapi.app import get_auth_manager  # noqa: F401
    from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager
    from airflow.api_fastapi.auth.managers.models.resource_details import AssetDetails
    from airflow.api_fastapi.common.db.common import SessionDep  # noqa: F401
    from airflow.api_fastapi.core_api.security import GetUserDep  # noqa: F401
    from airflow.models.asset import AssetAliasModel, AssetEvent, AssetModel, alias_association_table
    from airflow.models.asset import asset_alias_asset_event_association_table as alias_events
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel

    def columns(table) -> set[str]:
        return set(table.c.keys()) if hasattr(table, "c") else set(table.__table__.c.keys())

    wanted = {
        "asset_alias": (AssetAliasModel, {"id", "name"}),
        "asset": (AssetModel, {"id", "uri"}),
        "asset_event": (AssetEvent, {"id", "asset_id", "extra", "source_dag_id", "source_task_id", "source_run_id",
                                     "source_map_index", "timestamp"}),
        "alias <-> asset": (alias_association_table, {"alias_id", "asset_id"}),
        "alias <-> event": (alias_events, {"alias_id", "event_id"}),
        "task_instance": (TaskInstance, {"dag_id", "task_id", "run_id", "map_index", "state", "try_number",
                                         "start_date"}),
        "xcom": (XComModel, {"dag_id", "task_id", "run_id", "map_index", "key", "value"}),
    }
    for what, (model, needed) in wanted.items():
        assert needed <= columns(model), f"{AIRFLOW}: {what} lacks {sorted(needed - columns(model))}"
    assert callable(XComModel.deserialize_value), AIRFLOW
    assert {"user", "method", "session"} <= set(inspect.signature(BaseAuthManager.get_authorized_dag_ids).parameters)
    assert {"method", "user", "details"} <= set(inspect.signature(BaseAuthManager.is_authorized_asset).parameters)
    assert AssetDetails(id="1").id == "1"
