"""Generation backends, chosen by ``rollout.name``: registered by import string so vLLM is
imported only when chosen."""

from flowrl.registry import Registry

GEN_BACKENDS: Registry = Registry("generation backend")
GEN_BACKENDS.register("hf", "flowrl.backends.generate.hf:HFGenerator")
GEN_BACKENDS.register("vllm", "flowrl.backends.generate.vllm:VLLMGenerator")
