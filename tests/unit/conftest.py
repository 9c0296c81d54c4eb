"""The unit lane's boundary: a test here that asks for the broker, Spark or the Airflow database,
or opens a connection beyond this machine, fails.

The session-wide real parts live in tests/conftest.py; these fixtures shadow them for
tests/unit so a slow dependency cannot creep into the fast lane unnoticed. Such a test
belongs in tests/integration (or tests/system).
"""

from __future__ import annotations

import ipaddress
import socket

import pytest

_connect = socket.socket.connect


def _local_only(sock: socket.socket, address) -> None:
    """``socket.connect`` for loopback and Unix sockets only (Python-level clients; not librdkafka)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        host = address[0]
        try:
            local = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:  # a host name: resolving it already left the machine
            local = False
        if not local:
            raise AssertionError(f"a unit test connected to {address}: unit tests use no network; "
                                 "put the test in tests/integration or fake the client at its boundary")
    return _connect(sock, address)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    monkeypatch.setattr(socket.socket, "connect", _local_only)


def _not_in_the_unit_lane(request) -> None:
    pytest.fail(f"{request.node.nodeid} asks for the {request.fixturename!r} fixture: unit tests run without "
                "the broker, Spark and the Airflow database; move it to tests/integration", pytrace=False)


def _shadow(name: str, scope: str = "session"):
    """A fixture of the real parts (tests/conftest.py, the pytest plugin's) that fails here."""
    @pytest.fixture(scope=scope, name=name)
    def shadow(request):
        _not_in_the_unit_lane(request)
    return shadow


broker, spark, connect_server, airflow_db = (_shadow(n) for n in ("broker", "spark", "connect_server", "airflow_db"))
# the pytest plugin's (airflow_eo/testing/plugin.py)
kafka_broker, s3_stand_in = _shadow("kafka_broker"), _shadow("s3_stand_in")
airflow_dag_runner = _shadow("airflow_dag_runner", scope="function")
