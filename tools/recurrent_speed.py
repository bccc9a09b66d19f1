"""What trees through recurrent layers cost here: `ar`, `chain`, `sage` and the paper's SAGE on two Qwen3.5
pairs whose trees are read path by path (sage_engine/models/recurrent_paths.py), two rounds each, with the paths'
own counters.

    python -m tools.recurrent_speed            # the tiny sharpened pair of the tests and a random ~114M one

Prints one Markdown table a pair (docs/log/LAYER_KINDS.md has a run's)."""

from __future__ import annotations

import copy
import time
import warnings

import torch

from sage_engine import SpecEngine, prepare_input
from sage_engine.config import PAPER_SAGE
from sage_engine.models.loading import ModelPair
from sage_testing.tiny_kinds import _qwen3_ids, kind_pair, qwen3_processor
from sage_testing.tiny_pairs import image, sharpen

POLICIES = ("ar", "chain", "sage", PAPER_SAGE)
TYPES = ["linear_attention"] * 3 + ["full_attention"]


def big_pair() -> ModelPair:
    """A random Qwen3.5 of ~114M parameters (hidden 768, 12 layers: 3 gated-delta-rule layers to 1 full), its head
    sharpened; the draft its own first 4 layers with its embeddings, norm and head."""
    import transformers as T

    proc = qwen3_processor()
    tok = proc.tokenizer
    torch.manual_seed(0)
    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3], "mrope_interleaved": True,
            "partial_rotary_factor": 0.25}
    text = dict(vocab_size=len(tok), hidden_size=768, intermediate_size=2816, num_hidden_layers=12,
                num_attention_heads=12, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
                initializer_range=0.02, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
                pad_token_id=tok.eos_token_id, rope_parameters=rope, linear_num_key_heads=8,
                linear_num_value_heads=16, linear_key_head_dim=64, linear_value_head_dim=64, layer_types=TYPES * 3)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=768, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64, initializer_range=0.2)
    cfg = T.Qwen3_5Config(text_config=text, vision_config=vision, **_qwen3_ids(tok))
    target = sharpen(T.Qwen3_5ForConditionalGeneration(cfg).eval(), 30.0)
    draft = copy.deepcopy(target)
    lm = draft.model.language_model
    lm.layers = lm.layers[:4]
    for c in (draft.config.text_config, lm.config):
        c.num_hidden_layers, c.layer_types = 4, TYPES
    return ModelPair(target, draft, proc, None, "random-qwen3.5-114m", "its-first-4-layers")


def measure(label: str, pair: ModelPair, new_tokens: int = 64) -> None:
    prep = prepare_input(pair, "the green triangle moves to the left while the yellow star grows",
                         images=[image(3, 64)])
    engine = SpecEngine(pair)
    millions = [sum(p.numel() for p in m.parameters()) / 1e6 for m in (pair.target, pair.draft)]
    print(f"### {label}: target {millions[0]:.1f}M, draft {millions[1]:.1f}M parameters")
    engine.generate(prep, "ar", max_new_tokens=8, ignore_eos=True)  # warm
    runs: dict[str, list[dict]] = {}
    for _ in range(2):
        for policy in POLICIES:
            t, d = engine.target.paths, engine.draft.paths
            before = (t.replays, t.row_tokens, d.replays, d.row_tokens)
            t0 = time.perf_counter()
            res = engine.generate(prep, policy, max_new_tokens=new_tokens, ignore_eos=True)
            seconds = time.perf_counter() - t0
            steps = len(res.steps) - 1
            after = (t.replays, t.row_tokens, d.replays, d.row_tokens)
            per = [(a - b) / steps for a, b in zip(after, before)]
            runs.setdefault(policy, []).append(dict(tps=len(res.token_ids) / seconds, tau=res.stats.mean_accepted,
                                                    per=per, ids=res.token_ids))
    ar = runs["ar"][0]["ids"]
    print("| policy | tokens/s (2 rounds) | tau | target: chains read again / step | target: tokens read in rows / "
          "step | draft: chains again / step | draft: row tokens / step | == ar |")
    print("|---|---|---|---|---|---|---|---|")
    for policy, rs in runs.items():
        p = rs[0]["per"]
        print(f"| {policy} | {rs[0]['tps']:.1f} / {rs[1]['tps']:.1f} | {rs[0]['tau']:.2f} | {p[0]:.2f} | {p[1]:.1f} | "
              f"{p[2]:.2f} | {p[3]:.1f} | {all(r['ids'] == ar for r in rs)} |")
    print(f"a row's cache (target, last pass): {engine.target.paths.row_bytes / 1e6:.2f} MB; "
          f"draft: {engine.draft.paths.row_bytes / 1e6:.2f} MB")


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    measure("sharpened tiny Qwen3.5 (noisy draft)", kind_pair("qwen3.5"))
    measure("random Qwen3.5 ~114M", big_pair())


if __name__ == "__main__":
    main()
