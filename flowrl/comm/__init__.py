"""torch.distributed plumbing below the actors and the backends: free ports, the rendezvous
store a group meets on (``store``), and joint process groups spanning several worker groups
(``joint``). torch is imported only inside the functions that need it."""

from flowrl.comm.joint import JointSpec, close_all, get, join
from flowrl.comm.store import free_port, rendezvous_store, reserve_port

__all__ = ["JointSpec", "close_all", "free_port", "get", "join", "rendezvous_store", "reserve_port"]
