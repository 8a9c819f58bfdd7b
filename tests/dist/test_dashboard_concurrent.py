"""The live dashboard answers other clients while it builds a page (issue 39, item 5).

``flowrl dashboard`` serves a synthetic run with figure building slowed down on purpose: the
first figure of the throughput panel (the first panel built after the first paint) takes
``SLOW_S`` more seconds to build. While the server builds them for a first browser, a second client asks
for a static file and for the page itself (``GET /``: a new session, its page built). Both must
be answered while that build still runs (the first page's ``flowrl:all-metrics`` mark not set
yet) and well within ``SLOW_S`` (a server that builds on its event loop answers neither before
the slow figure is done); then the first page completes. The fine latency figures are measured
by ``benchmarks/dashboard_render.py`` (the ``2nd GET`` columns), not here.
"""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from chromium_cdp import Chromium, chromium_binary, stop_process  # tests/dist/chromium_cdp.py
from flowrl_testing.synthetic_run import write_synthetic_run

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(chromium_binary() is None, reason="no chromium (apt-get install -y chromium; .ci/run does)"),
]

SLOW_S = 8.0  # the slow figure's build, which the second client must not wait for
WAIT_S = 90  # every other wait
MARK = "performance.getEntriesByName({!r}).length > 0"
KEYS = ("critic/score/mean", "actor/entropy", "actor/kl_loss", "perf/throughput", "perf/time_per_step",
        "response_length/mean", "timing_s/gen")

#: The server child: ``flowrl dashboard`` with the throughput figures slowed down.
SERVER = f"""
import sys, time
from flowrl.metrics import dashboard_figures
make = dashboard_figures.FigureMaker.figure
def slow(self, key, panel, n_points):
    if panel == "throughput" and key == "perf/throughput":
        time.sleep({SLOW_S})
    return make(self, key, panel, n_points)
dashboard_figures.FigureMaker.figure = slow
from flowrl.cli import main
sys.exit(main(["dashboard", sys.argv[1], "--port", "0", "--interval", "1"]))
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    run = write_synthetic_run(tmp_path_factory.mktemp("concurrent") / "r200", 200, seed=4, keys=KEYS)
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(run)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen: list[str] = []
    try:
        while not (match := re.search(r"http://127\.0\.0\.1:\d+/", seen[-1] if seen else "")):
            seen.append(lines.get(timeout=WAIT_S))
    except queue.Empty:
        stop_process(proc)
        raise TimeoutError(f"no dashboard URL within {WAIT_S}s: {''.join(seen)}") from None
    yield match.group(0)
    stop_process(proc)


def get(url: str) -> tuple[float, str]:
    """Seconds until ``url`` answered in full, and its text."""
    start = time.monotonic()
    with urllib.request.urlopen(url, timeout=WAIT_S) as response:
        assert response.status == 200
        body = response.read().decode("utf-8", errors="replace")
    return time.monotonic() - start, body


def test_a_second_client_is_answered_while_a_page_builds(server):
    with Chromium(width=1400, height=2000, timeout_s=WAIT_S) as browser:
        browser.open(server)
        browser.wait_for(MARK.format("flowrl:first-paint"), timeout_s=WAIT_S, poll_s=0.05)
        time.sleep(1.0)  # the server heard the page is drawn and builds the slow figures now
        static_s, _ = get(server + "favicon.ico")
        page_s, html = get(server)  # a second page load: a new session, its first page built
        building = not browser.evaluate(MARK.format("flowrl:all-metrics"))
        assert building, "the first page's figures were done before the second client was answered"
        assert static_s < SLOW_S / 2 and page_s < SLOW_S / 2, (static_s, page_s)
        assert "Bokeh" in html and "bokeh" in html.lower()
        # the first page still completes: every figure, the slow ones included
        browser.wait_for(MARK.format("flowrl:all-metrics"), timeout_s=WAIT_S + SLOW_S, poll_s=0.1)
        names = browser.evaluate("[...Bokeh.documents[0].all_models].map((m) => m.name).filter((n) => n)")
        assert {"throughput:perf/throughput", "throughput:perf/time_per_step", "metric:actor/entropy"} <= set(names)
