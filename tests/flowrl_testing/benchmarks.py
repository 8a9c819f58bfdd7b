"""The benchmark scripts (``benchmarks/*.py``, not a package) loaded as modules, for tests of
their bookkeeping."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(script: str, module_name: str) -> ModuleType:
    """``benchmarks/<script>`` imported as ``module_name`` (registered in ``sys.modules``, so its
    dataclasses and pickles resolve)."""
    spec = importlib.util.spec_from_file_location(module_name, BENCH_DIR / script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
