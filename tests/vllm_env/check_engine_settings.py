"""The rollout section's vLLM engine settings reach a real engine (the CPU build): ``rollout.max_num_seqs``,
``rollout.enable_prefix_caching=false``, an ``engine_kwargs`` entry and verl's renamed
``disable_mm_preprocessor_cache``, through the role's keyword arguments as a run builds them. Runs in
the vLLM environment (``test_vllm_env.py`` starts it); not collected by the main run (``check_*``)."""

from conftest import build_tiny_model_dir

from flowrl.backends.generate.vllm import VLLMGenerator
from flowrl.backends.interfaces import SamplingParams
from flowrl.config.loader import load_config
from flowrl.roles.specs import rollout_role_kwargs


def test_the_settings_reach_vllms_config(tmp_path):
    model_dir = build_tiny_model_dir(tmp_path / "m", hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128)
    cfg = load_config(None, ["rollout.name=vllm", "rollout.enforce_eager=true", "rollout.max_num_seqs=3",
                             "rollout.enable_prefix_caching=false", "rollout.engine_kwargs.max_logprobs=7",
                             "rollout.engine_kwargs.disable_mm_preprocessor_cache=true",
                             "data.max_prompt_length=16", "rollout.response_length=8"])
    kwargs = rollout_role_kwargs(cfg.rollout, max_prompt_length=cfg.data.max_prompt_length, seed=0)["engine_kwargs"]
    gen = VLLMGenerator(str(model_dir), **kwargs)
    try:
        vc = gen.llm.llm_engine.vllm_config
        assert vc.scheduler_config.max_num_seqs == 3
        assert vc.cache_config.enable_prefix_caching is False
        assert vc.model_config.max_logprobs == 7
        assert vc.model_config.max_model_len == 16 + 8
        tokens, _ = gen.generate([[10, 11, 12]] * 5, SamplingParams(n=1, temperature=0.0, max_new_tokens=4))
        assert len(tokens) == 5  # five prompts through three sequence slots
    finally:
        gen.close()


def test_preflight_reads_the_installed_vllms_engine_args_without_importing_it():
    """What pre-flight refuses ``rollout.engine_kwargs`` names against (``EngineArgs`` parsed from
    the installed source) is exactly what the engine checks them against when it starts."""
    import subprocess
    import sys

    probe = ("import sys; from flowrl.backends.generate.vllm_settings import engine_arg_names_from_source as f; "
             "names = f(); assert 'vllm' not in sys.modules; print(len(names)); print(','.join(sorted(names)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    count, names = out.stdout.split()
    from flowrl.backends.generate.vllm_settings import engine_arg_names

    assert set(names.split(",")) == engine_arg_names() and int(count) > 100
