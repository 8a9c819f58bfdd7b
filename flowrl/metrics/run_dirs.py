"""Find run directories: a run directory itself, or the runs at any depth below a directory
(``runs/<project>/<experiment>``), and label them apart for a legend. Split from
:mod:`flowrl.metrics.run_reader`, which reads one run and re-exports these names."""

from __future__ import annotations

import os
from pathlib import Path

METRICS_FILE = "metrics.jsonl"

#: Directories :func:`find_runs` looks at below one path at most (a mistyped ``~`` is refused, not walked).
MAX_DIRS_SEARCHED = 20_000
RUN_DIR_HINT = "the directory a run wrote (its last line says 'run dir ...'; by default runs/<project>/<experiment>)"


def find_runs(paths: list[str | Path]) -> list[Path]:
    """The run directories named by ``paths``: a run directory itself, or a directory with runs
    at any depth below it (``runs/`` holds ``runs/<project>/<experiment>``), sorted by path; a
    run's own subdirectories are not searched. Raises ``ValueError`` naming the path and the fix
    for a path that is neither, and when a run is named twice."""
    runs: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            raise ValueError(f"RUN_DIR {path}: no such directory; fix: pass {RUN_DIR_HINT}")
        if is_run_dir(path):
            runs.append(path)
            continue
        inside = runs_below(path)
        if not inside:
            raise ValueError(f"RUN_DIR {path}: no flowrl run in it or below it (a run directory holds config.yaml, "
                             f"metrics.jsonl or experience/); fix: pass {RUN_DIR_HINT}, or start a run there first")
        runs += inside
    resolved = [p.resolve() for p in runs]
    twice = sorted({str(p) for p in resolved if resolved.count(p) > 1})
    if twice:
        raise ValueError(f"RUN_DIR {twice[0]}: named twice; fix: name each run once")
    return runs


def runs_below(root: Path) -> list[Path]:
    """The run directories below ``root`` at any depth, sorted by path; hidden directories and
    links are skipped, and a run's own subdirectories (experience/, checkpoints/) not searched."""
    found: list[Path] = []
    searched = 0
    for folder, subdirs, _ in os.walk(root):
        searched += 1
        if searched > MAX_DIRS_SEARCHED:
            raise ValueError(f"RUN_DIR {root}: more than {MAX_DIRS_SEARCHED} directories below it and no end of the "
                             f"search in sight; fix: pass a directory closer to the runs, e.g. {RUN_DIR_HINT}")
        keep = []
        for name in sorted(subdirs):
            sub = Path(folder) / name
            if name.startswith(".") or sub.is_symlink():
                continue
            if is_run_dir(sub):
                found.append(sub)
            else:
                keep.append(name)
        subdirs[:] = keep
    return sorted(found)


def is_run_dir(path: Path) -> bool:
    return any((path / f).exists() for f in ("config.yaml", METRICS_FILE, "experience"))


def run_labels(runs: list[Path]) -> list[str]:
    """Short distinct labels for the legend: the directory names, with as many parent names as
    it takes to tell equal names apart (``a/run``, ``b/run``)."""
    depth = 1
    while True:
        labels = ["/".join(p.resolve().parts[-depth:]) for p in runs]
        if len(set(labels)) == len(labels) or depth > max(len(p.resolve().parts) for p in runs):
            return labels
        depth += 1
