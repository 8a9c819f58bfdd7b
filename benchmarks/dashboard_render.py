"""First render of the dashboard in headless Chromium, for synthetic runs of 60 and 1,000 steps
(and two 1,000-step runs overlaid): the time from the navigation's start until every figure has
drawn (tests/dist/chromium_cdp.py: ``RENDERED_MS_JS``). The run directories are written without
training (tests/flowrl_testing/synthetic_run.py: a default GRPO run's ~50 metric keys).

    python benchmarks/dashboard_render.py [--repeats 3] [--out benchmarks/results/dashboard_render.json]

Each page is exported once (``flowrl dashboard RUN --export``) and opened ``--repeats`` times in a
fresh browser; the table gives the median and the spread, and the export's size and build time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "dist"), str(ROOT / "benchmarks")]

from _common import machine_info, median, table, write_json  # noqa: E402
from chromium_cdp import Chromium  # noqa: E402
from flowrl_testing.synthetic_run import write_synthetic_run  # noqa: E402

from flowrl.metrics.dashboard import export_html  # noqa: E402


def measure(runs: list[Path], out: Path, repeats: int) -> dict:
    start = time.perf_counter()
    export_html(runs if len(runs) > 1 else runs[0], out)
    export_s = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        with Chromium() as browser:
            times.append(browser.first_render_ms(out.as_uri()) / 1000)
    return {"export_s": round(export_s, 2), "html_mb": round(out.stat().st_size / 2**20, 2),
            "render_s": [round(t, 3) for t in times], "render_s_median": round(median(times), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "dashboard_render.json"))
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        r60 = write_synthetic_run(tmp / "r60", 60, seed=0)
        tok = r60 / "tokenizer"
        r1k = write_synthetic_run(tmp / "r1000", 1000, seed=1, tokenizer_dir=tok)
        r1k_b = write_synthetic_run(tmp / "r1000b", 1000, seed=2, lift=0.3, tokenizer_dir=tok)
        for name, runs in (("60 steps", [r60]), ("1000 steps", [r1k]), ("2 x 1000 steps", [r1k, r1k_b])):
            results[name] = measure(runs, tmp / f"{name.replace(' ', '_')}.html", args.repeats)
            print(name, results[name], flush=True)
    rows = [[name, r["render_s_median"], f"{min(r['render_s'])}-{max(r['render_s'])}", r["export_s"], r["html_mb"]]
            for name, r in results.items()]
    print(table(["page", "first render s (median)", "range", "export s", "HTML MiB"], rows))
    write_json({"machine": machine_info(), "results": results}, args.out)


if __name__ == "__main__":
    main()
