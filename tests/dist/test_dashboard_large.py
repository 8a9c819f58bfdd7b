"""The dashboard of a 1,000-step run in headless Chromium (issue 20: a first render in seconds, a
metric filter that answers at once): a synthetic run directory with a default GRPO run's ~45
metric keys (tests/flowrl_testing/synthetic_run.py), exported and opened from ``file://``.

Checks what is shown, not timings alone: the page paints first (the ``flowrl:first-paint``
mark), the all-metrics figures are attached after it, and the filter shows exactly the figures
whose name contains the typed text, in the browser's DOM as in the models, including a filter
typed before every section was attached. Waits are far below the minutes a filter took when it
laid out the whole page again for each figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chromium_cdp import RENDERED_MS_JS, Chromium, chromium_binary  # tests/dist/chromium_cdp.py
from flowrl_testing.synthetic_run import write_synthetic_run

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(chromium_binary() is None, reason="no chromium (apt-get install -y chromium; .ci/run does)"),
]

ARTIFACTS = Path(os.environ.get("FLOWRL_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))
DOC = "Bokeh.documents[0]"
STEPS = 1000
#: A filter step must be shown within this (it took over 60 s on a loaded 2-core machine when
#: each hidden figure laid out the whole page again; now a fraction of a second).
FILTER_TIMEOUT_S = 30

#: JS: per ``metric:`` figure, whether its model is visible and whether the browser shows it (its
#: view exists, is not display:none up the tree, and finished drawing); a figure has no view while
#: its section is not attached yet, and while the filter hides it.
SHOWN_JS = f"""
(() => {{
  const out = {{}};
  for (const m of {DOC}.all_models) {{
    if (!m.name || !m.name.startsWith("metric:")) continue;
    const v = Bokeh.index.find_one(m);
    out[m.name.slice(7)] = {{model: m.visible, view: v != null, displayed: v != null && v.el.checkVisibility(),
                            finished: v != null && v.has_finished()}};
  }}
  return out;
}})()
"""


def set_filter(browser: Chromium, text: str) -> None:
    """Types ``text`` into the filter, from a timer: what follows waits for its effect at most
    :data:`FILTER_TIMEOUT_S`, the filter's own work included."""
    browser.evaluate(f"setTimeout(() => {{ {DOC}.get_model_by_name('metric_filter').value_input"
                     f" = {json.dumps(text)}; }}, 0)")


def shown(browser: Chromium, want: set[str], keys: set[str]) -> dict:
    """Waits until the models and the DOM show exactly the ``want`` figures of ``keys``."""
    state = browser.wait_for(
        f"(() => {{ const s = {SHOWN_JS.strip()}; const want = new Set({json.dumps(sorted(want))});"
        " const ok = Object.entries(s).every(([k, v]) => v.model === want.has(k)"
        " && v.displayed === want.has(k) && (!want.has(k) || v.finished));"
        " return ok ? s : null; })()", timeout_s=FILTER_TIMEOUT_S)
    assert set(state) == keys
    return state


@pytest.fixture(scope="module")
def page_file(tmp_path_factory) -> tuple[Path, set[str]]:
    root = tmp_path_factory.mktemp("large")
    run = write_synthetic_run(root / "r1000", STEPS, seed=1)
    out = root / "dashboard.html"
    proc = subprocess.run([sys.executable, "-m", "flowrl.cli", "dashboard", str(run), "--export", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    keys = {k for line in (run / "metrics.jsonl").read_text().splitlines() for k in json.loads(line) if k != "step"}
    return out, keys


def test_filter_at_1000_steps_shows_exactly_the_matching_figures(page_file):
    out, keys = page_file
    actor = {k for k in keys if "actor/" in k}
    score = {k for k in keys if "score" in k}
    assert len(keys) > 40 and 5 < len(actor) < len(keys) and len(score) == 3
    with Chromium(width=1400, height=2000, timeout_s=120) as browser:
        browser.open(out.as_uri())
        # the page paints before the all-metrics figures are attached; filter right then, so the
        # sections attached afterwards must come in filtered
        browser.wait_for("performance.getEntriesByName('flowrl:first-paint').length > 0", timeout_s=120, poll_s=0.05)
        set_filter(browser, "actor/")
        browser.wait_for("performance.getEntriesByName('flowrl:all-metrics').length > 0", timeout_s=120)
        state = shown(browser, actor, keys)
        assert not any(v["view"] for k, v in state.items() if k not in actor)  # hidden: no view to lay out
        titles = browser.evaluate(f"[...{DOC}.all_models].filter((m) => m.name && m.name.startsWith('group:'))"
                                  ".filter((m) => m.visible).map((m) => m.name)")
        assert titles == ["group:actor"], titles
        # the panels above the sections are not filtered
        assert browser.evaluate(f"{DOC}.get_model_by_name('overview:critic/score/mean').visible")
        browser.screenshot(ARTIFACTS / "dashboard_1000_filtered.png")

        set_filter(browser, "")  # every figure back, each drawn
        shown(browser, keys, keys)
        browser.wait_for(RENDERED_MS_JS, timeout_s=FILTER_TIMEOUT_S)
        set_filter(browser, "SCORE")  # case-insensitive
        shown(browser, score, keys)
        set_filter(browser, "no such metric")  # nothing left: no section title either
        shown(browser, set(), keys)
        assert not browser.evaluate(f"[...{DOC}.all_models].some((m) => m.name"
                                    " && m.name.startsWith('group:') && m.visible)")
        set_filter(browser, "")
        shown(browser, keys, keys)
