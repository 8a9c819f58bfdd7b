"""Resource pools on a LocalCluster: colocated and split placement, the loopback-only network
surface of the default configuration, and TLS one setting away."""

import ipaddress

import psutil
import pytest

from flowrl.actors import GroupMesh, Session
from flowrl.actors.session import GroupSpec
from flowrl.cluster import COLOCATED_POOL, CONTROLLER
from flowrl.config import ClusterConfig, PoolConfig

ECHO = "flowrl_testing.roles:EchoRole"
SIZES = {"rollout": 1, "actor": 2, "ref": 1}


def _specs():
    return [GroupSpec(name, ECHO, {"tag": name}, GroupMesh(dp=size)) for name, size in SIZES.items()]


def _resources(session):
    return {a: w["resources"] for a, w in session.client.scheduler_info(n_workers=-1)["workers"].items()}


@pytest.fixture(scope="module")
def colocated():
    s = Session.start(sum(SIZES.values()), cluster=ClusterConfig(dashboard=True, startup_timeout_s=120, timeout_s=60),
                      group_sizes=SIZES)
    try:
        groups = s.create_groups(_specs())
        yield s, groups
    finally:
        s.close()


def test_colocated_pool_hosts_every_group_on_distinct_workers(colocated):
    session, groups = colocated
    res = _resources(session)
    tags = sorted(r for rr in res.values() for r in rr)
    assert tags == sorted([CONTROLLER] + [COLOCATED_POOL] * 4)
    placed = [a for g in groups.values() for a in g.addresses]
    assert len(placed) == len(set(placed)) == 4  # one rank per worker process, never two
    assert all(res[a] == {COLOCATED_POOL: 1} for a in placed)
    assert res[session.controller] == {CONTROLLER: 1} and session.controller not in placed
    pids = {name: g.run(g.reserve(), "pid")[0] for name, g in groups.items()}
    assert len({p for ps in pids.values() for p in ps}) == 4
    actor = groups["actor"]
    assert actor.run(actor.reserve(), "all_reduce", 1.0)[0] == [3.0, 3.0]  # its own gloo group


def test_default_configuration_listens_only_on_loopback(colocated):
    session, _ = colocated
    info = session.client.scheduler_info(n_workers=-1)
    assert session.client.scheduler.address.startswith("tls://127.0.0.1:")
    assert all(a.startswith("tls://127.0.0.1:") for a in info["workers"])
    assert all(w["nanny"].startswith("tls://127.0.0.1:") for w in info["workers"].values())
    assert session.dashboard_link.startswith("http://127.0.0.1:")
    worker_pids = set(session.client.run(lambda: __import__("os").getpid()).values())
    nanny_pids = set(session.client.run(lambda: __import__("os").getpid(), nanny=True).values())
    me = psutil.Process()
    processes = [me] + [psutil.Process(p) for p in worker_pids | nanny_pids]
    listening = [(p.pid, c.laddr) for p in processes for c in p.net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    assert len(listening) >= 2 * len(worker_pids) + 2  # scheduler, dashboard, every worker and nanny
    exposed = [(pid, addr) for pid, addr in listening if not ipaddress.ip_address(addr.ip).is_loopback]
    assert not exposed, f"listening beyond loopback: {exposed}"


def test_split_placement_puts_each_group_on_its_own_pool():
    cluster = ClusterConfig(placement="split", startup_timeout_s=120, timeout_s=60)
    with Session.start(4, cluster=cluster, group_sizes=SIZES) as session:
        groups = session.create_groups(_specs())
        res = _resources(session)
        for name, group in groups.items():
            assert [res[a] for a in group.addresses] == [{name: 1}] * SIZES[name]
        assert res[session.controller] == {CONTROLLER: 1}


def test_declared_pool_too_small_at_placement_names_the_pool():
    # pools sized for fewer ranks than the groups placed on them: refused with the pool named
    cluster = ClusterConfig(pools=[PoolConfig(name="gen", groups=["rollout"]), PoolConfig(name="train", groups=["actor"])],
                            startup_timeout_s=120, timeout_s=60)
    with Session.start(2, cluster=cluster, group_sizes={"rollout": 1, "actor": 1}) as session:
        with pytest.raises(RuntimeError, match="pool 'train' has 1 free workers, 2 needed"):
            session.create_groups([GroupSpec("actor", ECHO, {}, GroupMesh(dp=2))])


def test_tls_is_the_default_and_a_client_without_the_runs_credentials_is_refused(tmp_path):
    """The default cluster: mutual TLS with this run's credentials. A plain tcp:// client, a
    tls:// client without a certificate and one with another CA's certificate all fail at the
    handshake; only the run's own client computes. Scratch space lands where the run says."""
    import asyncio

    from distributed import Client
    from distributed.security import Security

    with Session.start(1, cluster=ClusterConfig(startup_timeout_s=120, timeout_s=60),
                       scratch_dir=str(tmp_path / "dask-scratch")) as session:
        address = session.client.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        assert all(a.startswith("tls://") for a in session.worker_addresses())
        assert session.client.submit(sum, [1, 2], pure=False).result(timeout=60) == 3
        plain = "tcp://" + address.split("://", 1)[1]
        strangers = [(plain, None), (address, None), (address, Security.temporary())]

        async def connect(target, security):
            # an asynchronous client in this thread's own loop: a synchronous Client would first
            # start an IO-loop thread, which distributed gives 10 s (an AssertionError, not a
            # refusal, on a loaded machine)
            async with Client(target, security=security, timeout=5, asynchronous=True,
                              set_as_default=False):
                pass

        loop = asyncio.new_event_loop()  # not asyncio.run: it leaves the main thread without a current loop
        try:
            for target, security in strangers:
                with pytest.raises((OSError, TimeoutError, asyncio.TimeoutError, ValueError, TypeError)):
                    loop.run_until_complete(asyncio.wait_for(connect(target, security), timeout=60))
        finally:
            loop.close()
        dirs = session.client.run(lambda dask_worker: dask_worker.local_directory)
        assert dirs and all(d.startswith(str(tmp_path / "dask-scratch")) for d in dirs.values()), dirs
