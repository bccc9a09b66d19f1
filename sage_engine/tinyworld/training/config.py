"""TrainConfig: the recipe of the tinyworld pair. Its defaults train the shipped pair; every field is an option
a user may vary (the `train` command sets the common ones). RUNS.md has the recipes measured on the way.

The recipe, in the order train.py runs it:
- the tokenizer and a cache of rendered scenes with their questions and per-token targets (data.py);
- each model's vision tower first trains alone on a dense auxiliary loss over its merged visual tokens
  (vision_aux.VisionAux: what colours / sizes show in each cell and which shape covers most of it), which
  stays on afterwards with weight aux_weight; the patch embedding starts from whitened patches (whiten_eps);
- the target: cross-entropy on the answers, plus PlaceAux (place_weight: an early language-model layer must
  say where each visual token is and what changed there) and the retrieval loss (retrieval_weight: chosen
  attention heads must look at the object each answer sentence, and each short question once it has named
  its object, is about); examples drawn with kind_weights and hard_weights, a share `mirror` of them shown
  left-right mirrored; the tower learns at tower_lr_scale x the language model's rate;
- the draft: distilled from the target, teacher-forced KL(p_target || q_draft) on the same answers, plus the
  retrieval loss on one head of its second layer (draft_retrieval_weight) and PlaceAux on its first layer's state
  (draft_place_weight).
"""
from __future__ import annotations

import dataclasses

from .. import architecture as M
from .retrieval import PROMPT_KINDS


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    seed: int = 0                 # seeds the corpus, the cache, the init and the batch order
    n_images: int = 36_000        # rendered image scenes (3 questions each)
    n_videos: int = 12_000        # rendered clips (2 questions each)
    # share of the 3- and 4-object training scenes that have an occluding pair (the world draws OCCLUSION, 0.2):
    # naming both shapes of one visual token takes thousands of examples to learn
    occlusion: float = 0.5
    batch_size: int = 24
    target_steps: int = 11_000
    target_lr: float = 1.5e-3
    draft_steps: int = 12_000
    draft_lr: float = 1e-3
    warmup: int = 200
    eval_every: int = 1_000       # quick QA eval (fresh scenes) every so many steps; 0 = never
    aux_weight: float = 1.0       # weight of the per-visual-token auxiliary loss (0 = off)
    vision_steps: int = 800       # vision-only steps (auxiliary loss alone) before the target's language model trains
    draft_vision_steps: int = 800  # the same before the draft's distillation
    vision_batch: int = 32        # images per vision-only step
    vision_video_batch: int = 8   # clips per vision-only step
    vision_lr: float = 2e-3
    whiten_eps: float = 1e-3      # init the patch embedding from whitened patches (whiten_patch_embed); 0: random init
    place_weight: float = 0.1     # weight of the target's PlaceAux loss (0 = off)
    place_layer: int = 1          # the target decoder layer whose output PlaceAux reads
    interleaved_rope: bool = True  # M-RoPE frequencies shared t/h/w in turn (models.mrope_section); False: Qwen's split
    content_weight: float = 1.0   # loss weight of answer tokens that name a fact (losses.content_tokens) vs phrasing
    tower_lr_scale: float = 0.3   # learning rate of the vision tower while the language model trains, x target_lr
    # (kind, weight): how often the target draws the examples of a kind (data.KINDS; 1 if absent)
    kind_weights: tuple[tuple[str, float], ...] = (("motion", 2.0), ("colour", 2.0), ("yesno", 2.5), ("shape", 1.5),
                                                   ("position", 1.5), ("describe", 2.5))
    # (kind, factor): within the kind, confusable examples (retrieval.confusable) are drawn factor x as often,
    # the kind's total draw unchanged
    hard_weights: tuple[tuple[str, float], ...] = (("position", 3.0), ("yesno", 2.0), ("size", 2.0),
                                                   ("describe", 4.0))
    # (kind, weight) for the draft's distillation; empty: the natural draw, where descriptions (the long answers
    # speculation pays on) carry most answer tokens
    draft_kind_weights: tuple[tuple[str, float], ...] = ()
    retrieval_weight: float = 0.3  # weight of the retrieval loss (retrieval.py) on retrieval_heads (0 = off)
    retrieval_heads: tuple[tuple[int, int], ...] = ((2, 0), (4, 0))   # the (decoder layer, head) pairs it supervises
    # the same loss on the draft's heads while it is distilled (0 = off): with two layers the draft learns to find
    # the object the sentence is about, as the target's heads do, and agrees with the target more on fresh scenes
    draft_retrieval_weight: float = 0.3
    draft_retrieval_heads: tuple[tuple[int, int], ...] = ((1, 0),)
    # PlaceAux on the draft's decoder layer `draft_place_layer` while it is distilled (0 = off): its visual tokens
    # then carry where they are, for its second layer to read as the target's later layers do (place_weight): the
    # places are what the draft missed most without it (" right" for " left", " In the top" for " At the top")
    draft_place_weight: float = 0.1
    draft_place_layer: int = 0
    # kinds whose question tokens the retrieval loss also supervises once the question has named its object
    # (retrieval.prompt_targets)
    prompt_targets: tuple[str, ...] = PROMPT_KINDS   # every kind that has question targets
    # weight of the towers' loss on each cell's colour shares and lightness from the pixels (pixel_aux.PixelAux),
    # target and draft alike (0 = off)
    pixel_weight: float = 0.0
    mirror: float = 0.5           # share of training examples shown left-right mirrored (trainset.TrainSet.collate)
    target: M.PairMember = M.TARGET
    draft: M.PairMember = M.DRAFT
