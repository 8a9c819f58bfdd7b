"""The vllm backend's requests for prompts with images, recorded by a fake ``vllm.LLM`` (the real
engine runs in the vLLM CPU environment, ``tests/vllm_env/check_vlm.py``, and on a GPU in
``tests/gpu/vlm_vllm_gpu.py``). The fake expands each image's one ``<|image_pad|>`` to the image's
tokens as vLLM's Qwen2-VL processor does (one token per 16 x 16 pixels here), so what the engine
would see is checked: the images decoded, in prompt order, n requests per prompt, the prompt's
expanded ids exactly flowrl's after vLLM's expansion, log-prob requests likewise."""

import io
import json
import sys
import types

import pyarrow as pa
import pytest

from flowrl.backends.generate import vllm as vbackend
from flowrl.backends.generate import vllm_images
from flowrl.backends.interfaces import SamplingParams
from flowrl.data.images import decode_image

VS, PAD, VE = 99, 100, 101  # <|vision_start|>, <|image_pad|>, <|vision_end|>


def _png(width, height, colour):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buf, format="PNG")
    return buf.getvalue()


RED, BLUE = _png(32, 32, (255, 0, 0)), _png(48, 32, (0, 0, 255))  # 2x2 = 4 and 3x2 = 6 image tokens


def _image(count):
    return [VS] + [PAD] * count + [VE]


class FakeLLM:
    """Records requests; answers as vLLM would: ``prompt_token_ids`` after expanding the i-th single
    pad of a request with images to its i-th image's tokens (``expand_by``: tokens per image of
    w x h pixels), one sampled token ``7`` (log-prob -0.5), and prompt log-probs ``-0.01 * position``
    of each prompt token (or the full distribution over {tok, 0} when asked for ``-1``)."""

    def __init__(self, expand_by=lambda w, h: (w // 16) * (h // 16)):
        self.calls, self.expand_by = [], expand_by

    def generate(self, requests, sampling, use_tqdm, lora_request):
        self.calls.append((requests, sampling))
        return [self._answer(r, sampling) for r in requests]

    def _answer(self, request, sampling):
        images = list((request.get("multi_modal_data") or {}).get("image", []))
        ids = []
        for tok in request["prompt_token_ids"]:
            ids += [PAD] * self.expand_by(*images.pop(0).size) if tok == PAD and images else [tok]
        params = sampling[0] if isinstance(sampling, list) else sampling
        full = getattr(params, "prompt_logprobs", None) == -1
        lp = [None] + [{t: types.SimpleNamespace(logprob=-0.01 * i), **({0: types.SimpleNamespace(logprob=-1.0)}
                        if full and t else {})} for i, t in enumerate(ids[1:], 1)]
        done = types.SimpleNamespace(token_ids=[7], logprobs=[{7: types.SimpleNamespace(logprob=-0.5)}])
        return types.SimpleNamespace(prompt_token_ids=ids, prompt_logprobs=lp, outputs=[done])

    def collective_rpc(self, name, args=()):
        return [None]


@pytest.fixture
def fake_vllm(monkeypatch):
    """``vllm.SamplingParams`` and ``vllm.inputs.TokensPrompt`` as plain records."""
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)


@pytest.fixture
def vlm_dir(tmp_path):
    """A VLM's config.json (all the backend reads of it: the image token id)."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl", "image_token_id": PAD,
                                                      "vision_config": {}}))
    return str(tmp_path)


def _generator(model_dir, llm=None):
    gen = object.__new__(vbackend.VLLMGenerator)
    gen.llm, gen.on_cuda, gen.in_process, gen.lora = llm or FakeLLM(), False, True, None
    gen.free_cache_engine, gen.eos_ids, gen.tensor_parallel_size, gen.model_dir = False, {2}, 1, model_dir
    return gen


PROMPTS = [[1] + _image(4) + [5, 6], [3] + _image(6) + [4] + _image(4) + [5], [8, 9]]
IMAGES = [[RED], [BLUE, RED], []]  # the third prompt is text only


def _pixels(img):
    return img.size, img.tobytes()


def test_generation_requests_carry_the_decoded_images_in_prompt_order(fake_vllm, vlm_dir):
    gen = _generator(vlm_dir)
    responses, logprobs = gen.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=4), seed=3, images=IMAGES)
    (requests, sampling), = gen.llm.calls
    assert len(requests) == 6 and responses == [[7]] * 6 and logprobs == [[-0.5]] * 6
    for i, (prompt, row) in enumerate(zip(PROMPTS, IMAGES)):
        for req in requests[2 * i: 2 * i + 2]:  # n = 2 requests per prompt, prompt-major
            got = (req.get("multi_modal_data") or {}).get("image", [])
            assert [_pixels(x) for x in got] == [_pixels(decode_image(b)) for b in row]
            # each run of pads sent once: vLLM expands it again
            assert req["prompt_token_ids"].count(PAD) == len(row)
    assert requests[0]["prompt_token_ids"] == [1, VS, PAD, VE, 5, 6]
    assert requests[2]["prompt_token_ids"] == [3, VS, PAD, VE, 4, VS, PAD, VE, 5]
    assert requests[4] == {"prompt_token_ids": [8, 9]}  # text prompt as it is
    # what vLLM's expansion makes of each request is flowrl's prompt, token for token
    assert [o.prompt_token_ids for o in map(gen.llm._answer, requests, [sampling] * 6)] == \
        [p for p in PROMPTS for _ in range(2)]
    assert requests[0]["multi_modal_data"]["image"][0] is requests[1]["multi_modal_data"]["image"][0]  # decoded once


def test_text_prompts_go_as_before(fake_vllm, vlm_dir):
    gen = _generator(None)
    gen.generate([[1, 2]], SamplingParams(n=3, max_new_tokens=2), images=None)
    assert gen.llm.calls[0][0] == [{"prompt_token_ids": [1, 2]}] * 3


def test_another_image_token_count_in_vllm_is_an_error(fake_vllm, vlm_dir):
    gen = _generator(vlm_dir, FakeLLM(expand_by=lambda w, h: (w // 16) * (h // 16) + 1))  # another resize
    with pytest.raises(RuntimeError, match="another size than flowrl.data.images counted"):
        gen.generate(PROMPTS[:1], SamplingParams(n=1, max_new_tokens=2), images=IMAGES[:1])


def test_images_need_a_vision_language_model_and_at_most_the_limit(fake_vllm, vlm_dir, tmp_path_factory):
    text_dir = tmp_path_factory.mktemp("text")
    (text_dir / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(ValueError, match="need a vision-language model.path"):
        _generator(str(text_dir)).generate(PROMPTS[:1], SamplingParams(n=1), images=IMAGES[:1])
    many = vllm_images.MAX_IMAGES_PER_PROMPT + 1
    with pytest.raises(ValueError, match=f"prompt 0 has {many} images"):
        _generator(vlm_dir).generate([[1] + _image(4) * many], SamplingParams(n=1), images=[[RED] * many])


def test_teacher_forced_logprobs_with_images(fake_vllm, vlm_dir):
    gen = _generator(vlm_dir)
    responses = [[7, 8], [9], [10, 11, 12]]
    out = gen.logprobs(PROMPTS, responses, images=IMAGES)
    requests, params = gen.llm.calls[0]
    assert requests[0]["prompt_token_ids"] == [1, VS, PAD, VE, 5, 6, 7, 8]  # response as it is, after the prompt
    assert [_pixels(x) for x in requests[1]["multi_modal_data"]["image"]] == [_pixels(decode_image(b)) for b in IMAGES[1]]
    assert params[0].prompt_logprobs == 0 and params[0].max_tokens == 1
    # read at flowrl's positions of the expanded prompt: response token j sits at len(prompt) + j
    assert out == [[-0.01 * (len(p) + j) for j in range(len(r))] for p, r in zip(PROMPTS, responses)]
    # T = 2 over the two-token distribution {tok: -0.01 i, 0: -1}: log-softmax of (lp / 2)
    import math

    hot = gen.logprobs(PROMPTS[:1], [[7]], images=IMAGES[:1], temperature=2.0)
    i = len(PROMPTS[0])
    a, b = -0.01 * i / 2, -1.0 / 2
    assert hot == [[pytest.approx(a - math.log(math.exp(a) + math.exp(b)))]]


def test_engine_kwargs_of_a_vlm(vlm_dir):
    assert vllm_images.vlm_engine_kwargs(vlm_dir) == {
        "skip_tokenizer_init": False, "limit_mm_per_prompt": {"image": vllm_images.MAX_IMAGES_PER_PROMPT, "video": 0},
        "load_format": "auto"}
    gen = _generator(vlm_dir)
    kwargs = gen._engine_kwargs(vlm_dir, dtype="auto", seed=0, enforce_eager=True, max_num_seqs=4, max_model_len=64,
                                max_num_batched_tokens=64, enable_chunked_prefill=False, gpu_memory_utilization=0.5)
    assert kwargs["skip_tokenizer_init"] is False and kwargs["limit_mm_per_prompt"]["image"] >= 1
    assert kwargs["load_format"] == "auto"  # a dummy start randomises vLLM's fused input norm (no sync restores it)
    text = _generator(None)._engine_kwargs(None, dtype="auto", seed=0, enforce_eager=True, max_num_seqs=4,
                                           max_model_len=64, max_num_batched_tokens=64, enable_chunked_prefill=False,
                                           gpu_memory_utilization=0.5)
    assert text["skip_tokenizer_init"] is True and "limit_mm_per_prompt" not in text and text["load_format"] == "dummy"


def test_collapse_image_pads():
    assert vllm_images.collapse_image_pads([1, PAD, PAD, PAD, 2, PAD, 3, PAD], PAD) == [1, PAD, 2, PAD, 3, PAD]


def test_the_rollout_role_hands_the_images_column_to_the_engine(fake_vllm, vlm_dir):
    from flowrl.data.images import IMAGES_TYPE
    from flowrl.roles.rollout import RolloutRole

    role = object.__new__(RolloutRole)
    role.engine, role.agent, role.rank, role.tp, role.micro_batch_size = _generator(vlm_dir), None, 0, 1, 8
    role.sampling = SamplingParams(n=2, max_new_tokens=2)
    prompts = pa.table({"prompt_ids": pa.array(PROMPTS, pa.list_(pa.int32())), "group": pa.array([0, 1, 2]),
                        "images": pa.array(IMAGES, IMAGES_TYPE)})
    table = role.generate(prompts, seed=1)
    requests, _ = role.engine.llm.calls[0]
    assert [len((r.get("multi_modal_data") or {}).get("image", [])) for r in requests] == [1, 1, 2, 2, 0, 0]
    assert table.num_rows == 6 and table.column("response_ids").to_pylist() == [[7]] * 6
