"""megatron-core training backend: Llama/Qwen2 GPTModel with dp x tp x pp (x vpp) on gloo or NCCL.

Modules: ``compat`` (CPU patches for megatron-core), ``model`` (TransformerConfig / GPTModel from an
HF config), ``convert`` (pure HF <-> megatron shard adapter), ``batching`` (padded micro-batches),
``vocab_parallel`` (log-probs and entropy over a TP-sharded vocabulary), ``engine``
(``MegatronEngine``), ``policy`` (``MegatronTrainEngine``: the registered train backend),
``value`` (the critic's value model and ``MegatronValueTrainEngine``), ``checkpoint`` (sharded
checkpoints), ``options`` (engine keyword arguments and pre-flight checks, torch-free). Nothing
heavy is imported here: import the module you need. Test helpers: ``tests/flowrl_testing/megatron.py``.
"""
