"""What differs between the Airflow versions airflow-eo supports (2.11, 3.0, 3.1, 3.2, 3.3), decided once, by version.

The rest of the package imports Airflow's public names through
apache-airflow-providers-common-compat (``airflow.providers.common.compat.sdk``: ``BaseOperator``,
``BaseHook``, ``Asset``/``AssetAlias`` — ``Dataset``/``DatasetAlias`` on 2.11 —, ``conf``,
``Stats``, the exceptions…), which resolves each on every version. This module holds only what
common-compat does not cover on every Python the package supports (1.20, the newest release for
Python 3.10, has no ``mask_secret``) and the few places where Airflow 2 and 3 behave differently,
each chosen by the flags below, never by trying an import and catching its failure (as upstream
providers' ``version_compat.py`` do). What each version offers was read from its wheels
(apache-airflow-task-sdk 1.0.0–1.3.2, apache-airflow-core 3.1.0–3.3.2, apache-airflow 2.11.2);
``tests/unit/test_version_compat.py`` pins it on the installed version.

Example::

    >>> AIRFLOW_V_3_0_PLUS or not AIRFLOW_V_3_1_PLUS
    True
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from airflow import __version__ as AIRFLOW_VERSION
from packaging.version import Version


def _base_version(version: str) -> tuple[int, int, int]:
    """(major, minor, micro) of an Airflow version string (pre-releases count as their release).

    >>> _base_version("3.1.0rc2")
    (3, 1, 0)
    """
    parsed = Version(version)
    return parsed.major, parsed.minor, parsed.micro


AIRFLOW_BASE_VERSION = _base_version(AIRFLOW_VERSION)
AIRFLOW_V_3_0_PLUS = AIRFLOW_BASE_VERSION >= (3, 0, 0)
AIRFLOW_V_3_1_PLUS = AIRFLOW_BASE_VERSION >= (3, 1, 0)
AIRFLOW_V_3_2_PLUS = AIRFLOW_BASE_VERSION >= (3, 2, 0)
AIRFLOW_V_3_3_PLUS = AIRFLOW_BASE_VERSION >= (3, 3, 0)

# Before 3.1.3 (2.11, 3.0, 3.1.0-3.1.2) Airflow files the Asset events added through an alias by
# ``frozenset(extra.items())``: every value of such an event's extra must be hashable (apache-airflow-core
# 3.1.3 keys them by the extra's JSON instead).
ALIAS_EVENT_EXTRA_MUST_BE_HASHABLE = AIRFLOW_BASE_VERSION < (3, 1, 3)

# The "Exactly-once tables" page needs a plugin's ``external_views`` (a navigation entry opening a
# page in the UI), which arrived with Airflow 3.1; below it the plugin registers nothing.
UI_PAGE_SUPPORTED = AIRFLOW_V_3_1_PLUS

def mask_secret(secret: Any, name: str | None = None) -> None:
    """Register ``secret`` with the log masker of the process running the task (or the triggerer).

    3.1+: the Task SDK's ``airflow.sdk.log.mask_secret`` (it also tells the supervisor); 3.0: the
    SDK's ``execution_time.secrets_masker`` (3.0.0's ``airflow.sdk.log`` has none); 2.11: core's
    ``airflow.utils.log.secrets_masker``.
    """
    import importlib

    if AIRFLOW_V_3_1_PLUS:
        module = "airflow.sdk.log"
    elif AIRFLOW_V_3_0_PLUS:
        module = "airflow.sdk.execution_time.secrets_masker"
    else:
        module = "airflow.utils.log.secrets_masker"
    importlib.import_module(module).mask_secret(secret, name)


def asset_event_extra(summary: dict) -> dict:
    """The extra of the table's Asset event: the run's summary.

    Before Airflow 3.1.3 (:data:`ALIAS_EVENT_EXTRA_MUST_BE_HASHABLE`) a list or dict value of it
    fails the task after its commit (``TypeError: unhashable type``): there the summary's nested
    values (ranges, lag, interval…) travel as JSON text, its scalars (status, batch, version,
    rows…) as they are. From 3.1.3 the summary is stored as it is.

    >>> asset_event_extra({"status": "committed", "lag": {"t[0]": 0}}) == (
    ...     {"status": "committed", "lag": '{"t[0]": 0}'} if ALIAS_EVENT_EXTRA_MUST_BE_HASHABLE
    ...     else {"status": "committed", "lag": {"t[0]": 0}})
    True
    """
    if not ALIAS_EVENT_EXTRA_MUST_BE_HASHABLE:
        return summary
    return {k: json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v for k, v in summary.items()}


def xcom_of_task(ti_key: Any) -> Any:
    """The return value (XCom) of the task instance ``ti_key`` when Airflow's webserver asks for an
    extra link (Airflow 2: links are computed there, from the serialised operator, after the run).
    Airflow 3 computes links in the task process as it finishes: callers use what the operator holds."""
    from airflow.providers.common.compat.sdk import XCom

    return XCom.get_value(ti_key=ti_key)


def dag_test(dag: Any, logical_date: datetime | None, **kwargs: Any) -> Any:
    """``dag.test()`` of one run at ``logical_date``: Airflow 3's keywords ``logical_date`` and
    ``run_after`` (None: a manual run without a logical date), Airflow 2's ``execution_date``
    (None: now; Airflow 2 has no run without a logical date)."""
    if AIRFLOW_V_3_0_PLUS:
        if logical_date is not None:
            kwargs.setdefault("run_after", logical_date)
        return dag.test(logical_date=logical_date, **kwargs)
    return dag.test(execution_date=logical_date, **kwargs)


def task_return_value(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> Any:
    """The return value (XCom) a task instance left, read from the metadata database, or None.

    Airflow 3: the ``XComModel`` row (JSON); Airflow 2: ``XCom.get_one``, which deserialises it.
    """
    from airflow.utils.session import create_session

    with create_session() as session:
        if not AIRFLOW_V_3_0_PLUS:
            from airflow.models.xcom import XCom

            return XCom.get_one(run_id=run_id, dag_id=dag_id, task_id=task_id, key="return_value",
                                map_index=map_index, session=session)
        from airflow.models.xcom import XComModel

        row = session.query(XComModel).filter_by(dag_id=dag_id, run_id=run_id, task_id=task_id, key="return_value",
                                                 map_index=map_index).one_or_none()
        if row is None:
            return None
        return json.loads(row.value) if isinstance(row.value, str) else row.value
