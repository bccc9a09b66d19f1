"""tinyworld training: the vision targets and PlaceAux, the interleaved M-RoPE, the losses, the drawn mix of
examples and the training script end to end (the retrieval targets: test_tinyworld_retrieval.py)."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from sage_engine.tinyworld import world as W
from sage_engine.tinyworld.tokenizer import user_turn


def _labels_drawn_object_by_object(objects) -> np.ndarray:
    """The image targets' multi-hot labels computed a second, plainer way: draw each object's mask, give each
    pixel to the last object drawn there, and label a block with every object that shows >= MIN_PIXELS in it."""
    from sage_engine.tinyworld.training.vision_aux import BLOCK, GRID, MIN_PIXELS, N_LABELS
    owner = np.full((W.SIZE, W.SIZE), -1, np.int16)
    for i, o in enumerate(objects):
        mask = np.zeros((W.SIZE, W.SIZE, 3), np.uint8)
        W.draw_object(mask, o, colour=(255, 255, 255))
        owner[mask[..., 0] > 127] = i
    out = np.zeros((GRID * GRID, N_LABELS), np.uint8)
    for t in range(GRID * GRID):
        r, c = divmod(t, GRID)
        block = owner[r * BLOCK:(r + 1) * BLOCK, c * BLOCK:(c + 1) * BLOCK]
        for i, o in enumerate(objects):
            if (block == i).sum() >= MIN_PIXELS:
                out[t, list(W.COLOURS).index(o.colour)] = 1
                out[t, len(W.COLOURS) + W.SHAPES.index(o.shape)] = 1
                out[t, len(W.COLOURS) + len(W.SHAPES) + W.SIZES.index(o.size)] = 1
                triple = ((W.SIZES.index(o.size) * len(W.COLOURS) + list(W.COLOURS).index(o.colour)) * len(W.SHAPES)
                          + W.SHAPES.index(o.shape))
                out[t, len(W.COLOURS) + len(W.SHAPES) + len(W.SIZES) + triple] = 1
        out[t, -1] = not out[t, :-1].any()
    return out


def test_vision_targets_follow_the_scene():
    import random

    from sage_engine.tinyworld.training.vision_aux import GRID, SHAPE, clip_targets, image_targets
    assert GRID * GRID == 9   # one merged visual token per cell of the world
    rng = random.Random(7)
    for _ in range(20):
        scene = W.sample_scene(rng)
        labels, dom = image_targets(scene)
        assert (labels == _labels_drawn_object_by_object(scene.objects)).all()
        for t in range(GRID * GRID):   # the dominant shape is one of the shapes present in the block
            assert dom[t] == -1 or labels[t, SHAPE][dom[t]] == 1
        for o in scene.objects:        # each object's own cell is its token, and no other token shows it
            on = [t for t in range(9) if labels[t, list(W.COLOURS).index(o.colour)]
                  and labels[t, SHAPE][W.SHAPES.index(o.shape)]]
            assert on == [o.cell], (o, on)
    labels, dom = clip_targets(W.sample_clip(rng))
    assert labels.shape[0] == dom.shape[0] == 2 * GRID * GRID
    # an occluding pair shares one cell: its token names both (size, colour, shape) triples and no mixed-up one
    from sage_engine.tinyworld.training.vision_aux import TRIPLES
    scene = W.sample_scene(rng, 3, 4, occlusion=1.0)
    back, front = (scene.objects[i] for i in scene.occluded)
    n_cs = len(W.COLOURS) * len(W.SHAPES)
    triples = {(W.SIZES[k // n_cs], list(W.COLOURS)[k % n_cs // len(W.SHAPES)], W.SHAPES[k % len(W.SHAPES)])
               for k in np.flatnonzero(image_targets(scene)[0][back.cell, TRIPLES])}
    assert triples == {(o.size, o.colour, o.shape) for o in (back, front)}, (scene, triples)


def test_cell_changes_name_what_happened_where():
    from sage_engine.tinyworld.training.vision_aux import CHANGES, cell_changes, clip_targets
    rng = random.Random(11)
    seen = set()
    for _ in range(200):
        clip = W.sample_clip(rng)
        change = cell_changes(torch.from_numpy(clip_targets(clip)[0])[None])[0].tolist()
        s, a = clip.subject, clip.after
        expect = {"appear": {s.cell: "appeared"}, "disappear": {s.cell: "vanished"},
                  "grow": {s.cell: "changed"}, "shrink": {s.cell: "changed"}, "recolour": {s.cell: "changed"}}
        if clip.event == "move":   # the subject leaves its cell and shows up in its destination (or on the way)
            assert CHANGES[change[s.cell]] == "vanished" and CHANGES[change[a.cell]] == "appeared", (clip, change)
        else:
            got = {c: CHANGES[k] for c, k in enumerate(change) if k}
            assert got == expect[clip.event], (clip.event, got)
        seen.add(clip.event)
    assert seen == set(W.EVENTS)


def test_place_aux_reads_the_language_model_at_the_visual_tokens(tok):
    from sage_engine.tinyworld.architecture import TINY, build_model
    from sage_engine.tinyworld.training.data import expand_pads, patchify
    from sage_engine.tinyworld.training.vision_aux import GRID, PlaceAux, clip_targets
    model = build_model(TINY, tok)
    place = PlaceAux(model, 0, tok.convert_tokens_to_ids("<|image_pad|>"), tok.convert_tokens_to_ids("<|video_pad|>"))
    clip = W.sample_clip(random.Random(5))
    frames = torch.from_numpy(np.stack(W.render_clip(clip))[[0, 2, 4, 6]])
    ids = torch.tensor([tok(expand_pads(user_turn("video", "What happens?")), add_special_tokens=False)["input_ids"]])
    g = W.SIZE // 14
    place.input_ids = ids
    model(input_ids=ids, pixel_values_videos=patchify(frames), video_grid_thw=torch.tensor([[2, g, g]]),
          mm_token_type_ids=(ids == tok.convert_tokens_to_ids("<|video_pad|>")).long() * 2,
          second_per_grid_ts=torch.ones(1))
    video_labels = torch.from_numpy(clip_targets(clip)[0])[None]
    loss = place.loss(video_labels)
    loss.backward()
    assert torch.isfinite(loss) and loss > 0
    assert place.head.weight.grad.abs().sum() > 0
    assert model.model.language_model.layers[0].mlp.down_proj.weight.grad is not None
    assert place.loss(None).item() == 0   # nothing captured since: no loss
    # a second-group token is also asked what its cell held before: the head's last N_LABELS outputs learn too
    from sage_engine.tinyworld.training.vision_aux import CHANGES, N_LABELS
    assert place.head.out_features == 2 * GRID + 2 + len(CHANGES) + N_LABELS
    assert place.head.weight.grad[-N_LABELS:].abs().sum() > 0
    place.remove()
    assert GRID == 3


def _largest_turn(cos, sin, a, b) -> float:
    """The largest angle, over the rotary frequencies, by which a query turns between positions a and b."""
    return torch.atan2(sin[0, a] * cos[0, b] - cos[0, a] * sin[0, b],
                       cos[0, a] * cos[0, b] + sin[0, a] * sin[0, b]).abs().max().item()


def test_interleaved_mrope_lets_the_language_model_tell_columns_apart(tok):
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding

    from sage_engine.tinyworld.architecture import TARGET, build_config
    # three visual tokens of one image: (t, h, w) = (5, 5, 5), (5, 5, 6), (5, 6, 5); and three text tokens
    visual = torch.tensor([[5, 5, 5], [5, 5, 5], [5, 6, 5]]).T.reshape(3, 1, 3)
    visual[2, 0, 1] = 6
    text = torch.arange(3).view(1, 1, 3).expand(3, 1, 3)
    turn = {}
    for interleaved in (False, True):
        rot = Qwen2_5_VLRotaryEmbedding(build_config(TARGET, tok, interleaved).text_config)
        cos, sin = rot(torch.zeros(1, 1, 4), visual)
        turn[interleaved] = (_largest_turn(cos, sin, 1, 0), _largest_turn(cos, sin, 2, 0))   # one column, one row
        turn[interleaved, "text"] = rot(torch.zeros(1, 1, 4), text)[0]
    assert turn[False][0] < 0.01 and turn[False][1] < 0.11   # Qwen's contiguous split: a column step is invisible
    assert turn[True][0] > 0.5 and turn[True][1] > 0.7       # interleaved: a column or a row step turns a query
    assert torch.allclose(turn[False, "text"], turn[True, "text"])   # text positions rotate the same either way


def test_content_weighted_loss(tok):
    from sage_engine.tinyworld.architecture import TINY, build_model
    from sage_engine.tinyworld.training.losses import content_tokens, weighted_lm_loss
    content = content_tokens(tok)
    for word in (" red", " star", " large", " left", " moves"):
        ids = tok(word, add_special_tokens=False)["input_ids"]
        assert len(ids) > 1 or content[ids[0]], word
    for word in (" The", "There", " is", "."):
        assert not content[tok(word, add_special_tokens=False)["input_ids"]].any(), word
    model = build_model(TINY, tok)
    text = "<|im_start|>assistant\nThe red star is large.<|im_end|>"
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    labels = ids.clone()
    labels[:, :3] = -100
    out = model(input_ids=ids, labels=labels)
    assert torch.allclose(weighted_lm_loss(out.logits, labels, content, 1.0), out.loss, atol=1e-5)
    assert not torch.allclose(weighted_lm_loss(out.logits, labels, content, 4.0), out.loss, atol=1e-4)


def test_kind_weights_change_the_drawn_mix(tok, tmp_path):
    from sage_engine.tinyworld.training.data import KINDS, build_cache
    from sage_engine.tinyworld.training.trainset import TrainSet
    build_cache(tmp_path, tok, seed=0, n_images=40, n_videos=10, log=lambda *a: None)
    data = TrainSet.load(tmp_path, tok)
    kinds = data.ex["kind"]

    def drawn(weights):
        seen = []
        collate, data.collate = data.collate, lambda ids, flips=None: seen.extend(ids)
        batches = data.batches(4, random.Random(0), pool=2, kind_weights=weights)
        for _ in range(40):
            next(batches)
        data.collate = collate
        return [KINDS[int(kinds[i])] for i in seen]

    plain = drawn(None)
    assert "describe" in plain and "motion" in plain
    never = drawn({"describe": 0.0, "describe_video": 0.0})
    assert never and not {"describe", "describe_video"} & set(never)
    assert set(drawn({k: float(k == "motion") for k in KINDS})) == {"motion"}
    heavy = drawn({"size": 20.0})
    assert heavy.count("size") / len(heavy) > 2 * plain.count("size") / len(plain)
    with pytest.raises(AssertionError, match="unknown kinds"):
        next(data.batches(4, random.Random(0), kind_weights={"colours": 2.0}))
    from sage_engine.tinyworld.__main__ import main
    for flag, bad in (("--kind-weight", "colours=2"), ("--kind-weight", "describe"), ("--kind-weight", "describe=-1"),
                      ("--hard-weight", "colours=2"), ("--prompt-targets", "describe")):
        with pytest.raises(SystemExit):
            main(["train", flag, bad, "--out", str(tmp_path / "never")])
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("options", [["--place-weight", "0.3", "--draft-place-weight", "0.2"],
                                     ["--place-weight", "0", "--no-interleaved-rope"],
                                     ["--place-weight", "0.1", "--interleaved-rope",
                                      "--content-weight", "4", "--kind-weight", "describe=0.4",
                                      "--kind-weight", "motion=1.5", "--draft-kind-weight", "describe=2"],
                                     ["--retrieval-weight", "0.3", "--interleaved-rope", "--mirror", "0.5",
                                      "--hard-weight", "position=3", "--prompt-targets", "shape,motion"],
                                     ["--draft-layers", "1", "--draft-retrieval-weight", "0", "--draft-lr", "3e-3",
                                      "--draft-place-weight", "0"]])
def test_training_script_runs_a_few_steps(tmp_path, options):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from sage_engine.tinyworld.__main__ import main
    from sage_engine.tinyworld.training.config import TrainConfig
    main(["train", "--tiny", "--steps", "2", *options, "--out", str(tmp_path / "m"),
          "--cache", str(tmp_path / "cache")])
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    config = summary["config"]
    assert config["draft_kind_weights"] == ([["describe", 2.0]] if "--draft-kind-weight" in options else [])
    assert config["mirror"] == (0.5 if "--mirror" in options else TrainConfig().mirror)
    assert config["prompt_targets"] == (["shape", "motion"] if "--prompt-targets" in options
                                        else list(TrainConfig().prompt_targets))
    assert (tmp_path / "cache" / "retrieval_prompt_v2.pt").exists()   # built with the cache, used when asked
    assert config["hard_weights"] == ([["position", 3.0]] if "--hard-weight" in options else
                                      [list(x) for x in TrainConfig().hard_weights])
    assert (tmp_path / "cache" / "retrieval_v3_both.pt").exists()
    # the summary: what ran, how long each stage took, the final smoothed losses
    assert summary["threads"] == torch.get_num_threads() and not summary["only_draft"] and summary["examples"] > 0
    assert set(summary["seconds"]) == {"cache", "target", "draft", "total"} and summary["seconds"]["cache"] > 0
    assert summary["target"]["steps"] == summary["draft"]["steps"] == 2
    assert summary["target"]["vision"]["steps"] == summary["draft"]["vision"]["steps"] == 2
    final = summary["target"]["final"]
    place_weight = float(options[options.index("--place-weight") + 1]) if "--place-weight" in options else 0.1
    assert {"loss", "aux"} <= set(final) and ("place" in final) == (place_weight > 0)
    # the draft's retrieval loss, where asked for, on a draft of the layers asked for
    draft_retrieval = config["draft_retrieval_weight"] > 0
    assert draft_retrieval == ("--draft-retrieval-weight" not in options)   # on by default
    # and its PlaceAux: on by default, at the weight asked for (0: off)
    asked = options[options.index("--draft-place-weight") + 1] if "--draft-place-weight" in options else None
    draft_place = config["draft_place_weight"]
    assert draft_place == (TrainConfig().draft_place_weight if asked is None else float(asked))
    assert TrainConfig().draft_place_weight > 0
    assert {"kl", "top1_agree", "aux"} | ({"retrieval"} if draft_retrieval else set()) | (
        {"place"} if draft_place > 0 else set()) == set(summary["draft"]["final"])
    assert config["draft_lr"] == (3e-3 if "--draft-lr" in options else TrainConfig().draft_lr)
    draft_layers = 1 if "--draft-layers" in options else TrainConfig().draft.layers
    assert draft_layers == (1 if "--draft-layers" in options else 2)
    for role in ("target", "draft"):
        path = tmp_path / "m" / f"tinyworld-{role}"
        model = AutoModelForImageTextToText.from_pretrained(path)
        processor = AutoProcessor.from_pretrained(path)
        assert model.config.model_type == "qwen2_5_vl" and processor.video_processor.num_frames == W.MODEL_FRAMES
        if role == "draft":
            assert model.config.text_config.num_hidden_layers == draft_layers
        sections = model.config.text_config.rope_parameters["mrope_section"]
        assert (len(sections) > 3) == ("--no-interleaved-rope" not in options)   # interleaved by default


def test_pixel_aux_asks_each_visual_token_for_its_cell_s_colours_and_lightness(tok, tmp_path):
    """Batches of a cache with world scenes and pictures carry each shown picture's cell stats (mirrored with the
    picture), and PixelAux's loss reaches the vision tower through the merged tokens."""
    from sage_engine.tinyworld.architecture import TINY, build_model
    from sage_engine.tinyworld.pixels import PALETTE, cell_stats, picture_facts
    from sage_engine.tinyworld.training.data import build_cache
    from sage_engine.tinyworld.training.picture_data import add_pictures
    from sage_engine.tinyworld.training.pixel_aux import N_OUT, PixelAux, pixel_targets
    from sage_engine.tinyworld.training.trainset import TrainSet
    build_cache(tmp_path, tok, seed=0, n_images=6, n_videos=2, log=lambda *a: None)
    add_pictures(tmp_path, tok, seed=0, n_pictures=4, n_clips=2, log=lambda *a: None)
    data = TrainSet.load(tmp_path, tok, pixel_labels=True)
    media, index = data.ex["media"], data.ex["index"]
    images = [i for i in range(len(data)) if int(media[i]) == 0][-3:]   # pictures (appended last)
    videos = [i for i in range(len(data)) if int(media[i]) == 1][-2:]
    flips = [True, False, False, True, False]
    batch = data.collate(images + videos, flips)
    px = batch.pop("pixel_targets")
    assert px["image"].shape == (3, 9, N_OUT) and px["video"].shape == (2, 18, N_OUT)
    shown = np.array(data.images[int(index[images[0]])])[:, ::-1]    # the first item is shown mirrored
    assert torch.allclose(px["image"][0], torch.from_numpy(pixel_targets(np.ascontiguousarray(shown))))
    shares, light = cell_stats(np.ascontiguousarray(shown))
    facts = picture_facts(np.ascontiguousarray(shown))
    assert [PALETTE[int(k)] for k in shares.argmax(1)] == list(facts.cells)   # the facts' cells come from the stats
    assert np.allclose(light, facts.cell_l) and torch.allclose(px["image"][0, :, -1], torch.from_numpy(light) / 100)
    assert torch.allclose(px["image"][0, :, :-1].sum(-1), torch.ones(9))
    batch.pop("vision_targets", None), batch.pop("retrieval_targets", None)
    model = build_model(TINY, tok)
    head = PixelAux(model)
    model(**batch)
    loss = head.loss(px["image"], px["video"])
    loss.backward()
    assert torch.isfinite(loss) and loss > 0
    assert model.model.visual.patch_embed.proj.weight.grad.abs().sum() > 0
    assert head.loss(px["image"], None).item() == 0   # nothing captured since the last loss
    head.remove()
