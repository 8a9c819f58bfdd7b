"""Train backends, chosen by ``actor.strategy``: registered by import string so megatron-core is
imported only when chosen."""

from flowrl.registry import Registry

TRAIN_BACKENDS: Registry = Registry("train backend")
TRAIN_BACKENDS.register("dp", "flowrl.backends.train.torch_dp:TorchDPEngine")
TRAIN_BACKENDS.register("megatron", "flowrl.backends.train.megatron.adapter:MegatronTrainEngine")
