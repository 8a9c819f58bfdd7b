"""First render of the dashboard in headless Chromium, for synthetic runs of 60 and 1,000 steps
(and two 1,000-step runs overlaid), and the metric filter at 1,000 steps. The run directories are
written without training (tests/flowrl_testing/synthetic_run.py: a default GRPO run's ~50 metric
keys).

    python benchmarks/dashboard_render.py [--repeats 3] [--out benchmarks/results/dashboard_render.json]

Each page is exported once (``flowrl dashboard RUN --export``) and opened ``--repeats`` times in a
fresh browser. Per page, in seconds since the navigation started:

- first paint: the page is drawn and answers input (the ``flowrl:first-paint`` mark the page sets
  when Bokeh reports the document idle, ``dashboard_js.ATTACH_JS``; a page without it paints
  everything at once: its "all drawn" time);
- all drawn: every figure of the page has drawn (tests/dist/chromium_cdp.py: ``RENDERED_MS_JS``);
- browser CPU: CPU seconds of Chromium's processes until then (less sensitive to a loaded
  machine than the wall times);

and, once all is drawn, the metric filter: typing ``actor/`` (then clearing it) until the next
frame after the figures were shown or hidden, with the number of figures left shown. A step over
``--filter-timeout`` seconds is reported as null. To compare with another version of the code,
run this file with that version first on ``PYTHONPATH`` (the page is built by whichever
``flowrl`` imports).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "dist"), str(ROOT / "benchmarks")]

from _common import machine_info, median, process_tree_cpu_s, table, write_json  # noqa: E402
from chromium_cdp import RENDERED_MS_JS, Chromium  # noqa: E402
from flowrl_testing.synthetic_run import write_synthetic_run  # noqa: E402

import flowrl.metrics.dashboard as dashboard  # noqa: E402

try:  # the entry points' module since the dashboard's split; before it they were in dashboard.py
    from flowrl.metrics.dashboard_server import export_html  # noqa: E402
except ImportError:  # a baseline tree (PYTHONPATH=...) from before the split
    export_html = dashboard.export_html

FIRST_PAINT_JS = "(performance.getEntriesByName('flowrl:first-paint')[0] || {}).startTime || null"
FILTER = "actor/"


def filter_js(text: str) -> str:
    """Sets the filter from a timer (a slow filter then cannot time the DevTools call out) and
    leaves in ``window.__flowrl_filter`` the milliseconds until the frame after it, and how many
    ``metric:`` figures are shown."""
    return (f"window.__flowrl_filter = null; setTimeout(async () => {{ const t0 = performance.now();"
            f" Bokeh.documents[0].get_model_by_name('metric_filter').value_input = {json.dumps(text)};"
            " await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));"
            " const ms = performance.now() - t0;"
            " const shown = [...Bokeh.documents[0].all_models].filter((m) => m.name && m.name.startsWith('metric:')"
            " && m.visible).length; window.__flowrl_filter = {ms, shown}; }, 0)")


def open_once(page: Path, *, with_filter: bool, filter_timeout_s: float) -> dict:
    with Chromium(timeout_s=120) as browser:
        cpu0 = process_tree_cpu_s(browser._proc.pid)
        browser.open(page.as_uri())
        all_ms = float(browser.wait_for(RENDERED_MS_JS, timeout_s=600, poll_s=0.02))
        cpu_s = process_tree_cpu_s(browser._proc.pid) - cpu0
        first_ms = browser.evaluate(FIRST_PAINT_JS) or all_ms
        out = {"first_paint_s": round(first_ms / 1000, 3), "all_drawn_s": round(all_ms / 1000, 3),
               "browser_cpu_s": round(cpu_s, 2)}
        if with_filter:
            for name, text in (("filter_s", FILTER), ("unfilter_s", "")):
                browser.evaluate(filter_js(text))
                try:
                    res = browser.wait_for("window.__flowrl_filter", timeout_s=filter_timeout_s, poll_s=0.05)
                except TimeoutError:
                    out[name] = None
                    break
                out[name] = round(res["ms"] / 1000, 3)
                out[name.replace("_s", "_shown")] = res["shown"]
    return out


def measure(runs: list[Path], out: Path, repeats: int, *, with_filter: bool, filter_timeout_s: float) -> dict:
    start = time.perf_counter()
    export_html(runs if len(runs) > 1 else runs[0], out)
    export_s = time.perf_counter() - start
    opens = [open_once(out, with_filter=with_filter, filter_timeout_s=filter_timeout_s) for _ in range(repeats)]
    result = {"export_s": round(export_s, 2), "html_mb": round(out.stat().st_size / 2**20, 2), "opens": opens}
    for key in opens[0]:
        values = [o.get(key) for o in opens]
        if all(isinstance(v, (int, float)) for v in values):
            result[f"{key}_median"] = round(median(values), 3)
    # the old name of the first-render number: every figure drawn
    result["render_s_median"] = result["all_drawn_s_median"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pages", default="60,1000,2x1000", help="comma-separated: 60, 1000, 2x1000")
    parser.add_argument("--filter-timeout", type=float, default=120.0,
                        help="seconds before a filter step counts as null")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "dashboard_render.json"))
    args = parser.parse_args()
    wanted = set(args.pages.split(","))
    print(f"flowrl.metrics.dashboard from {dashboard.__file__}", flush=True)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        r60 = write_synthetic_run(tmp / "r60", 60, seed=0)
        tok = r60 / "tokenizer"
        r1k = write_synthetic_run(tmp / "r1000", 1000, seed=1, tokenizer_dir=tok)
        r1k_b = write_synthetic_run(tmp / "r1000b", 1000, seed=2, lift=0.3, tokenizer_dir=tok)
        pages = (("60", "60 steps", [r60]), ("1000", "1000 steps", [r1k]), ("2x1000", "2 x 1000 steps", [r1k, r1k_b]))
        for tag, name, runs in pages:
            if tag not in wanted:
                continue
            results[name] = measure(runs, tmp / f"{tag}.html", args.repeats, with_filter=tag == "1000",
                                    filter_timeout_s=args.filter_timeout)
            print(name, json.dumps(results[name]), flush=True)

    def cell(r: dict, key: str) -> str:
        """median (min-max) over the opens; '> T' for a filter step that timed out."""
        if key not in r["opens"][0]:
            return "-"
        values = [o.get(key) for o in r["opens"]]
        if any(v is None for v in values):
            return f"> {args.filter_timeout:.0f}"
        return f"{median(values):.3g} ({min(values):.3g}-{max(values):.3g})"

    rows = [[name, *(cell(r, k) for k in ("first_paint_s", "all_drawn_s", "browser_cpu_s", "filter_s", "unfilter_s")),
             r["export_s"], r["html_mb"]] for name, r in results.items()]
    print(table(["page", "first paint s", "all drawn s", "browser CPU s", f"filter '{FILTER}' s", "clear filter s",
                 "export s", "HTML MiB"], rows))
    write_json({"machine": machine_info(), "results": results}, args.out)


if __name__ == "__main__":
    main()
