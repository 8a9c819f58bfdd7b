"""The LIVE dashboard of a 1,000-step run in headless Chromium (issue 20: first render under 2 s
for 1,000 steps, on the server too): ``flowrl dashboard RUN --port 0`` on a synthetic run
directory (tests/flowrl_testing/synthetic_run.py, a default GRPO run's ~45 metric keys).

A server's session sends a first page without the throughput, reshard and all-metrics figures
and builds them once the browser reports the page drawn (``Dashboard(defer=True)``). Checks what
is shown: at the first paint (the ``flowrl:first-paint`` mark) the overview is in the page and no
all-metrics figure yet; then every all-metrics figure arrives and is drawn (in the models and in
the DOM, as test_dashboard_large.py checks the exported page); the metric filter works on those
figures, including a filter typed before the server sent them (they must come in filtered).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chromium_cdp import Chromium, chromium_binary  # tests/dist/chromium_cdp.py
from flowrl_testing.synthetic_run import write_synthetic_run
from test_dashboard_browser import DashboardServer
from test_dashboard_large import DOC, set_filter, shown

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(chromium_binary() is None, reason="no chromium (apt-get install -y chromium; .ci/run does)"),
]

STEPS = 1000
WAIT_S = 60  # every wait below; the page is drawn within seconds on a quiet 2-core machine
MARK = "performance.getEntriesByName({!r}).length > 0"

#: Run before the page's scripts: records, when the page sets its first-paint mark, which figures
#: the document holds then (the server builds the others after hearing the page is drawn).
AT_FIRST_PAINT = """
(() => {
  const mark = performance.mark.bind(performance);
  performance.mark = (name, ...rest) => {
    if (name === "flowrl:first-paint" && window.Bokeh && Bokeh.documents.length) {
      window.__flowrl_at_paint = [...Bokeh.documents[0].all_models].filter((m) => m.name
        && m.constructor.__name__ === "Figure").map((m) => m.name);
    }
    return mark(name, ...rest);
  };
})();
"""


@pytest.fixture(scope="module")
def live_run(tmp_path_factory) -> tuple[Path, set[str]]:
    run = write_synthetic_run(tmp_path_factory.mktemp("live") / "r1000", STEPS, seed=1)
    keys = {k for line in (run / "metrics.jsonl").read_text().splitlines() for k in json.loads(line) if k != "step"}
    return run, keys


@pytest.fixture(scope="module")
def server(live_run):
    srv = DashboardServer(live_run[0], interval_s=2.0, timeout_s=WAIT_S)
    yield srv
    srv.close()


def open_page(browser: Chromium, url: str) -> list[str]:
    """Opens ``url``; returns the names of the figures the document held at the first paint."""
    browser.call("Page.enable")
    browser.call("Page.addScriptToEvaluateOnNewDocument", {"source": AT_FIRST_PAINT})
    browser.open(url)
    browser.wait_for(MARK.format("flowrl:first-paint"), timeout_s=WAIT_S, poll_s=0.05)
    return browser.evaluate("window.__flowrl_at_paint")


def test_live_page_paints_the_overview_first_then_every_figure(server, live_run):
    run, keys = live_run
    actor = {k for k in keys if "actor/" in k}
    assert len(keys) > 40 and 5 < len(actor) < len(keys)
    with Chromium(width=1400, height=2000, timeout_s=WAIT_S) as browser:
        at_paint = open_page(browser, server.url)
        # the first page: the overview's figures and the Gantt, none of the deferred panels'
        assert "overview:critic/score/mean" in at_paint and "timeline" in at_paint, at_paint
        assert not [n for n in at_paint if n.split(":")[0] in ("metric", "throughput", "reshard")], at_paint
        # then the server builds the others: every all-metrics figure arrives and is drawn
        browser.wait_for(MARK.format("flowrl:all-metrics"), timeout_s=WAIT_S)
        shown(browser, keys, keys)
        names = browser.evaluate(f"[...{DOC}.all_models].map((m) => m.name).filter((n) => n)")
        assert {n.split(":", 1)[1] for n in names if n.startswith("throughput:")} == {k for k in keys if k.startswith("perf/")}
        assert {n.split(":", 1)[1] for n in names if n.startswith("reshard:")} == {k for k in keys if k.startswith("reshard/")}
        # the filter on the figures the server added after the first paint
        set_filter(browser, "actor/")
        state = shown(browser, actor, keys)
        assert not any(v["view"] for k, v in state.items() if k not in actor)  # hidden: no view to lay out
        set_filter(browser, "")
        shown(browser, keys, keys)


def test_live_filter_typed_before_the_figures_arrive(server, live_run):
    """A filter typed at the first paint, before the server sent the all-metrics figures: they
    come in filtered, and the section titles follow."""
    run, keys = live_run
    score = {k for k in keys if "score" in k}
    assert len(score) == 3
    with Chromium(width=1400, height=2000, timeout_s=WAIT_S) as browser:
        at_paint = open_page(browser, server.url)
        assert not [n for n in at_paint if n.startswith("metric:")], at_paint
        set_filter(browser, "SCORE")  # case-insensitive
        browser.wait_for(MARK.format("flowrl:all-metrics"), timeout_s=WAIT_S)
        shown(browser, score, keys)
        titles = browser.evaluate(f"[...{DOC}.all_models].filter((m) => m.name && m.name.startsWith('group:'))"
                                  ".filter((m) => m.visible).map((m) => m.name)")
        assert titles == ["group:critic"], titles
        set_filter(browser, "")
        shown(browser, keys, keys)
