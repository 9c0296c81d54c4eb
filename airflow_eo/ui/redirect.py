"""``/airflow-eo`` → ``/airflow-eo/``: the one path of the page Airflow's API server would answer with its own 404.

Airflow mounts the page's app under ``/airflow-eo``; a mount serves only the paths below it,
and the UI's catch-all route takes the bare prefix, so a user who types the URL without its
trailing slash would see Airflow's "404 Page Not Found". This root middleware (registered by
the plugin, :mod:`airflow_eo.ui.plugin`) redirects exactly that path, query kept, and passes
every other request through untouched. Plain ASGI, no import: the plugin module stays cheap.

Example::

    >>> TrailingSlash(app, "/airflow-eo")                    # doctest: +SKIP
"""

from __future__ import annotations

from urllib.parse import quote


class TrailingSlash:
    """Redirect (307) ``<root>{prefix}`` to ``<root>{prefix}/``."""

    def __init__(self, app, prefix: str = "/airflow-eo"):
        self.app, self.prefix = app, prefix.rstrip("/")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self._route_path(scope) == self.prefix:
            # relative to the path asked for: right behind a proxy that strips or adds a prefix too
            location = quote(self.prefix.rsplit("/", 1)[-1]) + "/"
            if scope.get("query_string"):
                location += "?" + scope["query_string"].decode("latin-1")
            await send({"type": "http.response.start", "status": 307,
                        "headers": [(b"location", location.encode("latin-1")), (b"content-length", b"0"),
                                    (b"cache-control", b"no-store")]})
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _route_path(scope) -> str:
        path, root = scope.get("path", ""), scope.get("root_path", "")
        return path[len(root):] if root and path.startswith(root) else path
