"""flowrl: RL post-training of LLMs where each iteration is a Dask task graph.

Heavy imports (torch, transformers, dask) happen inside the modules that need them, so
``import flowrl`` and ``flowrl --help`` stay fast.
"""

from flowrl._version import __version__

__all__ = ["__version__"]
