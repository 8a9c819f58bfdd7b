"""vLLM's engine settings of the rollout section (``rollout.max_num_seqs``, ``max_model_len``,
``enable_prefix_caching``, ``engine_kwargs``): their checks when the config loads, what reaches a
fake ``vllm.LLM`` through the role's keyword arguments and ``VLLMGenerator``, and verl's keys mapped
onto them (``flowrl.config.rollout_engine``, ``flowrl.backends.generate.vllm_settings``)."""

import dataclasses
import json
import sys
import types

import pytest

from flowrl.backends.generate import vllm as vbackend
from flowrl.backends.generate.vllm_settings import extra_engine_kwargs
from flowrl.config import ConfigError, RolloutConfig
from flowrl.config.loader import load_config, load_config_with_notes
from flowrl.config.rollout_engine import RESERVED_ENGINE_KWARGS
from flowrl.roles.specs import rollout_role_kwargs

AR = "actor_rollout_ref.rollout"


# ----------------------------------------------------------------------------- the config's checks
def test_the_settings_load_with_their_defaults_and_values():
    r = load_config(None, []).rollout
    assert (r.max_num_seqs, r.max_model_len, r.enable_prefix_caching, r.engine_kwargs) == (None, None, True, {})
    r = load_config(None, ["rollout.name=vllm", "rollout.max_num_seqs=64", "rollout.max_model_len=4096",
                           "rollout.enable_prefix_caching=false", "rollout.engine_kwargs.kv_cache_dtype=fp8",
                           "rollout.engine_kwargs.compilation_config.level=0"]).rollout
    assert (r.max_num_seqs, r.max_model_len, r.enable_prefix_caching) == (64, 4096, False)
    assert r.engine_kwargs == {"kv_cache_dtype": "fp8", "compilation_config": {"level": 0}}


@pytest.mark.parametrize("override,message", [
    ("rollout.max_num_seqs=0", r"rollout.max_num_seqs=0: must be an integer >= 1, or null; fix: use null"),
    ("rollout.max_model_len=-5", r"rollout.max_model_len=-5: must be an integer >= 1, or null"),
    ("rollout.max_num_seqs=many", r"rollout.max_num_seqs='many': expected an integer"),
    ("rollout.enable_prefix_caching=maybe", r"rollout.enable_prefix_caching='maybe': expected true or false"),
    ("rollout.engine_kwargs=3", r"rollout.engine_kwargs=3: expected a mapping of names to values; "
                                r"fix: write rollout.engine_kwargs.<name>=<value>"),
    ("rollout.max_num_seqs=10000", r"rollout.max_num_batched_tokens=8192: must be >= vLLM's max_num_seqs=10000.*"
                                   r"fix: set rollout.max_num_batched_tokens=10000, or a smaller max_num_seqs"),
    ("rollout.engine_kwargs.max_num_seqs=8", r"rollout.engine_kwargs.max_num_seqs=8: is a vllm.LLM argument flowrl "
                                             r"sets itself; fix: drop it and set rollout.max_num_seqs"),
    ("rollout.engine_kwargs.tensor_parallel_size=2", r"fix: drop it and set rollout.tensor_model_parallel_size"),
    ("rollout.engine_kwargs.model=/x", r"rollout.engine_kwargs.model='/x'.*fix: drop it and set model.path"),
    ("rollout.engine_kwargs.load_format=auto", r"fix: drop it \(flowrl starts the engine without reading weights"),
    ("rollout.engine_kwargs.worker_extension_cls=a.B", r"fix: drop it \(flowrl's weight sync"),
])
def test_bad_values_fail_when_the_config_loads(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["rollout.name=vllm", override])


def test_the_hf_backend_leaves_them_unread_as_it_does_enforce_eager():
    """The rules about vllm's keys apply where vllm is chosen (its spec's config_keys); the types always."""
    r = load_config(None, ["rollout.name=hf", "rollout.engine_kwargs.model=/x", "rollout.max_num_seqs=10000"]).rollout
    assert r.engine_kwargs == {"model": "/x"} and rollout_role_kwargs(r, max_prompt_length=8, seed=0) == {}
    with pytest.raises(ConfigError, match="rollout.max_num_seqs=0"):
        load_config(None, ["rollout.name=hf", "rollout.max_num_seqs=0"])


def test_every_argument_flowrl_sets_is_reserved(monkeypatch, tmp_path):
    """What _engine_kwargs sets in any mode (CPU and CUDA, LoRA, a VLM, the external launcher) is
    refused in rollout.engine_kwargs: the extra arguments, passed last, never replace one of them."""
    vlm = tmp_path / "vlm"
    vlm.mkdir()
    (vlm / "config.json").write_text(json.dumps({"model_type": "qwen2_vl", "image_token_id": 5, "vision_config": {}}))
    seen = set()
    for on_cuda in (False, True):
        for lora in (None, {"rank": 4, "alpha": 8, "target_modules": ["q_proj"]}):
            for external in (False, True):
                gen = _bare_generator(on_cuda=on_cuda, lora=lora, external=external)
                seen |= set(gen._engine_kwargs(str(vlm), **_ARGS))
    assert seen <= set(RESERVED_ENGINE_KWARGS), seen - set(RESERVED_ENGINE_KWARGS)


# ----------------------------------------------------------------------------- the role's kwargs
def test_null_keeps_todays_derivation_and_values_win():
    r = RolloutConfig(name="vllm", micro_batch_size=48, response_length=16)
    kw = rollout_role_kwargs(r, max_prompt_length=32, seed=0)["engine_kwargs"]
    assert (kw["max_num_seqs"], kw["max_model_len"], kw["enable_prefix_caching"]) == (48, 32 + 16, True)
    r = RolloutConfig(name="vllm", micro_batch_size=48, response_length=16, max_num_seqs=96, max_model_len=1024,
                      enable_prefix_caching=False, engine_kwargs={"swap_space": 2})
    kw = rollout_role_kwargs(r, max_prompt_length=32, seed=0)["engine_kwargs"]
    assert (kw["max_num_seqs"], kw["max_model_len"], kw["enable_prefix_caching"]) == (96, 1024, False)
    assert kw["extra_engine_kwargs"] == {"swap_space": 2}


def test_a_context_shorter_than_the_longest_rollout_is_refused_naming_both():
    r = RolloutConfig(name="vllm", response_length=16, max_model_len=40)
    with pytest.raises(ConfigError, match=r"rollout.max_model_len=40: is shorter than data.max_prompt_length=32 \+ "
                                          r"rollout.response_length=16 = 48.*fix: set rollout.max_model_len=48 or more"):
        rollout_role_kwargs(r, max_prompt_length=32, seed=0)
    assert rollout_role_kwargs(r, max_prompt_length=24, seed=0)["engine_kwargs"]["max_model_len"] == 40  # 24 + 16 fits
    # and when the config loads, with every other mistake, before anything starts; hf ignores the key
    with pytest.raises(ConfigError, match=r"rollout.max_model_len=10: is shorter than data.max_prompt_length=32"):
        load_config(None, ["rollout.name=vllm", "rollout.max_model_len=10"])
    load_config(None, ["rollout.name=hf", "rollout.max_model_len=10"])


# ----------------------------------------------------------------------------- a fake vllm.LLM
_ARGS = dict(dtype="auto", seed=0, enforce_eager=True, max_num_seqs=4, max_model_len=64, max_num_batched_tokens=64,
             enable_chunked_prefill=False, gpu_memory_utilization=0.5)


def _bare_generator(*, on_cuda=False, lora=None, external=False):
    gen = object.__new__(vbackend.VLLMGenerator)
    gen.on_cuda, gen.lora, gen.external_launcher, gen.tensor_parallel_size = on_cuda, lora, external, 1
    gen.free_cache_engine = False
    return gen


@dataclasses.dataclass
class _EngineArgs:  # a few of vLLM 0.32's EngineArgs fields: what engine_arg_names reads
    swap_space: float = 4
    kv_cache_dtype: str = "auto"
    mm_processor_cache_gb: float = 4


@pytest.fixture
def fake_vllm(monkeypatch, tmp_path):
    """``vllm`` whose ``LLM`` records its keyword arguments, on a CPU platform; a text model's directory."""
    made = []

    class LLM:
        def __init__(self, **kwargs):
            made.append(kwargs)

    vllm = types.ModuleType("vllm")
    vllm.LLM = LLM
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cuda_alike=lambda: False)
    arg_utils = types.ModuleType("vllm.engine.arg_utils")
    arg_utils.EngineArgs = _EngineArgs
    for name, module in (("vllm", vllm), ("vllm.platforms", platforms), ("vllm.engine", types.ModuleType("e")),
                         ("vllm.engine.arg_utils", arg_utils)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(vbackend, "import_vllm", lambda: vllm)
    for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.setenv(name, "0" if name == "VLLM_ENABLE_V1_MULTIPROCESSING" else "1")  # restored after
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "eos_token_id": 2}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return made, str(tmp_path)


def _engine_of(fake_vllm, *overrides):
    made, model_dir = fake_vllm
    cfg = load_config(None, ["rollout.name=vllm", "data.max_prompt_length=32", "rollout.response_length=16",
                             *overrides])
    kw = rollout_role_kwargs(cfg.rollout, max_prompt_length=cfg.data.max_prompt_length, seed=3)["engine_kwargs"]
    vbackend.VLLMGenerator(model_dir, load_weights_on_start=False, **kw)
    return made[-1]


def test_the_settings_reach_vllm_llm(fake_vllm):
    llm = _engine_of(fake_vllm)
    assert (llm["max_num_seqs"], llm["max_model_len"], llm["enable_prefix_caching"]) == (512, 48, True)
    assert llm["load_format"] == "dummy" and llm["skip_tokenizer_init"] is True
    llm = _engine_of(fake_vllm, "rollout.max_num_seqs=24", "rollout.max_model_len=96",
                     "rollout.enable_prefix_caching=false", "rollout.engine_kwargs.kv_cache_dtype=fp8")
    assert (llm["max_num_seqs"], llm["max_model_len"], llm["enable_prefix_caching"]) == (24, 96, False)
    assert llm["kv_cache_dtype"] == "fp8" and llm["max_num_batched_tokens"] == 8192  # CPU: >= max_model_len


def test_verls_renamed_argument_is_translated_and_an_unknown_one_named(fake_vllm):
    # vLLM 0.32 has no disable_mm_preprocessor_cache (verl's examples set it): mm_processor_cache_gb=0
    llm = _engine_of(fake_vllm, "rollout.engine_kwargs.disable_mm_preprocessor_cache=true")
    assert llm["mm_processor_cache_gb"] == 0 and "disable_mm_preprocessor_cache" not in llm
    assert "mm_processor_cache_gb" not in _engine_of(fake_vllm, "rollout.engine_kwargs.disable_mm_preprocessor_cache=false")
    with pytest.raises(ValueError, match=r"rollout.engine_kwargs.swap_spaces=2: the installed vLLM's LLM takes no "
                                         r"argument 'swap_spaces'; fix: drop it, or did you mean rollout.engine_kwargs.swap_space\?"):
        _engine_of(fake_vllm, "rollout.engine_kwargs.swap_spaces=2")
    known = frozenset({"disable_mm_preprocessor_cache"})  # an older vLLM that still takes it: passed as it is
    assert extra_engine_kwargs({"disable_mm_preprocessor_cache": True}, known) == {"disable_mm_preprocessor_cache": True}


# ----------------------------------------------------------------------------- verl's keys
def _from_verl(*items):
    cfg, notes, _ = load_config_with_notes(None, list(items))
    return cfg, notes


def test_a_verl_command_line_sets_the_engine_settings():
    """verl's examples' values (tests/unit/data/verl_example_argv.txt): 512 sequences, a 1536 context,
    load_format=safetensors, the mm preprocessor cache off."""
    cfg, notes = _from_verl(f"{AR}.name=vllm", "data.max_prompt_length=512", "data.max_response_length=1024",
                            f"{AR}.max_num_seqs=512", f"{AR}.max_model_len=1536", f"{AR}.enable_prefix_caching=False",
                            f"{AR}.load_format=safetensors", f"+{AR}.engine_kwargs.vllm.disable_mm_preprocessor_cache=True",
                            f"{AR}.engine_kwargs.vllm.swap_space=8")
    r = cfg.rollout
    assert (r.max_num_seqs, r.max_model_len, r.enable_prefix_caching) == (512, 1536, False)
    assert r.engine_kwargs == {"disable_mm_preprocessor_cache": True, "swap_space": 8}
    assert [n for n in notes if "load_format" in n] == [
        f"{AR}.load_format='safetensors': accepted, changes nothing in flowrl (how vLLM loads its first weights "
        "(dummy, auto, safetensors, ...); none needed: flowrl syncs the trainer's weights before every rollout, "
        "whatever was loaded)"]
    null, _ = _from_verl(f"{AR}.name=vllm", f"{AR}.max_num_seqs=null", f"{AR}.max_model_len=null")
    assert (null.rollout.max_num_seqs, null.rollout.max_model_len) == (None, None)  # derived, as in verl


def test_verls_engine_kwargs_that_flowrl_sets_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"rollout.engine_kwargs.max_model_len=100.*set rollout.max_model_len"):
        _from_verl(f"{AR}.name=vllm", f"+{AR}.engine_kwargs.vllm.max_model_len=100")
    cfg, _ = _from_verl(f"{AR}.name=vllm", f"+{AR}.engine_kwargs.sglang.attention_backend=fa3")
    assert cfg.rollout.engine_kwargs == {}  # another engine's arguments: not vLLM's


# ----------------------------------------------------------------------------- pre-flight
def test_engine_arg_names_are_read_from_the_installed_source_without_importing_vllm(tmp_path, monkeypatch):
    from flowrl.backends.generate.vllm_settings import engine_arg_names_from_source

    pkg = tmp_path / "vllm"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('importing vllm is what the pre-flight must not do')\n")
    (pkg / "engine" / "arg_utils.py").write_text(
        "import dataclasses\nfrom typing import ClassVar\n\n@dataclasses.dataclass\nclass EngineArgs:\n"
        "    model: str = 'x'\n    swap_space: float = 4\n    registry: ClassVar[dict] = {}\n\n"
        "    def create(self):\n        local: int = 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    assert engine_arg_names_from_source() == frozenset({"model", "swap_space"})
    (pkg / "engine" / "arg_utils.py").write_text("class Other:\n    x: int = 0\n")
    assert engine_arg_names_from_source() is None  # unreadable: left to the engine's own check


def test_preflight_names_every_unknown_engine_kwarg_at_once(monkeypatch):
    from flowrl.backends.generate import vllm_install, vllm_settings
    from flowrl.config.errors import ConfigError, ConfigErrors

    monkeypatch.setattr(vllm_settings, "engine_arg_names_from_source", lambda: frozenset({"swap_space", "kv_cache_dtype"}))
    check = vllm_install._check_engine_kwargs
    check({"swap_space": 2, "disable_mm_preprocessor_cache": True})  # known, and verl's renamed one: accepted
    with pytest.raises(ConfigErrors) as info:
        check({"swap_spaces": 2, "swap_space": 1, "no_such_arg": True})
    assert [e.key for e in info.value.errors] == ["rollout.engine_kwargs.swap_spaces", "rollout.engine_kwargs.no_such_arg"]
    assert "did you mean rollout.engine_kwargs.swap_space?" in info.value.errors[0].fix
    with pytest.raises(ConfigError, match=r"rollout.engine_kwargs.kv_cache_dtypes=.*did you mean rollout.engine_kwargs.kv_cache_dtype"):
        check({"kv_cache_dtypes": "fp8"})
    monkeypatch.setattr(vllm_settings, "engine_arg_names_from_source", lambda: None)
    check({"anything": 1})  # no readable source: the engine refuses it when it starts
