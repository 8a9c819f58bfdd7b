"""Clusters: a LocalCluster, workers as SLURM jobs (dask-jobqueue), or an existing scheduler.

``start_cluster(cluster_cfg, pools)`` returns a :class:`~flowrl.cluster.launch.ClusterHandle`
(client, cluster, controller worker) whose ``close()`` always cancels the jobs it started; the
config-side pieces (pools, cluster specs) live in :mod:`flowrl.config.pools` and
:mod:`flowrl.config.cluster_spec` (pure, no Dask); the pool names are part of this package's face.
"""

from flowrl.config.pools import COLOCATED_POOL, CONTROLLER, Pool, resolve_pools

__all__ = ["COLOCATED_POOL", "CONTROLLER", "Pool", "resolve_pools", "start_cluster"]


def __getattr__(name: str):  # start_cluster imports distributed: load it on first use
    if name == "start_cluster":
        from flowrl.cluster.launch import start_cluster

        return start_cluster
    raise AttributeError(name)
