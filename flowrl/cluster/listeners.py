"""Which HTTP servers a run's Dask processes start.

distributed starts an HTTP server in the scheduler and in every worker whatever the dashboard
setting (the scheduler's ``/info`` pages show workers, logs and call stacks; a worker serves
``/health`` and ``/metrics``), none of it authenticated. With ``cluster.dashboard=false`` flowrl
starts none: :func:`install` wraps ``ServerNode.start_http_server`` so that it opens no socket
while the dask setting ``flowrl.http`` is false (the scheduler: set around its start; a worker:
``flowrl.cluster.worker_setup`` sets it from ``FLOWRL_HTTP=off``). With the dashboard on, the
scheduler's dashboard listens on 127.0.0.1 only, on a port chosen before it starts so that
Bokeh's websockets accept only pages served from it (``allow_websocket_origin``: that host and
port; Bokeh takes no wildcard port there, and a foreign ``Origin`` is refused), and the proxy
route (to any host) is off.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

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
        # no socket, no routes; and no http_application attribute: ``_stop_services`` on close
        # looks for it with hasattr (a None there fails the close and leaves the process behind)
        return None

    start_http_server._flowrl = True  # type: ignore[attr-defined]
    ServerNode.start_http_server = start_http_server


def settings(dashboard: bool, port: int = 0) -> dict[str, Any]:
    """Dask settings for the servers this process starts: no HTTP at all without the
    dashboard; with it on ``port``, websocket origins of that port on the loopback and no
    proxy route."""
    import dask

    if not dashboard:
        return {"flowrl.http": False}
    routes = [r for r in dask.config.get("distributed.scheduler.http.routes") if r != _PROXY_ROUTE]
    return {"flowrl.http": True, "distributed.scheduler.http.routes": routes,
            "distributed.scheduler.dashboard.bokeh-application.allow_websocket_origin":
                [f"127.0.0.1:{port}", f"localhost:{port}"]}


@contextlib.contextmanager
def servers(dashboard: bool) -> Iterator[str]:
    """Start the scheduler (of a LocalCluster or SLURMCluster) inside this context, with the
    dashboard address it yields (``127.0.0.1:<a free port>``)."""
    import dask

    from flowrl.comm.store import free_port

    install()
    port = free_port() if dashboard else 0
    with dask.config.set(settings(dashboard, port)):
        yield f"127.0.0.1:{port}"
