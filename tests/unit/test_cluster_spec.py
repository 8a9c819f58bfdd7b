"""Cluster specs, pools and SLURM job settings: loading and validation (no workers started)."""

import dataclasses
import logging
from pathlib import Path

import pytest

from flowrl.cluster import COLOCATED_POOL, Pool, resolve_pools
from flowrl.cluster.launch import gres_directive, is_loopback, slurm_cluster_kwargs, warn_exposed
from flowrl.cluster.pools import choose_workers
from flowrl.config import ConfigError, load_config

REPO = Path(__file__).parents[2]
SIZES = {"rollout": 1, "actor": 2, "ref": 1}


def test_default_cluster_is_a_loopback_local_cluster_with_one_hybrid_pool_and_tls():
    cfg = load_config(None, [])
    assert cfg.cluster.kind == "local" and cfg.cluster.host == "127.0.0.1" and cfg.cluster.tls
    assert (cfg.cluster.placement, cfg.placement) == ("auto", "hybrid")
    # hybrid: 2 processes, each holding a rank of rollout, actor and ref; colocated: one process per rank
    hybrid = dataclasses.replace(cfg.cluster, placement=cfg.placement)
    assert resolve_pools(hybrid, cfg.worker_group_sizes) == [Pool(COLOCATED_POOL, 2, ("rollout", "actor", "ref"))]
    colocated = load_config(None, ["cluster.placement=colocated"])
    pools = resolve_pools(colocated.cluster, colocated.worker_group_sizes)
    assert pools == [Pool(COLOCATED_POOL, 6, ("rollout", "actor", "ref"))]


def test_split_placement_gives_each_group_its_own_pool():
    cfg = load_config(None, ["cluster.placement=split"])
    pools = resolve_pools(cfg.cluster, SIZES)
    assert pools == [Pool("rollout", 1, ("rollout",)), Pool("actor", 2, ("actor",)), Pool("ref", 1, ("ref",))]


def test_declared_pools_resolve_with_automatic_and_explicit_sizes():
    cfg = load_config(None, ["cluster.pools=[{name: train, groups: [actor, ref]}, {name: gen, groups: [rollout], workers: 3}]"])
    assert resolve_pools(cfg.cluster, SIZES) == [Pool("train", 3, ("actor", "ref")), Pool("gen", 3, ("rollout",))]


@pytest.mark.parametrize(
    "override, key, words",
    [
        ("cluster.pools=[{name: train, groups: [actor]}]", "cluster.pools", "no pool for group(s) ['rollout', 'ref']"),
        ("cluster.pools=[{name: a, groups: [actor, rollout, ref]}, {name: b, groups: [actor]}]", "cluster.pools[1].groups", "already in pool 'a'"),
        ("cluster.pools=[{name: a, groups: [actor, rollout, ref, critic]}]", "cluster.pools[0].groups", "does not start"),
        ("cluster.pools=[{name: a, groups: [actor, rollout, ref], workers: 3}]", "cluster.pools[0].workers", "fewer than the 6 ranks"),
        ("cluster.pools=[{name: 'bad name', groups: [actor]}]", "cluster.pools[0].name", "letters, digits"),
        ("cluster.pools=[{name: a, groups: []}]", "cluster.pools[0].groups", "at least one"),
        ("cluster.placement=spread", "cluster.placement", "not one of"),
    ],
)
def test_bad_pools_fail_naming_key_value_and_fix(override, key, words):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert info.value.key == key and words in str(info.value) and info.value.fix


@pytest.mark.parametrize(
    "override, key",
    [
        ("cluster.slurm.walltime=1:00:00", "cluster.slurm.walltime"),  # YAML reads it as 3600: refused
        ("cluster.slurm.walltime=forever", "cluster.slurm.walltime"),
        ("cluster.slurm.memory=lots", "cluster.slurm.memory"),
        ("cluster.slurm.cores=0", "cluster.slurm.cores"),
        ("cluster.slurm.processes=4", "cluster.slurm.processes"),  # more processes than cores=1
        ("cluster.slurm.gpus_per_job=-1", "cluster.slurm.gpus_per_job"),
        ("cluster.slurm.job_name=a b", "cluster.slurm.job_name"),
        ("cluster.kind=cloud", "cluster.kind"),
        ("cluster.kind=address", "cluster.scheduler_address"),
        ("cluster.scheduler_address=localhost:8786", "cluster.scheduler_address"),
        (["cluster.kind=address", "cluster.scheduler_address=localhost:8786"], "cluster.scheduler_address"),
        ("cluster.interface=nosuch0", "cluster.interface"),
        ("cluster.tls_cert=/nonexistent.pem", "cluster.tls_cert"),
    ],
)
def test_bad_cluster_values_fail_before_any_worker(override, key):
    with pytest.raises(ConfigError) as info:
        load_config(None, override if isinstance(override, list) else [override])
    assert info.value.key == key and info.value.fix


def test_tls_cert_files_need_all_three_and_must_exist(tmp_path):
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("x")
    with pytest.raises(ConfigError, match="needs all three"):
        load_config(None, ["cluster.tls=true", f"cluster.tls_cert={tmp_path / 'cert.pem'}"])
    cfg = load_config(None, ["cluster.tls=true", f"cluster.tls_ca_file={tmp_path / 'ca.pem'}",
                             f"cluster.tls_cert={tmp_path / 'cert.pem'}", f"cluster.tls_key={tmp_path / 'key.pem'}"])
    assert cfg.cluster.tls
    with pytest.raises(ConfigError, match="tls:// scheduler: connecting needs its certificates"):
        load_config(None, ["cluster.tls=true", "cluster.kind=address", "cluster.scheduler_address=tls://10.0.0.1:8786"])
    # a plain tcp:// scheduler (its owner's choice) is accepted with the default cluster.tls=true
    assert load_config(None, ["cluster.kind=address", "cluster.scheduler_address=tcp://10.0.0.1:8786"]).cluster.tls


@pytest.mark.parametrize("value", ["lots", "2.5", "-1GB", "4 parsecs"])
def test_memory_limit_must_be_a_dask_memory_limit(value):
    with pytest.raises(ConfigError, match="cluster.memory_limit") as info:
        load_config(None, [f"cluster.memory_limit={value}"])
    assert "4GiB" in info.value.fix
    for ok in ("4GiB", "8GB", "0.25", "auto", "0"):
        assert load_config(None, [f"cluster.memory_limit={ok}"]).cluster.memory_limit == ok


def test_scheduler_address_goes_with_kind_address():
    cfg = load_config(None, ["cluster.kind=address", "cluster.scheduler_address=tcp://127.0.0.1:8786"])
    assert cfg.cluster.kind == "address"
    for kind in ("local", "slurm"):
        with pytest.raises(ConfigError) as info:
            load_config(None, [f"cluster.kind={kind}", "cluster.scheduler_address=tcp://127.0.0.1:8786"])
        assert info.value.key == "cluster.scheduler_address" and "cluster.kind=address" in info.value.fix


def test_slurm_without_dask_jobqueue_names_the_extra(monkeypatch):
    import flowrl.config.cluster_spec as spec

    monkeypatch.setattr(spec, "has_jobqueue", lambda: False)
    with pytest.raises(ConfigError) as info:
        load_config(None, ["cluster.kind=slurm"])
    assert info.value.key == "cluster.kind" and "flowrl[slurm]" in info.value.fix and "dask-jobqueue" in info.value.fix


def test_shipped_specs_load_and_slurm_spec_merges_under_the_run():
    pytest.importorskip("dask_jobqueue")
    local = load_config(REPO / "cluster" / "local.yaml")
    assert local.cluster.kind == "local" and local.cluster.dashboard
    cfg = load_config(None, [f"cluster.spec={REPO / 'cluster' / 'slurm.yaml'}", "cluster.slurm.memory=3GB",
                             "cluster.timeout_s=99"])
    assert cfg.cluster.kind == "slurm" and cfg.cluster.slurm.queue == "debug"  # from the spec
    assert cfg.cluster.slurm.memory == "3GB" and cfg.cluster.timeout_s == 99  # the run's keys win
    assert Path(cfg.cluster.spec).is_absolute()


def test_spec_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file") as info:
        load_config(None, ["cluster.spec=nope.yaml"])
    assert info.value.key == "cluster.spec"
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: {kind: local}\ntrainer: {seed: 1}\n")
    with pytest.raises(ConfigError, match="other than cluster"):
        load_config(None, [f"cluster.spec={bad}"])
    typo = tmp_path / "typo.yaml"
    typo.write_text("cluster: {kind: local, hots: 1.2.3.4}\n")
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"cluster.spec={typo}"])
    assert info.value.key == "cluster.hots" and "host" in info.value.fix


def test_spec_path_is_also_found_next_to_the_config(tmp_path):
    (tmp_path / "mine.yaml").write_text("cluster: {kind: local, dashboard: true}\n")
    run = tmp_path / "run.yaml"
    run.write_text("cluster: {spec: mine.yaml}\n")
    assert load_config(run).cluster.dashboard


def test_slurm_job_script_binds_to_loopback_and_carries_the_settings(tmp_path):
    pytest.importorskip("dask_jobqueue")
    from flowrl.cluster.launch import import_jobqueue

    SLURMJob = import_jobqueue().slurm.SLURMJob  # noqa: N806 - a class

    cfg = load_config(None, [
        "cluster.kind=slurm", "cluster.slurm.queue=gpu", "cluster.slurm.account=rl", "cluster.slurm.cores=8",
        "cluster.slurm.processes=4", "cluster.slurm.memory=64GB", "cluster.slurm.gpus_per_job=4",
        "cluster.slurm.walltime=02:30:00", "cluster.slurm.job_script_prologue=['module load cuda/12.4']",
        "cluster.slurm.job_extra_directives=['--exclusive']",
    ]).cluster
    kwargs = slurm_cluster_kwargs(cfg, job_name="flowrl-test", log_dir=tmp_path)
    assert kwargs["interface"] == "lo" and kwargs["scheduler_options"]["interface"] == "lo"
    assert "--no-dashboard" in kwargs["worker_extra_args"]
    kwargs["job_extra_directives"] += gres_directive(cfg)
    kwargs.pop("scheduler_options"), kwargs.pop("silence_logs"), kwargs.pop("shared_temp_directory")
    script = SLURMJob("tcp://127.0.0.1:1234", name="w", **kwargs).job_script()
    for line in ("#SBATCH -p gpu", "#SBATCH -A rl", "#SBATCH --cpus-per-task=8", "#SBATCH -t 02:30:00",
                 "#SBATCH --gres=gpu:4", "#SBATCH --exclusive", "module load cuda/12.4",
                 "export GLOO_SOCKET_IFNAME=lo", "export OMP_NUM_THREADS=2", "--nworkers 4", "--interface lo",
                 "--dashboard-address 127.0.0.1:0"):
        assert line in script, line
    assert cfg.slurm.gres == "" and gres_directive(load_config(None, ["cluster.kind=slurm", "cluster.slurm.gres=gpu:a100:2"]).cluster) == ["--gres=gpu:a100:2"]


def test_importing_dask_jobqueue_keeps_ctrl_c_a_keyboard_interrupt():
    import subprocess
    import sys

    pytest.importorskip("dask_jobqueue")
    check = "import signal; {}; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    plain = subprocess.run([sys.executable, "-c", check.format("import dask_jobqueue")], capture_output=True, text=True)
    ours = subprocess.run([sys.executable, "-c", check.format("from flowrl.cluster.launch import import_jobqueue; "
                                                              "import_jobqueue()")], capture_output=True, text=True)
    assert plain.stdout.strip() == "False"  # dask_jobqueue alone replaces Ctrl-C with sys.exit()
    assert ours.stdout.strip() == "True", ours.stderr


def test_loopback_detection_and_loud_warning(capsys, caplog):
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("lo") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    assert warn_exposed("scheduler", "127.0.0.1", tls=False, dashboard=True) is None
    with caplog.at_level(logging.WARNING, logger="flowrl.cluster.launch"):
        msg = warn_exposed("scheduler", "10.1.2.3", tls=False, dashboard=False)
    assert "without TLS" in msg and "cluster.tls=true" in msg
    assert "WARNING: flowrl: the scheduler listens on 10.1.2.3" in capsys.readouterr().err
    assert any("without TLS" in r.message for r in caplog.records)
    assert warn_exposed("scheduler", "10.1.2.3", tls=True, dashboard=False) is None
    assert "no authentication" in warn_exposed("scheduler", "10.1.2.3", tls=True, dashboard=True)


def test_choose_workers_takes_distinct_workers_of_the_pool():
    resources = {"a": {"p": 1}, "b": {"q": 1}, "c": {"p": 1}, "d": {"p": 1}}
    assert choose_workers(["a", "b", "c", "d"], resources, "p", 2) == ["a", "c"]
    assert choose_workers(["a", "b"], resources, None, 2) == ["a", "b"]
    with pytest.raises(RuntimeError, match="pool 'q' has 1 free workers, 2 needed"):
        choose_workers(["a", "b", "c"], resources, "q", 2)


def test_starting_on_a_public_address_without_tls_warns_first(monkeypatch, capsys):
    import distributed

    from flowrl.cluster import start_cluster
    from flowrl.config import ClusterConfig

    class Stop(Exception):
        pass

    def refuse(*args, **kwargs):
        raise Stop  # stands in for LocalCluster/Client: no socket is opened by this test

    monkeypatch.setattr(distributed, "LocalCluster", refuse)
    monkeypatch.setattr(distributed, "Client", refuse)
    with pytest.raises(Stop):
        start_cluster(ClusterConfig(host="10.1.2.3", tls=False, low_latency=False), [Pool("p", 1, ("a",))])
    assert "WARNING: flowrl: the LocalCluster scheduler listens on 10.1.2.3" in capsys.readouterr().err
    with pytest.raises(Stop):
        start_cluster(ClusterConfig(kind="address", scheduler_address="tcp://10.1.2.3:8786", low_latency=False), [])
    assert "listens on 10.1.2.3, not loopback, without TLS" in capsys.readouterr().err
    with pytest.raises(Stop):
        start_cluster(ClusterConfig(low_latency=False), [Pool("p", 1, ("a",))])
    assert "WARNING" not in capsys.readouterr().err  # the default: loopback, no warning


def test_slurm_python_is_shell_quoted_where_it_is_pasted(monkeypatch, tmp_path):
    import shlex

    import flowrl.cluster.job_script as job_script
    import flowrl.config.cluster_spec as cluster_spec
    from flowrl.config import ClusterConfig
    from flowrl.config.cluster import SlurmConfig

    monkeypatch.setattr(cluster_spec, "interfaces", lambda: ["ib0", "lo"])
    monkeypatch.setattr(job_script, "interface_address", lambda name: "10.0.0.5")
    python = "/opt/my env/bin/python; touch /tmp/pwned"
    cfg = ClusterConfig(kind="slurm", interface="ib0", slurm=SlurmConfig(python=python))
    kwargs = slurm_cluster_kwargs(cfg, job_name="j", log_dir=tmp_path)
    (line,) = [x for x in kwargs["job_script_prologue"] if x.startswith("FLOWRL_WORKER_IP=")]
    words = shlex.split(line[len("FLOWRL_WORKER_IP=$("):-1])
    assert words[0] == python and words[1] == "-c" and "get_ip_interface('ib0')" in words[2]
    assert shlex.split(kwargs["python"]) == [python]  # the worker command of the job script
