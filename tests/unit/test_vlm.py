"""Vision-language models (issue 33): the tiny Qwen2-VL, verl's multimodal Parquet, images in the
experience, log-prob parity between the hf decode loop and the dp trainer in every layout, the
frozen vision tower, and the pre-flight refusals."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("PIL")


def _png(colour=(255, 0, 0), size=(64, 64), mode="RGB") -> bytes:
    from PIL import Image, ImageDraw

    img = Image.new(mode, size, (255, 255, 255) if mode == "RGB" else 0)
    if mode == "RGB":
        ImageDraw.Draw(img).ellipse((8, 8, 40, 40), fill=colour)
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from flowrl.models.tiny_vlm import save_tiny_vlm

    return str(save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model"))


def test_tiny_vlm_round_trips_through_from_pretrained(vlm_dir):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    from flowrl.data.images import load_image_processor
    from flowrl.models.tiny_vlm import IMAGE_PAD, VISION_TOKENS
    from flowrl.models.vlm import register_auto_classes, vision_tower, with_text_ids

    register_auto_classes()
    model = with_text_ids(AutoModelForCausalLM.from_pretrained(vlm_dir))
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    assert type(AutoModelForImageTextToText.from_pretrained(vlm_dir)).__name__ == type(model).__name__
    tok = AutoTokenizer.from_pretrained(vlm_dir)
    ids = tok(f"a{IMAGE_PAD}b", add_special_tokens=False)["input_ids"]
    assert len(ids) == 3 and ids[1] == model.config.image_token_id
    assert all(len(tok(t, add_special_tokens=False)["input_ids"]) == 1 for t in VISION_TOKENS)
    assert model.config.pad_token_id == tok.pad_token_id and model.config.eos_token_id == tok.eos_token_id
    assert vision_tower(model) is not None
    processor = load_image_processor(vlm_dir)
    assert (processor.patch_size, processor.merge_size) == (8, 2)


def test_check_image_rejects_unreadable_wrong_mode_and_too_large():
    from flowrl.data.images import check_image, image_bytes

    assert check_image(_png()) == (64, 64)
    with pytest.raises(ValueError, match="unreadable"):
        check_image(b"not an image")
    with pytest.raises(ValueError, match="unreadable"):
        check_image(_png()[:40])
    with pytest.raises(ValueError, match="mode 'I;16'"):
        check_image(_png(mode="I;16", size=(8, 8)))
    with pytest.raises(ValueError, match="pixels"):
        check_image(_png(size=(64, 64)), max_pixels=1000)
    with pytest.raises(ValueError, match="neither bytes nor a path"):
        image_bytes({"bytes": None, "path": None})


def _geo3k_rows(tmp_path) -> list[dict]:
    """Rows as verl's examples/data_preprocess/geo3k.py writes them (prompt with <image>, images
    as [{"bytes", "path"}]), three good and four bad."""
    disk = tmp_path / "pic.png"
    disk.write_bytes(_png((0, 0, 255)))

    def row(i, images, text="<image>What colour is the disc?"):
        return {"data_source": "hiyouga/geometry3k", "prompt": [{"role": "user", "content": text}],
                "images": images, "ability": "math", "reward_model": {"style": "rule", "ground_truth": "red"},
                "extra_info": {"split": "train", "index": i, "answer": "red", "question": text}}

    return [
        row(0, [{"bytes": _png(), "path": None}]),
        row(1, [{"bytes": None, "path": str(disk)}]),  # a path, no bytes
        row(2, [{"bytes": b"garbage", "path": None}]),  # unreadable
        row(3, [{"bytes": _png(mode="I;16", size=(8, 8)), "path": None}]),  # wrong mode
        row(4, [{"bytes": _png(), "path": None}, {"bytes": _png(), "path": None}]),  # 2 images, 1 placeholder
        row(5, [{"bytes": _png(), "path": None}], "<image>" + "x" * 50),  # 16 image tokens + 52: too long
        row(6, [{"bytes": _png((0, 200, 0)), "path": None}], "<image>colour?"),
    ]


def test_verl_multimodal_parquet_loads_with_images_as_binary_and_rejects_bad_rows(vlm_dir, tmp_path):
    from transformers import AutoTokenizer

    from flowrl.data.prompts import PromptDataset

    file = tmp_path / "geo3k.parquet"
    pq.write_table(pa.Table.from_pylist(_geo3k_rows(tmp_path)), file)
    tok = AutoTokenizer.from_pretrained(vlm_dir)
    ds = PromptDataset([str(file)], tok, max_prompt_length=60)
    assert len(ds) == 3 and [row for _, row in ds.origins] == [0, 1, 6]
    assert ds.table.schema.field("images").type == pa.list_(pa.binary())
    assert ds.table.column("images")[0].as_py() == [_png()]  # the encoded bytes, not decoded
    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    lengths = [len(ids) for ids in ds.table.column("prompt_ids").to_pylist()]
    assert [ids.count(image_id) for ids in ds.table.column("prompt_ids").to_pylist()] == [16, 16, 16]
    assert lengths[0] == 16 + 2 + len("What colour is the disc?")  # image tokens count in the length
    reasons = {r.row: r.reason for r in ds.rejected}
    assert set(reasons) == {2, 3, 4, 5} and all(r.file == str(file) for r in ds.rejected)
    assert "unreadable" in reasons[2] and "mode" in reasons[3] and "placeholders" in reasons[4]
    assert "max_prompt_length" in reasons[5]
    out = tmp_path / "rejected_prompts.jsonl"
    ds.write_rejected(out)
    assert [json.loads(line)["row"] for line in out.read_text().splitlines()] == [2, 3, 4, 5]


def test_images_without_an_image_processor_are_a_file_error(tmp_path):
    from flowrl.data.prompts import PromptDataset, PromptFileError
    from flowrl.models.char_tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.save_pretrained(tmp_path / "text_model")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "text_model")
    file = tmp_path / "geo3k.parquet"
    pq.write_table(pa.Table.from_pylist(_geo3k_rows(tmp_path)[:1]), file)
    with pytest.raises(PromptFileError, match="no image processor"):
        PromptDataset([str(file)], tok)


def _samples(vlm_dir, n=2):
    """Three prompts with images of different sizes (one with two images), ``n`` samples each
    from the hf generator, as an experience table."""
    from transformers import AutoTokenizer

    from flowrl.backends.generate.hf import HFGenerator
    from flowrl.backends.interfaces import SamplingParams
    from flowrl.data import experience
    from flowrl.data.images import expand_placeholders, image_token_count, load_image_processor

    tok, proc = AutoTokenizer.from_pretrained(vlm_dir), load_image_processor(vlm_dir)
    images = [[_png((255, 0, 0))], [_png((0, 255, 0), (96, 64))], [_png((0, 0, 255)), _png((9, 9, 9))]]
    sizes = [[(64, 64)], [(96, 64)], [(64, 64), (64, 64)]]
    texts = ["<image>count?", "hi <image>colour?", "<image> and <image>?"]
    prompts = [tok(expand_placeholders(t, [image_token_count(w, h, proc) for w, h in s]),
                   add_special_tokens=False)["input_ids"] for t, s in zip(texts, sizes)]
    gen = HFGenerator(vlm_dir)
    responses, logprobs = gen.generate(prompts, SamplingParams(n=n, temperature=1.0, max_new_tokens=6), seed=3,
                                       images=images)
    table = pa.table({
        "prompt_ids": experience.from_lists([p for p in prompts for _ in range(n)], experience.TOKEN_IDS),
        "response_ids": experience.from_lists(responses, experience.TOKEN_IDS),
        "images": pa.array([i for i in images for _ in range(n)], pa.list_(pa.binary())),
    })
    return table, torch.tensor([x for row in logprobs for x in row])


@pytest.mark.parametrize("budget,shared", [(0, False), (40, False), (1000, False), (0, True), (1000, True)])
def test_hf_generation_logprobs_equal_the_dp_trainers_in_every_layout(vlm_dir, budget, shared):
    from flowrl.backends.train.dp_policy import TorchDPEngine
    from flowrl.data.packed import PackedBatch

    table, gen_logp = _samples(vlm_dir)
    engine = TorchDPEngine(vlm_dir, trainable=False)
    batch = PackedBatch.from_table(table).with_token_budget(budget).with_shared_prompts(shared)
    logp, _ = engine.forward_logprobs(batch, micro_batch_size=3)
    assert logp.shape == gen_logp.shape
    assert float((logp - gen_logp).abs().max()) < 1e-5


def test_qwen2_5_vl_generation_logprobs_equal_the_dp_trainers(tmp_path):
    """Qwen2.5-VL (windowed vision tower) through the same paths: packed lines with shared prompts."""
    from flowrl.backends.train.dp_policy import TorchDPEngine
    from flowrl.data.packed import PackedBatch
    from flowrl.models.tiny_vlm import save_tiny_vlm

    model_dir = str(save_tiny_vlm(tmp_path / "q25", arch="qwen2_5_vl"))
    table, gen_logp = _samples(model_dir)
    engine = TorchDPEngine(model_dir, trainable=False)
    assert type(engine.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    for budget, shared in ((0, False), (1000, True)):
        batch = PackedBatch.from_table(table).with_token_budget(budget).with_shared_prompts(shared)
        logp, _ = engine.forward_logprobs(batch, micro_batch_size=3)
        assert float((logp - gen_logp).abs().max()) < 1e-5


def test_multimodal_positions_matter(vlm_dir, monkeypatch):
    """The control: 1-D positions in place of the model's mrope ones change the log-probs."""
    from flowrl.backends.train.dp_policy import TorchDPEngine
    from flowrl.data.packed import PackedBatch
    from flowrl.models import vlm

    table, gen_logp = _samples(vlm_dir)
    engine = TorchDPEngine(vlm_dir, trainable=False)
    monkeypatch.setattr(vlm, "mrope_positions", lambda m, ids, g, p=None: torch.arange(len(ids)).expand(3, -1).clone())
    logp, _ = engine.forward_logprobs(PackedBatch.from_table(table), micro_batch_size=6)
    assert float((logp - gen_logp).abs().max()) > 1e-4


def test_shared_prompts_break_where_images_differ(vlm_dir):
    """Two groups with token-identical prompts but different pictures are two segments."""
    from flowrl.data import experience
    from flowrl.data.packed import PackedBatch

    table = pa.table({
        "prompt_ids": experience.from_lists([[5, 6, 7]] * 4, experience.TOKEN_IDS),
        "response_ids": experience.from_lists([[1]] * 4, experience.TOKEN_IDS),
        "images": pa.array([[b"a"], [b"a"], [b"b"], [b"b"]], pa.list_(pa.binary())),
    })
    padded = PackedBatch.from_table(table).with_shared_prompts().model_inputs(0)
    assert int((padded.input_ids_BL == 5).sum()) == 2  # the prompt twice, once per picture
    text = PackedBatch.from_table(table.drop_columns(["images"])).with_shared_prompts().model_inputs(0)
    assert int((text.input_ids_BL == 5).sum()) == 1


def test_freeze_vision_tower_keeps_the_tower_and_trains_the_rest(vlm_dir):
    from flowrl.backends.train.dp_policy import TorchDPEngine
    from flowrl.data import experience
    from flowrl.data.packed import PackedBatch
    from flowrl.models.vlm import vision_tower

    table, _ = _samples(vlm_dir)
    table = table.append_column("advantages", experience.from_lists(
        [[1.0] * len(r) for r in table.column("response_ids").to_pylist()], experience.TOKEN_FLOATS))
    for freeze in (True, False):
        engine = TorchDPEngine(vlm_dir, lr=1e-2, freeze_vision_tower=freeze)
        tower = {n: p.detach().clone() for n, p in vision_tower(engine.model).named_parameters()}
        lm = engine.model.lm_head.weight.detach().clone()
        batch = PackedBatch.from_table(table, ("advantages",))
        engine.train_step(batch, micro_batch_size=6, with_entropy=False,
                          loss_fn=lambda logp, ent, mb: ((-logp * mb.token_fields["advantages"]).mean(), {}))
        moved = [n for n, p in vision_tower(engine.model).named_parameters() if not torch.equal(p, tower[n])]
        assert (moved == []) == freeze, moved[:3]
        assert not torch.equal(engine.model.lm_head.weight, lm)


def test_preflight_refuses_a_vlm_on_megatron_and_takes_fsdp_and_vllm(vlm_dir):
    from flowrl.config import ConfigError, load_config
    from flowrl.config.vlm_checks import check_vlm

    cfg = load_config(None, [f"model.path={vlm_dir}", "actor.strategy=megatron"])
    with pytest.raises(ConfigError, match="actor.strategy='megatron'.*vision-language"):
        check_vlm(cfg, model_path=vlm_dir)
    # vllm: the engine rank loads whole HF-named tensors staged over its tp ranks (named_spec's vllm style)
    for extra in ([], ["actor.strategy=fsdp"], ["actor.strategy=fsdp", "rollout.tensor_model_parallel_size=2"],
                  ["cluster.placement=split", "rollout.tensor_model_parallel_size=2"]):
        check_vlm(load_config(None, [f"model.path={vlm_dir}", "rollout.name=vllm", *extra]), model_path=vlm_dir)
    cfg = load_config(None, [f"model.path={vlm_dir}", "trainer.async_mode=stream", "trainer.staleness=1",
                             "trainer.partial_rollout=true"])
    with pytest.raises(ConfigError, match="trainer.partial_rollout.*without its prompt's images"):
        check_vlm(cfg, model_path=vlm_dir)
    check_vlm(load_config(None, [f"model.path={vlm_dir}"]), model_path=vlm_dir)  # dp + hf: fine
    # fsdp + hf: the weight sync moves every parameter whole by name (flowrl.parallel.named_spec)
    check_vlm(load_config(None, [f"model.path={vlm_dir}", "actor.strategy=fsdp"]), model_path=vlm_dir)
    check_vlm(load_config(None, [f"model.path={vlm_dir}", "cluster.placement=split"]), model_path=vlm_dir)


def test_a_vlms_reshard_job_holds_every_parameter_whole_by_name(vlm_dir):
    """The run's colocated job of an fsdp trainer (2 ranks) into the hf generator: the model is the
    VLM's parameters by name (vision tower included), each rank copies its own replica, nothing
    crosses; split or fused layouts of it are refused."""
    from flowrl.backends.reshard import job_for_run
    from flowrl.config import load_config
    from flowrl.models.vlm import param_shapes
    from flowrl.parallel.mesh import ParallelDims
    from flowrl.parallel.model_shape import NamedShape
    from flowrl.parallel.named_spec import named_shard_spec

    cfg = load_config(None, [f"model.path={vlm_dir}", "actor.strategy=fsdp", "actor.data_parallel_size=2",
                             "rollout.data_parallel_size=2"])
    job = job_for_run(cfg, colocated=True)
    shapes = param_shapes(vlm_dir)
    assert isinstance(job.model, NamedShape) and job.model.param_shapes() == shapes
    assert any(n.startswith("model.visual.") for n in shapes)
    src, dst = job.specs()
    assert src.params == dst.params == shapes and src.num_params == sum(torch.Size(s).numel() for s in shapes.values())
    stats = job.summary()
    assert stats.bytes_sent == stats.bytes_min == 0 and stats.model_bytes == src.num_params * 4  # every replica is local
    for p in (0, 1):
        assert job.min_bytes(p) == 0
    with pytest.raises(ValueError, match="tp=2 would split them"):
        named_shard_spec(job.model, ParallelDims(dp=1, tp=2, pp=1))
    with pytest.raises(ValueError, match="megatron-style layout"):
        named_shard_spec(job.model, ParallelDims(dp=1, tp=1, pp=1), style="megatron")


def test_dashboard_samples_show_the_prompt_images_as_thumbnails(tmp_path):
    """The samples view (run_reader.sample_columns, the table and the clicked row's view) carries
    each prompt's pictures as <img> thumbnails; a text run's rows have none; an export embeds them."""
    import base64

    from bokeh.models import HTMLTemplateFormatter

    from flowrl.data import experience
    from flowrl.metrics.dashboard_js import SHOW_SAMPLE_JS
    from flowrl.metrics.dashboard_step import samples_table
    from flowrl.metrics.run_reader import sample_columns

    big = _png((0, 0, 255), size=(200, 100))
    table = pa.table({
        "prompt_ids": experience.from_lists([[1, 2], [1, 2], [3]], experience.TOKEN_IDS),
        "response_ids": experience.from_lists([[4], [5], [6]], experience.TOKEN_IDS),
        "images": pa.array([[big], [big], [b"junk"]], pa.list_(pa.binary())),
    })
    cols = sample_columns(table, 3)
    assert cols["images"][0] == cols["images"][1] and cols["images"][0].startswith('<img class="prompt-image"')
    uri = cols["images"][0].split('src="')[1].split('"')[0]
    from PIL import Image

    thumb = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    assert thumb.size == (64, 32)  # at most 64 pixels a side, aspect kept
    assert "unreadable" in cols["images"][2]
    text = sample_columns(table.drop_columns(["images"]), 3)
    assert text["images"] == ["", "", ""]
    shown = [c for c in samples_table(__import__("bokeh.models", fromlist=["ColumnDataSource"]).ColumnDataSource(
        {k: v for k, v in cols.items()})).columns if c.field == "images"]
    assert len(shown) == 1 and isinstance(shown[0].formatter, HTMLTemplateFormatter)
    assert "d.images[i]" in SHOW_SAMPLE_JS


def test_collapse_image_tokens():
    from flowrl.data.images import collapse_image_tokens

    assert collapse_image_tokens("<|vision_start|>" + "<|image_pad|>" * 16 + "<|vision_end|>hi") == \
        "<|vision_start|><|image_pad|>x16<|vision_end|>hi"


def test_checkpoints_and_hf_export_carry_the_vision_weights(vlm_dir, tmp_path):
    """A dp engine's checkpoint state holds the vision tower (names as named_parameters) and
    restores it exactly; save_hf writes a directory that loads as the same VLM."""
    from transformers import AutoModelForCausalLM

    from flowrl.backends.train.dp_policy import TorchDPEngine
    from flowrl.models.vlm import register_auto_classes, vision_tower

    engine = TorchDPEngine(vlm_dir, seed=0)
    with torch.no_grad():
        for p in vision_tower(engine.model).parameters():
            p.add_(0.25)
    state = engine.checkpoint_state()
    assert any(k.startswith("model.visual.") for k in state["params"])
    fresh = TorchDPEngine(vlm_dir, seed=1)
    fresh.load_checkpoint(state["params"])
    for (n, a), (_, b) in zip(engine.model.named_parameters(), fresh.model.named_parameters()):
        assert torch.equal(a, b), n
    engine.save_hf(str(tmp_path / "export"))
    register_auto_classes()
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "export")
    for n, p in vision_tower(engine.model).named_parameters():
        assert torch.equal(dict(vision_tower(back).named_parameters())[n], p), n


@pytest.mark.parametrize("family", ["sft", "dpo", "rm"])
def test_a_family_that_reads_its_data_without_images_refuses_a_vlm(vlm_dir, tiny_model_dir, family):
    """SFT, DPO and reward-model training read chat messages / pairs without an images column: a VLM
    model.path is refused naming the families that carry images, a text model is not."""
    from flowrl.config import ConfigError, load_config
    from flowrl.run.preflight import check_family

    with pytest.raises(ConfigError, match=f"algorithm.family='{family}'.*vision-language.*use the grpo or ppo or remax"):
        check_family(load_config(None, [f"model.path={vlm_dir}", f"algorithm.family={family}"]), model_path=vlm_dir)
    check_family(load_config(None, [f"model.path={tiny_model_dir}", f"algorithm.family={family}"]),
                 model_path=str(tiny_model_dir))
    for ok in (["algorithm.adv_estimator=remax"], ["algorithm.adv_estimator=gae"], []):
        check_family(load_config(None, [f"model.path={vlm_dir}", *ok]), model_path=vlm_dir)
