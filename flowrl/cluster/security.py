"""Who may talk to the run's Dask cluster: mutual TLS with per-run credentials (``cluster.tls``,
on by default).

A run without certificate files gets its own temporary CA (``Security.temporary()``: a
self-signed certificate and its key, made with ``cryptography``, held in memory) used by the
client, the scheduler and every worker; each side requires the other's certificate, so a client
or worker without this run's credentials is refused at the handshake. LocalCluster workers
receive the credentials from their nanny (through the process pipe, no file). SLURM jobs receive
them through the environment of ``sbatch`` (Dask's own ``DASK_DISTRIBUTED__COMM__TLS__*``
settings, readable only by the job's user): dask-jobqueue would otherwise write them to files
in its shared directory.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

#: Dask settings (as environment variables) of a worker's TLS, by ``Security`` attribute.
TLS_ENV = {
    "tls_ca_file": "DASK_DISTRIBUTED__COMM__TLS__CA_FILE",
    "tls_worker_cert": "DASK_DISTRIBUTED__COMM__TLS__WORKER__CERT",
    "tls_worker_key": "DASK_DISTRIBUTED__COMM__TLS__WORKER__KEY",
}


def make_security(cfg: Any) -> Any:
    """A ``distributed.Security`` for ``cluster.tls`` (a ClusterConfig), or None: the given PEM
    files, else per-run temporary credentials. ``kind=address`` with a ``tcp://`` address has no
    TLS (the scheduler's owner decides; flowrl warns)."""
    if not cfg.tls:
        return None
    from distributed.security import Security

    if cfg.tls_cert:
        return Security(
            tls_ca_file=cfg.tls_ca_file,
            tls_client_cert=cfg.tls_cert, tls_client_key=cfg.tls_key,
            tls_scheduler_cert=cfg.tls_cert, tls_scheduler_key=cfg.tls_key,
            tls_worker_cert=cfg.tls_cert, tls_worker_key=cfg.tls_key,
            require_encryption=True,
        )
    if cfg.kind == "address":
        return None
    return Security.temporary()


def worker_tls_env(security: Any) -> dict[str, str]:
    """The environment that gives a ``dask worker`` started without ``--tls-*`` options the
    worker credentials of ``security`` (PEM text or file paths alike)."""
    env = {var: getattr(security, attr) for attr, var in TLS_ENV.items() if getattr(security, attr)}
    env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] = "True"
    return env


def slurm_cluster_class(jobqueue: Any, env: dict[str, str]) -> Any:
    """``SLURMCluster`` whose jobs get the worker credentials in ``sbatch``'s environment
    (``env``) instead of temporary files named on the job's command line."""

    from dask_jobqueue.slurm import SLURMJob

    class FlowrlSLURMJob(SLURMJob):
        async def _submit_job(self, script_filename: str) -> str:
            cmd = shlex.split(self.submit_command) + [script_filename]
            return await self._call(cmd, env={**os.environ, **env})

    class FlowrlSLURMCluster(jobqueue.SLURMCluster):
        job_cls = FlowrlSLURMJob

        def _get_worker_security(self, security: Any) -> None:
            return None  # the jobs read their credentials from the environment (env)

    return FlowrlSLURMCluster
