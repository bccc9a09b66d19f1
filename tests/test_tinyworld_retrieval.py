"""tinyworld training's retrieval targets: which questions are confusable (hard weights), where a prompt and an
answer point, the mirrored examples that must stay true, and the retrieval loss."""
from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch

from sage_engine.tinyworld import language as L
from sage_engine.tinyworld import world as W
from sage_engine.tinyworld.tokenizer import user_turn


def test_confusable_questions_are_the_ones_a_partial_match_gets_wrong():
    from sage_engine.tinyworld.training.retrieval import confusable
    red_sq, green_sq, red_star, blue_circle = (W.Obj(s, c, "small", cell) for s, c, cell in
                                               (("square", "red", 0), ("square", "green", 2),
                                                ("star", "red", 6), ("circle", "blue", 8)))
    where = L.Example("position", "Where is the red square?", "", {"position": "top left"})
    assert confusable(where, [red_sq, green_sq])             # another square: a shape-only match picks it
    assert confusable(where, [red_sq, red_star])             # another red shape: a colour-only match picks it
    assert not confusable(where, [red_sq, blue_circle])
    yes = L.Example("yesno", "Is there a red square?", "", {"yes": True})
    no = L.Example("yesno", "Is there a blue square?", "", {"yes": False})
    assert not confusable(yes, [red_sq, blue_circle]) and confusable(yes, [red_sq, green_sq])
    assert confusable(no, [red_sq]) and not confusable(no, [red_star])   # a square (the asked shape) vs nothing
    by_place = L.Example("shape", "What shape is in the top left?", "", {"shape": "square"})
    assert not confusable(by_place, [red_sq, green_sq, red_star])
    # an occluding pair (two objects in one cell, one visual token): its description and a yes/no question
    # about one of its members are confusable; the same scenes without the pair are not
    big_blue = W.Obj("cross", "blue", "large", 0)
    describe = L.Example("describe", "Describe the image.", "", {})
    assert confusable(describe, [red_sq, big_blue, blue_circle]) and not confusable(describe, [red_sq, blue_circle])
    assert confusable(yes, [red_sq, big_blue]) and not confusable(yes, [red_sq, blue_circle])


def test_hard_weights_draw_confusable_examples_more_and_keep_each_kind_s_share(tok, tmp_path):
    from sage_engine.tinyworld.training.data import HARD_FILE, KINDS, build_cache, build_hard_flags, scene_stream
    from sage_engine.tinyworld.training.retrieval import confusable
    from sage_engine.tinyworld.training.trainset import TrainSet
    build_cache(tmp_path, tok, seed=0, n_images=200, n_videos=10, log=lambda *a: None)
    with pytest.raises(ValueError, match="hard_weights need"):
        TrainSet.load(tmp_path, tok).draw_weights(None, {"position": 3.0})
    build_hard_flags(tmp_path, seed=0, n_images=200, n_videos=10)
    data = TrainSet.load(tmp_path, tok)
    replayed = [confusable(e, (sc.start if m == "video" else sc).objects)
                for m, _, sc, _, exs in scene_stream(0, 200, 10) for e in exs]
    assert data.hard.tolist() == replayed and (tmp_path / HARD_FILE).exists()
    kinds = data.ex["kind"].long()
    pos = kinds == KINDS.index("position")
    assert 0 < int((data.hard & pos).sum()) < int(pos.sum())   # both kinds of position question are in the cache
    plain = data.draw_weights({"position": 1.5, "colour": 2.0})
    hard = data.draw_weights({"position": 1.5, "colour": 2.0}, {"position": 3.0})
    for k in range(len(KINDS)):   # no kind gains or loses draws
        assert torch.isclose(plain[kinds == k].sum(), hard[kinds == k].sum()), KINDS[k]
    assert not torch.equal(plain, hard) and torch.equal(plain[~pos], hard[~pos])
    easy, hardest = hard[pos & ~data.hard].unique(), hard[pos & data.hard].unique()
    assert len(easy) == len(hardest) == 1 and torch.isclose(hardest / easy, torch.tensor(3.0, dtype=hard.dtype)).all()
    assert data.draw_weights(None, None) is None


def test_prompt_targets_start_where_the_question_has_named_its_object(tok, tmp_path):
    from sage_engine.tinyworld.training.data import KINDS, build_cache, build_prompt_targets, expand_pads
    from sage_engine.tinyworld.training.retrieval import addressed_at, prompt_targets, sentence_masks
    from sage_engine.tinyworld.training.trainset import TrainSet
    q = "Is the triangle in the bottom right small or large?"
    assert q[:addressed_at(q)].endswith("bottom right")
    assert "Where is the red square?"[:addressed_at("Where is the red square?")].endswith("red square")
    assert addressed_at("How many shapes are there?") == len("How many shapes are there?")
    sq, star = W.Obj("square", "red", "small", 5), W.Obj("star", "blue", "large", 3)
    scene = W.Scene("white", (sq, star))
    for ex, want in ((L.Example("shape", "What shape is on the right?", "It is a square.", {"shape": "square"}),
                      1 << 5),
                     (L.Example("position", "Where is the blue star?", "It is on the left.", {"position": "left"}),
                      1 << 3),
                     (L.Example("describe", "Describe this image.", "Two shapes.", {}), 0)):   # (motion: below)
        text = expand_pads(user_turn("image", ex.prompt))
        ids = tok(text, add_special_tokens=False)["input_ids"]
        bits = prompt_targets(ex, scene, tok, text, ids)
        words = [tok.decode([t]) for t in ids]
        assert len(bits) == len(ids) and set(bits) == ({0, want} if want else {0}), (ex.prompt, bits)
        if want:   # the first marked token follows the addressing word: the word's position is supervised
            first = bits.index(want)
            assert words[first - 1].strip() in ("right", "star") and all(bits[first:]), words[first - 1:]
    clip = W.sample_clip(random.Random(3))   # "What happens?" names no object: the tokens after it look at the event
    ex = L.video_example(clip, random.Random(3), "motion")
    text = expand_pads(user_turn("video", ex.prompt))
    ids = tok(text, add_special_tokens=False)["input_ids"]
    bits = prompt_targets(ex, clip, tok, text, ids)
    (_, _, event), = sentence_masks(ex, clip)
    first = bits.index(event)
    assert event and tok.decode(ids[first - 1:first + 1]).startswith("?") and set(bits[first:]) == {event}
    assert not any(bits[:first])
    build_cache(tmp_path, tok, seed=0, n_images=20, n_videos=6, log=lambda *a: None)
    build_prompt_targets(tmp_path, tok, seed=0, n_images=20, n_videos=6)
    plain, both = TrainSet.load(tmp_path, tok), TrainSet.load(tmp_path, tok, prompt_kinds=("shape", "motion"))
    ex = plain.ex
    prompt = torch.zeros(len(ex["tokens"]), dtype=torch.bool)
    kind = torch.zeros(len(ex["tokens"]), dtype=torch.long)
    for i, n in enumerate(ex["prompt_len"]):
        prompt[int(ex["offsets"][i]):int(ex["offsets"][i]) + int(n)] = True
        kind[int(ex["offsets"][i]):int(ex["offsets"][i + 1])] = ex["kind"][i]
    assert torch.equal(both.retrieval[~prompt], plain.retrieval[~prompt]) and not plain.retrieval[prompt].any()
    marked = set(kind[prompt & (both.retrieval != 0)].tolist())   # only the chosen kinds' questions, both of them
    assert marked == {KINDS.index("shape"), KINDS.index("motion")}, marked


def test_retrieval_targets_point_at_the_object_each_sentence_is_about(tok, tmp_path):
    from sage_engine.tinyworld.training.data import build_cache, scene_stream
    from sage_engine.tinyworld.training.retrieval import answer_targets, sentence_masks
    from sage_engine.tinyworld.training.trainset import TrainSet
    rng = random.Random(4)
    checked = set()
    for _ in range(60):
        scene = W.sample_scene(rng, 2, 4)
        cells = {o.cell for o in scene.objects}
        for kind in ("colour", "shape", "size", "position", "count", "describe"):
            ex = L.image_example(scene, rng, kind)
            spans = sentence_masks(ex, scene)
            if kind in ("colour", "shape", "size"):   # asked by place, by shape or by colour + shape: one object
                (_, _, bits), = spans
                (o,) = [o for o in scene.objects
                        if ex.facts[kind] == getattr(o, kind) and bits == 1 << o.cell] or [None]
                assert o is not None, (ex, bits)
            if kind == "count":
                assert all(b == sum(1 << c for c in cells) for _, _, b in spans), ex
            if kind == "describe":
                for s, e, b in spans:
                    named = [o for o in scene.objects if f"{o.colour} {o.shape}" in ex.answer[s:e]]
                    if named:
                        assert b == sum(1 << c for c in {o.cell for o in named}), ex.answer[s:e]
                        checked.add("describe")
                    elif "background" in ex.answer[s:e]:
                        assert b == sum(1 << c for c in cells)
            ids = tok(ex.answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
            per_token = answer_targets(ex, scene, tok, ids)
            assert len(per_token) == len(ids) and per_token[-1] == 0 and any(per_token)
    assert checked == {"describe"}
    for _ in range(60):   # yes/no: "yes" -> the object asked about; "no" -> the objects sharing its colour or shape
        scene = W.sample_scene(rng, 2, 4)
        ex = L.image_example(scene, rng, "yesno")
        c, s = re.fullmatch(r"Is there an? (\w+) (\w+)\?", ex.prompt).groups()
        want = [o for o in scene.objects if (o.colour, o.shape) == (c, s)] if ex.facts["yes"] else \
               [o for o in scene.objects if o.colour == c or o.shape == s]
        assert all(b == sum(1 << o.cell for o in want) for _, _, b in sentence_masks(ex, scene)), (ex, want)
        checked.add(ex.facts["yes"] and "yes" or ("no, near miss" if want else "no"))
    assert checked == {"describe", "yes", "no, near miss", "no"}, checked
    events = set()
    for _ in range(60):   # clips: the event's cells (subject; a move: also its end), before (tokens 0-8) and after
        clip = W.sample_clip(rng)
        ex = L.video_example(clip, rng, "motion")
        (_, _, bits), = sentence_masks(ex, clip)
        s, a = clip.subject, clip.after
        cells = {s.cell} | ({a.cell} if a is not None else set())
        assert bits == sum((1 << c) | (1 << (9 + c)) for c in cells), (clip.event, bin(bits))
        assert bin(bits).count("1") == (4 if clip.event == "move" else 2), clip.event
        events.add(clip.event)
    assert {"move", "appear", "disappear"} <= events, events
    # the cache's per-token targets line up with its tokens (answer_targets asserts the token ids match)
    build_cache(tmp_path, tok, seed=0, n_images=20, n_videos=6, log=lambda *a: None)
    data = TrainSet.load(tmp_path, tok)
    assert data.retrieval is not None and len(data.retrieval) == len(data.ex["tokens"])
    prompt_tokens = torch.cat([torch.arange(int(data.ex["offsets"][i]), int(data.ex["offsets"][i]) + int(n))
                               for i, n in enumerate(data.ex["prompt_len"])])
    assert not data.retrieval[prompt_tokens].any() and data.retrieval.any()
    batch = data.collate([0, 1, 2])
    assert batch["retrieval_targets"].shape == batch["input_ids"].shape
    assert sum(len(x[-1]) for x in scene_stream(0, 20, 6)) == len(data)


def test_mirrored_examples_are_true_of_the_mirrored_scene(tok, tmp_path):
    """collate(flips=[True]) must give exactly the example of the mirrored scene: the picture flipped,
    "left" / "right" swapped in prompt and answer, and every per-token target (vision labels, retrieval
    bits) equal to what the mirrored scene itself gives, so that mirroring teaches the other column
    and nothing false."""
    import dataclasses

    from sage_engine.tinyworld.training.data import build_cache, patchify, scene_stream
    from sage_engine.tinyworld.training.retrieval import answer_targets
    from sage_engine.tinyworld.training.trainset import TrainSet
    from sage_engine.tinyworld.training.vision_aux import clip_targets, image_targets
    # occlusion=1.0: every 3- and 4-object scene has an occluding pair, and the replay must draw the same scenes
    build_cache(tmp_path, tok, seed=0, n_images=24, n_videos=10, log=lambda *a: None, occlusion=1.0)
    data = TrainSet.load(tmp_path, tok)
    assert data.swap is not None

    def swapped(text):
        return text.replace("left", "\0").replace("right", "left").replace("\0", "right")

    k, sided = 0, 0
    stream = list(scene_stream(0, 24, 10, occlusion=1.0))
    assert sum(m == "image" and media.occluded is not None for m, _, media, _, _ in stream) >= 6
    for m, i, media, noise, exs in stream:
        mirrored = W.mirror_scene(media) if m == "image" else W.mirror_clip(media)
        for e in exs:
            plain, flip = data.collate([k]), data.collate([k], [True])
            p = int(data.ex["prompt_len"][k])
            ids = flip["input_ids"][0]
            assert tok.decode(ids) == swapped(tok.decode(plain["input_ids"][0]))
            me = dataclasses.replace(e, prompt=swapped(e.prompt), answer=swapped(e.answer))
            assert flip["retrieval_targets"][0, p:].tolist() == answer_targets(me, mirrored, tok, ids[p:].tolist())
            labels, dom = (image_targets if m == "image" else clip_targets)(mirrored)
            got = flip["vision_targets"][m]
            assert np.array_equal(got[0][0].numpy(), labels) and np.array_equal(got[1][0].numpy(), dom), e
            if m == "image":   # the flipped picture is the mirrored scene's (the background noise is +-6)
                drawn = W.render_image(mirrored, noise_seed=noise).astype(int)
                assert (np.abs(drawn - data.images[i][:, ::-1].astype(int)) > 13).mean() < 0.002
                flipped = torch.from_numpy(np.ascontiguousarray(data.images[i][:, ::-1]))
                assert torch.equal(flip["pixel_values"], patchify(flipped.unsqueeze(0).expand(2, -1, -1, -1)))
            sided += "left" in e.prompt + e.answer or "right" in e.prompt + e.answer
            k += 1
    assert k == len(data) and sided > 10
    seen = []   # batches(mirror=p) flips about that share of the examples but never a description, none at 0
    collate, data.collate = data.collate, lambda ids, flips=None: seen.append((ids, flips))
    batches = data.batches(4, random.Random(0), pool=2, mirror=0.5)
    for _ in range(100):
        next(batches)
    from sage_engine.tinyworld.training.data import KINDS
    described = {KINDS.index("describe"), KINDS.index("describe_video")}
    flags = [(int(data.ex["kind"][i]) in described, f) for ids, fl in seen for i, f in zip(ids, fl)]
    others = [f for d, f in flags if not d]
    assert 0.35 < sum(others) / len(others) < 0.65
    assert sum(d for d, _ in flags) > 20 and not any(f for d, f in flags if d)
    seen.clear()
    next(data.batches(4, random.Random(0), pool=2))
    assert seen[0][1] is None
    data.collate = collate


def test_retrieval_loss_rewards_attention_on_the_target_tokens():
    from sage_engine.tinyworld.training.retrieval import RetrievalAux
    img = 7
    ids = torch.tensor([[1, 2] + [img] * 9 + [3, 4, 5, 6]])
    targets = torch.zeros_like(ids)
    targets[0, 13:15] = 1 << 4                       # tokens 13 and 14 are about cell 4 (position 13 in the sequence)
    aux = RetrievalAux(((0, 1),), img, 8)
    L_ = ids.shape[1]
    uniform = torch.full((1, 2, L_, L_), 1.0 / L_)
    loss, share = aux.loss([uniform], ids, targets)
    assert share == pytest.approx(1 / 9) and float(loss) == pytest.approx(-np.log(1 / 9 + 1e-6), rel=1e-4)
    focused = uniform.clone()
    focused[0, 1, :, :] = 0
    focused[0, 1, :, 2 + 4] = 1.0                     # head 1 looks only at cell 4
    loss, share = aux.loss([focused], ids, targets)
    assert share == pytest.approx(1.0) and float(loss) < 1e-5
    focused[0, 1, 12:14] = 0
    focused[0, 1, 12:14, 2 + 5] = 1.0                 # the two supervised queries (12, 13) look at cell 5
    loss, share = aux.loss([focused], ids, targets)
    assert share == 0.0 and float(loss) > 10
    assert aux.loss([focused], ids, torch.zeros_like(ids))[0] == 0


def test_a_picture_answer_s_words_point_at_the_cells_they_name():
    """picture_spans: in held-in pictures' and clips' answers, every colour word whose span points at one cell names
    that cell's colour, a place phrase of the brightest (darkest) part points at the brightest (darkest) cell, a row
    sentence points inside its row, and a clip's change at both temporal groups."""
    from sage_engine.tinyworld.picture_talk import ROW_WORDS
    from sage_engine.tinyworld.pixels import PALETTE
    from sage_engine.tinyworld.training.picture_data import picture_spans, picture_stream
    checked = {"colour": 0, "place": 0, "row": 0, "change": 0}
    for m, _, _, exs in picture_stream(4, 40, 12):
        for ex in exs:
            f, t = ex.facts["picture"], ex.answer
            spans = picture_spans(ex)
            assert all(0 <= s < e <= len(t) for s, e, _ in spans)
            assert all(e <= s2 for (_, e, _), (s2, _, _) in zip(spans, spans[1:])), "spans overlap"
            for s, e, bits in spans:
                cells = [j for j in range(18) if bits >> j & 1]
                words = re.findall(r"[a-z]+", t[s:e].lower())
                colours = [w for w in words if w in PALETTE]
                if ex.kind == "pic_colour":
                    assert cells == [ex.facts["cell"]] and f.cells[cells[0]] in colours
                    checked["colour"] += 1
                elif len(cells) == 1 and colours:
                    assert colours[0] == f.cells[cells[0]], (t[s:e], cells, f.cells)
                    side = re.match(r"the (left|middle|right) is", t[s:e])
                    assert side is None or ("left", "middle", "right").index(side.group(1)) == cells[0] % 3
                    checked["colour"] += 1
                elif "part is" in t[max(0, s - 9):s]:
                    which = "brightest" if "brightest part is" in t[max(0, s - 20):s] else "darkest"
                    assert cells == [f.brightest if which == "brightest" else f.darkest]
                    checked["place"] += 1
                elif t[s:e].startswith("In the") and " row," in t[s:e]:
                    r = ROW_WORDS.index(words[2])
                    assert cells == [3 * r, 3 * r + 1, 3 * r + 2]
                    checked["row"] += 1
                if m == "video" and ("turns from" in t[s:e] or re.search(r"gets? (lighter|darker)", t[s:e])):
                    assert cells and all(c + 9 in cells for c in cells if c < 9)
                    checked["change"] += 1
    assert min(checked.values()) >= 5, checked
