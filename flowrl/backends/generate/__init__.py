"""Generation backends (``rollout.name``: ``hf``, ``vllm``), registered by import string in
:mod:`flowrl.catalog.backends` so vLLM is imported only when chosen."""
