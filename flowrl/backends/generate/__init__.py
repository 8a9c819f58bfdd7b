"""Generation backends (``rollout.name``: ``hf``, ``vllm``), registered by import string in
:mod:`flowrl.backends.registry` so vLLM is imported only when chosen."""
