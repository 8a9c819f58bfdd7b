"""Clusters: a LocalCluster, workers as SLURM jobs (dask-jobqueue), or an existing scheduler.

``start_cluster(cluster_cfg, pools)`` returns a :class:`~flowrl.cluster.launch.ClusterHandle`
(client, cluster, controller worker) whose ``close()`` always cancels the jobs it started; the
config-side pieces (pools, cluster specs) live in :mod:`flowrl.config.pools` and
:mod:`flowrl.config.cluster_spec` (pure, no Dask); the pool names are part of this package's face.
Plain imports: ``launch`` imports Dask and dask-jobqueue inside the functions that start a cluster.
"""

from flowrl.cluster.launch import start_cluster
from flowrl.config.pools import COLOCATED_POOL, CONTROLLER, Pool, resolve_pools

__all__ = ["COLOCATED_POOL", "CONTROLLER", "Pool", "resolve_pools", "start_cluster"]
