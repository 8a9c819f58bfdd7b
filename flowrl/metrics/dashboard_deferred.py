"""The deferred panes of a live dashboard page (:class:`flowrl.metrics.dashboard.Dashboard`):
figures built off the server's event loop, a batch at a time, and attached on it with the metric
filter applied. A mixin of the dashboard, which holds the state it reads (``_pending``: the panes
still to build, by ``(panel, keys)``; ``_panes``: every lazy pane and its figures; ``lock``; the
filter and attach callbacks)."""

from __future__ import annotations

import time
from typing import Any

from flowrl.metrics.dashboard_live import batched as _batched, filter_shows as _filter_shows


class DeferredPanes:
    """Building and attaching the figures of a page's deferred panes."""

    def attach_all(self) -> None:
        """Fill every lazy pane now (in Python), not in the browser after the first paint, with
        the figures the filter shows (a live page's filter sets their ``visible``)."""
        for pane, figs in self._panes:
            shown = [fig for fig in figs if fig.visible]
            if list(pane.elements) != shown:
                pane.elements = shown

    def build_deferred(self, budget_s: float = 0.25) -> bool:
        """Build the figures of the next deferred panes (in page order, at least one, more while
        ``budget_s`` seconds are not spent: :meth:`build_batch`) and attach them, the metric
        filter applied with the text the browser last sent (:meth:`attach_batch`; its
        :data:`LIVE_ATTACH_JS` filters again, should the text have changed meanwhile); returns
        whether panes are left. A server builds off its event loop and attaches on it.

        The server attaches them, not the browser: a change the browser makes comes back to the
        server, and every change of the document's model graph walks the whole graph again (a
        tenth of a second at 1,000 steps). Here it is walked once per batch, and each new figure
        sent once (:func:`_batched`)."""
        built = self.build_batch(budget_s)
        if built:
            self.attach_batch(built)
        return bool(self._pending)

    def build_batch(self, budget_s: float = 0.25) -> list[tuple[Any, list[Any]]]:
        """The next deferred panes and their new figures (models in no document; :attr:`lock` held)."""
        built: list[tuple[Any, list[Any]]] = []
        start = time.perf_counter()
        with self.lock:
            while self._pending and (not built or time.perf_counter() - start < budget_s):
                cache_key, pane = next(iter(self._pending.items()))
                del self._pending[cache_key]
                panel, keys = cache_key
                built.append((pane, [self._curve(k, panel) for k in keys]))
        return built

    def attach_batch(self, built: list[tuple[Any, list[Any]]]) -> None:
        """Attach the figures :meth:`build_batch` built, the filter applied."""
        figures = {id(pane): figs for pane, figs in built}
        self._panes = [(p, figures.get(id(p), f)) for p, f in self._panes]
        text = (self.metric_filter.value_input or self.metric_filter.value or "").strip().lower()
        sections = {id(grid): (section, title) for section, title, grid in self.filter_callback.args["sections"]}
        doc = self.layout.document
        with _batched(doc):
            for pane, figs in built:
                shown = [fig for fig in figs if _filter_shows(fig, text)]
                for fig in figs:
                    if fig.visible != (fig in shown):  # changes only: fewer events to send
                        fig.visible = fig in shown
                if id(pane) in sections:  # as FILTER_JS: a section with no figure left is hidden, title too
                    for model in (*sections[id(pane)], pane):
                        model.visible = bool(shown)
                pane.elements = shown
                pane.tags = figs  # last: its change runs LIVE_ATTACH_JS in the browser

    def _drop_pending(self, shown: set[int]) -> None:
        """Forget the deferred panes a rebuild took off the page (``shown``: ids of the panes left);
        the browser then waits for the others only."""
        kept = {k: p for k, p in self._pending.items() if id(p) in shown}
        if len(kept) < len(self._pending):
            self._pending = kept
            left = [p for p in self.live_attach_callback.args["panes"] if id(p) in shown]
            self.live_attach_callback.args = dict(self.live_attach_callback.args, panes=left)
