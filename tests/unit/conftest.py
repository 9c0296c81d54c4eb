"""The unit lane's boundary: a test here that asks for the broker, Spark or the Airflow database fails.

The session-wide real parts live in tests/conftest.py; these fixtures shadow them for
tests/unit so a slow dependency cannot creep into the fast lane unnoticed. Such a test
belongs in tests/integration (or tests/system).
"""

from __future__ import annotations

import pytest


def _not_in_the_unit_lane(request) -> None:
    pytest.fail(f"{request.node.nodeid} asks for the {request.fixturename!r} fixture: unit tests run without "
                "the broker, Spark and the Airflow database; move it to tests/integration", pytrace=False)


@pytest.fixture(scope="session")
def broker(request):
    _not_in_the_unit_lane(request)


@pytest.fixture(scope="session")
def spark(request):
    _not_in_the_unit_lane(request)


@pytest.fixture(scope="session")
def connect_server(request):
    _not_in_the_unit_lane(request)


@pytest.fixture(scope="session")
def airflow_db(request):
    _not_in_the_unit_lane(request)
