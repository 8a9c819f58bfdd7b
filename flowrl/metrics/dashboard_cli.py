"""``flowrl dashboard RUN_DIR [RUN_DIR ...]``: serve the per-step dashboard, or ``--export out.html``.

    flowrl dashboard runs/flowrl/grpo-1a2b3c                  live, http://127.0.0.1:5006/
    flowrl dashboard runs/flowrl/a runs/flowrl/b              two runs overlaid, a legend per run
    flowrl dashboard runs/                                    every run below runs/, at any depth
    flowrl dashboard runs/flowrl/grpo-1a2b3c --port 0         a free port (printed)
    flowrl dashboard runs/flowrl/grpo-1a2b3c --export d.html  one self-contained HTML file, no server

The server binds 127.0.0.1 only (reach it from elsewhere through an SSH tunnel). ``run`` returns
0, or 2 with ``error: ...`` on stderr for a bad directory or option.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", nargs="+",
                        help="a run directory (trainer.run_dir), finished or still running, or a directory with runs below it (any depth); "
                             "several runs are overlaid")
    parser.add_argument("--port", type=int, default=5006, help="port on 127.0.0.1 (default 5006; 0: a free port)")
    parser.add_argument("--export", metavar="OUT.html", default=None,
                        help="write a static self-contained HTML file instead of serving")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between re-reads of the run's files (default 2)")
    parser.add_argument("--max-samples", type=int, default=64, help="sample rows shown per step (default 64)")


def run(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("bokeh") is None:  # an extra
        print("error: flowrl dashboard needs bokeh; fix: pip install 'flowrl[dashboard]'", file=sys.stderr)
        return 2
    from flowrl.metrics.run_reader import find_runs

    problems = []
    try:
        runs = find_runs(args.run_dir)
    except ValueError as exc:
        problems.append(str(exc))
    if not 0 <= args.port <= 65535:
        problems.append(f"--port {args.port}: not a port; fix: use 0..65535 (0: a free one)")
    if args.interval <= 0:
        problems.append(f"--interval {args.interval}: must be > 0; fix: use e.g. 2")
    if args.max_samples < 1:
        problems.append(f"--max-samples {args.max_samples}: must be >= 1; fix: use e.g. 64")
    if problems:
        print("error: " + "\nerror: ".join(problems), file=sys.stderr)
        return 2
    shown = str(runs[0]) if len(runs) == 1 else f"{len(runs)} runs"
    # at once: loading Bokeh takes seconds (more on a busy machine), building the first page more
    # (the server prints its URL once a page is quick to get)
    print(f"flowrl dashboard: {'writing ' + args.export + ' for' if args.export else 'starting the server for'} "
          f"{shown} ...", flush=True)
    from flowrl.metrics.dashboard_server import export_html, serve

    if args.export:
        out = export_html(runs, args.export, max_samples=args.max_samples)
        print(f"wrote {out} ({len(runs)} run{'s' if len(runs) > 1 else ''})")
        return 0
    try:
        serve(runs, port=args.port, interval_s=args.interval, max_samples=args.max_samples,
              on_ready=lambda line: print(line, flush=True))
    except OSError as exc:  # port in use
        print(f"error: --port {args.port}: {exc}; fix: pick another port, or --port 0", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
