"""Which HTTP servers a run's Dask processes start.

distributed starts an HTTP server in the scheduler and in every worker whatever the dashboard
setting (the scheduler's ``/info`` pages show workers, logs and call stacks; a worker serves
``/health`` and ``/metrics``), none of it authenticated. With ``cluster.dashboard=false`` flowrl
starts none: :func:`install` wraps ``ServerNode.start_http_server`` so that it opens no socket
while the dask setting ``flowrl.http`` is false (the scheduler: set around its start; a worker:
``flowrl.cluster.worker_setup`` sets it from ``FLOWRL_HTTP=off``). With the dashboard on, the
scheduler's dashboard listens on 127.0.0.1 only, Bokeh's websockets accept only a page served
from the loopback (``allow_websocket_origin``), and the proxy route (to any host) is off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: Bokeh's websocket origins of the dashboard: pages from the loopback, any port.
LOOPBACK_ORIGINS = ["127.0.0.1:*", "localhost:*"]
_PROXY_ROUTE = "distributed.http.proxy"


def install() -> None:
    """Wrap ``start_http_server`` once per process (a no-op while ``flowrl.http`` is true)."""
    from distributed.node import ServerNode

    if getattr(ServerNode.start_http_server, "_flowrl", False):
        return
    original = ServerNode.start_http_server

    def start_http_server(self: Any, *args: Any, **kwargs: Any) -> None:
        import dask

        if dask.config.get("flowrl.http", True):
            return original(self, *args, **kwargs)
        self.http_server = self.http_application = None  # no socket, no routes
        return None

    start_http_server._flowrl = True  # type: ignore[attr-defined]
    ServerNode.start_http_server = start_http_server


def settings(dashboard: bool) -> dict[str, Any]:
    """Dask settings for the servers this process starts: no HTTP at all without the
    dashboard; with it, loopback websocket origins and no proxy route."""
    import dask

    if not dashboard:
        return {"flowrl.http": False}
    routes = [r for r in dask.config.get("distributed.scheduler.http.routes") if r != _PROXY_ROUTE]
    return {"flowrl.http": True, "distributed.scheduler.http.routes": routes,
            "distributed.scheduler.dashboard.bokeh-application.allow_websocket_origin": list(LOOPBACK_ORIGINS)}


@contextlib.contextmanager
def servers(dashboard: bool) -> Iterator[None]:
    """Start the scheduler (of a LocalCluster or SLURMCluster) inside this context."""
    import dask

    install()
    with dask.config.set(settings(dashboard)):
        yield
