"""Outside references for the benchmark: transformers' own `generate()`, plain greedy and assisted.

Contract: `run_hf(pair, prepared, spec, max_new_tokens)` decodes one PreparedInput with the target's
`generate()` and returns a GenerationResult like `SpecEngine.generate` does (policy = `spec` as given,
token ids after the prompt up to and including the first EOS, `steps` empty):

  hf_generate                    greedy `target.generate(**inputs)`, no assistant
  hf_assisted                    greedy `target.generate(**inputs, assistant_model=draft)` with transformers'
                                 default candidate schedule, written out: `schedule=constant`
  hf_assisted:schedule=S         S = constant | heuristic | heuristic_transient (transformers' names)

Both are greedy (do_sample=False, one beam, repetition_penalty=1.0 whatever the checkpoint's
generation_config says), get `max_new_tokens` and the pair's EOS ids, and stop at EOS like the engine.
Only the input move and the `generate()` call are timed. RunStats come from forward hooks on both models
(microseconds per forward): the target's first forward is the prefill (with an assistant it also verifies
the first candidates); `target_forwards` and `mean_accepted` (tau) count the forwards after it, as the
engine does, so hf_generate has tau 1.0 and as many target forwards as `ar`.

Transformers 5.23's assisted defaults (GenerationConfig._get_default_generation_params, read from the
ASSISTANT's generation_config by AssistedCandidateGenerator): num_assistant_tokens 20, schedule "constant",
assistant_confidence_threshold 0.4 (the draft stops a round early below that top-1 probability; it adapts
only when scikit-learn is installed). Passing the schedule to `generate()` would not reach the assistant,
so `run_hf` sets it on the draft's generation_config and restores that config after every run: "heuristic"
then starts every run at 20 tokens, like "heuristic_transient" (runs never leak into each other).

What the assistant sees: NOT the image or video. `generate()` encodes the pixels once with the TARGET's
vision tower (`_prepare_multimodal_encoder_kwargs_for_generation`) and removes pixel_values from the
kwargs; the candidate generator hands the assistant the target's `mm_encoder_outputs`, but the assistant's
own `generate()` prefills with `is_first_iteration=False`, so `prepare_inputs_for_generation` drops them
(MULTIMODAL_INPUTS_TO_DROP_OUTSIDE_PREFILL). The draft reads the prompt with bare image/video placeholder
tokens and its vision tower never runs. `assistant_inputs()` measures this on a given input.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..backends.choose import sync
from ..core.events import GenerationResult, RunStats
from ..errors import InputError
from ..models.inputs import PreparedInput
from ..models.loading import ModelPair

HF_POLICIES: tuple[str, ...] = ("hf_generate", "hf_assisted")
SCHEDULES: tuple[str, ...] = ("constant", "heuristic", "heuristic_transient")
DEFAULT_SCHEDULE = "constant"  # transformers' default num_assistant_tokens_schedule
_IMAGE_KWARGS = ("mm_encoder_outputs", "inputs_embeds", "image_embeds")  # plus every "*pixel*" kwarg
_ASSISTANT_FIELDS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


@dataclass(frozen=True)
class HFSpec:
    name: str  # "hf_generate" | "hf_assisted"
    schedule: str | None  # hf_assisted's num_assistant_tokens_schedule; None for hf_generate


def is_hf_spec(spec: str) -> bool:
    return spec.split(":")[0] in HF_POLICIES


def parse_hf_spec(spec: str) -> HFSpec:
    """'hf_assisted:schedule=heuristic' -> HFSpec('hf_assisted', 'heuristic'); ValueError if not valid."""
    name, *pairs = spec.split(":")
    if name not in HF_POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(HF_POLICIES)}")
    if name == "hf_generate":
        if pairs:
            raise ValueError("policy 'hf_generate' has no knobs")
        return HFSpec(name, None)
    schedule = DEFAULT_SCHEDULE
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key != "schedule":
            raise ValueError(f"{spec!r}: {key!r} is not a knob of hf_assisted (its one knob: schedule)")
        if value not in SCHEDULES:
            raise ValueError(f"{spec!r}: schedule must be one of {', '.join(SCHEDULES)} (got {value!r})")
        schedule = value
    return HFSpec(name, schedule)


def _inputs_on_target(pair: ModelPair, prepared: PreparedInput) -> dict[str, torch.Tensor]:
    device = pair.target.get_input_embeddings().weight.device  # where input ids go (first shard)
    return {k: v.to(device) for k, v in prepared.target_inputs.items()}


class _Hooks:
    """Forward hooks on the target (and the draft): how many forwards, the time inside them, the target's
    cache length before each of its forwards, and which draft forwards received image or video inputs."""

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module | None):
        self.models = {"target": target, "draft": draft}
        self.starts: dict[str, list[float]] = {"target": [], "draft": []}
        self.ms: dict[str, list[float]] = {"target": [], "draft": []}
        self.cache_lens: list[int] = []  # target cache length before each target forward
        self.draft_with_image = 0  # draft forwards given pixels or visual embeddings
        self._handles: list = []

    def _pre(self, role: str):
        def hook(module, args, kwargs):
            if role == "target":
                cache = kwargs.get("past_key_values")
                self.cache_lens.append(0 if cache is None else int(cache.get_seq_length()))
            elif any(v is not None and ("pixel" in k or k in _IMAGE_KWARGS) for k, v in kwargs.items()):
                self.draft_with_image += 1
            self.starts[role].append(time.perf_counter())
        return hook

    def _post(self, role: str):
        def hook(module, args, kwargs, output):
            sync(module.device)
            self.ms[role].append((time.perf_counter() - self.starts[role][-1]) * 1e3)
        return hook

    def __enter__(self) -> _Hooks:
        for role, model in self.models.items():
            if model is not None:
                self._handles.append(model.register_forward_pre_hook(self._pre(role), with_kwargs=True))
                self._handles.append(model.register_forward_hook(self._post(role), with_kwargs=True))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _generate(pair: ModelPair, inputs: dict[str, torch.Tensor], spec: HFSpec, max_new_tokens: int) -> torch.Tensor:
    """The bare generate() call on `inputs` (already on the target's device); returns the sequence [1, S]."""
    eos = sorted(pair.eos_token_ids)
    kwargs = dict(do_sample=False, num_beams=1, repetition_penalty=1.0, max_new_tokens=max_new_tokens,
                  eos_token_id=eos, pad_token_id=eos[0] if eos else None)
    if spec.name == "hf_generate":
        return pair.target.generate(**inputs, **kwargs)
    if pair.draft is None:
        raise InputError("policy 'hf_assisted' needs a draft model")
    cfg = pair.draft.generation_config
    saved = {k: getattr(cfg, k, None) for k in _ASSISTANT_FIELDS}
    cfg.num_assistant_tokens_schedule = spec.schedule  # read from the ASSISTANT's config, not generate()'s kwargs
    try:
        return pair.target.generate(**inputs, assistant_model=pair.draft, **kwargs)
    finally:
        for k, v in saved.items():  # "heuristic" writes num_assistant_tokens back: every run starts afresh
            setattr(cfg, k, v)


def run_hf(pair: ModelPair, prepared: PreparedInput, spec: str, max_new_tokens: int = 128) -> GenerationResult:
    """Decode `prepared` with transformers' generate() as `spec` says (see the module docstring)."""
    parsed = parse_hf_spec(spec)
    if max_new_tokens < 1:
        raise InputError("max_new_tokens must be at least 1")
    with _Hooks(pair.target, pair.draft if parsed.name == "hf_assisted" else None) as hooks, torch.inference_mode():
        t0 = time.perf_counter()
        sequence = _generate(pair, _inputs_on_target(pair, prepared), parsed, max_new_tokens)
        sync(sequence.device)
        seconds = time.perf_counter() - t0
    ids = sequence[0, prepared.prompt_tokens:].tolist()
    text = pair.tokenizer.decode(ids, skip_special_tokens=True)
    finish = "eos" if ids and ids[-1] in pair.eos_token_ids else "length"
    return GenerationResult(spec, text, ids, _stats(hooks, t0, seconds, prepared.prompt_tokens, len(ids), finish))


def _stats(hooks: _Hooks, t0: float, seconds: float, prompt: int, new: int, finish: str) -> RunStats:
    """RunStats from the hooks' records. The target's cache before forward i > 0 holds the prompt and every
    token accepted before it but the newest one (which forward i reads), so it tells what forward 0 added."""
    lens, target_ms = hooks.cache_lens, hooks.ms["target"]
    forwards = max(len(lens) - 1, 0)  # after the prefill forward
    first_tokens = lens[1] - prompt + 1 if len(lens) > 1 else new
    prefill_end = hooks.starts["target"][0] + target_ms[0] / 1e3 if target_ms else t0 + seconds
    prefill_s = prefill_end - t0
    target_s = sum(target_ms[1:]) / 1e3
    draft_after = sum(ms for s, ms in zip(hooks.starts["draft"], hooks.ms["draft"]) if s >= prefill_end) / 1e3
    decode_s = seconds - prefill_s
    other_s = max(decode_s - target_s - draft_after, 0.0)
    return RunStats(
        new_tokens=new,
        seconds=seconds,
        tokens_per_second=new / seconds if seconds > 0 else 0.0,
        target_forwards=forwards,
        mean_accepted=(new - first_tokens) / forwards if forwards else 0.0,
        draft_forwards=len(hooks.ms["draft"]),
        prefill_seconds=prefill_s,
        target_seconds=target_s,
        draft_seconds=sum(hooks.ms["draft"]) / 1e3,
        other_seconds=other_s,
        overhead_fraction=other_s / decode_s if decode_s > 0 else 0.0,
        finish_reason=finish,
    )


def assistant_inputs(pair: ModelPair, prepared: PreparedInput, max_new_tokens: int = 8) -> dict:
    """Measure what HF's assistant receives on `prepared`: a short hf_assisted run with the draft's forwards
    and its vision tower watched. `sees_image` is False when no draft forward got pixels or visual embeddings
    and the draft's vision encoder never ran."""
    if pair.draft is None:
        raise InputError("policy 'hf_assisted' needs a draft model")
    visual = _vision_tower(pair.draft)
    runs = []
    handle = visual.register_forward_hook(lambda *a: runs.append(1)) if visual is not None else None
    try:
        with _Hooks(pair.target, pair.draft) as hooks, torch.inference_mode():
            _generate(pair, _inputs_on_target(pair, prepared), HFSpec("hf_assisted", DEFAULT_SCHEDULE), max_new_tokens)
    finally:
        if handle is not None:
            handle.remove()
    return {
        "draft_forwards": len(hooks.ms["draft"]),
        "draft_forwards_with_image_inputs": hooks.draft_with_image,
        "draft_vision_tower_runs": None if visual is None else len(runs),
        "sees_image": hooks.draft_with_image > 0 or bool(runs),
    }


def _vision_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The model's vision encoder under its usual transformers names (None when none is found)."""
    for owner in (getattr(model, "model", None), model):
        for name in ("visual", "vision_tower", "vision_model"):
            found = getattr(owner, name, None) if owner is not None else None
            if isinstance(found, torch.nn.Module):
                return found
    return None


def hf_notes(pair: ModelPair, inputs: list[tuple[str, str, PreparedInput]], policies: list[str]) -> dict:
    """What the HF references are and, measured on the first image and the first video, whether HF's
    assistant got the picture (hf_reference.py's docstring says why, in transformers 5.23, it does not)."""
    import transformers

    names = {parse_hf_spec(p).name for p in policies if is_hf_spec(p)}
    version = f"transformers {transformers.__version__}"
    notes = {}
    if "hf_generate" in names:
        notes["hf_generate"] = f"{version} target.generate(), greedy, no assistant"
    if "hf_assisted" in names:
        seen = {}
        for media, name, prep in inputs:  # (media, file name, prepared input) of the benchmark's inputs
            if media not in seen:
                seen[media] = {"input": name, **assistant_inputs(pair, prep)}
        sees = any(m["sees_image"] for m in seen.values())
        why = ("generate() encodes the pixels with the target's vision tower and the assistant's own prefill "
               "drops those features (MULTIMODAL_INPUTS_TO_DROP_OUTSIDE_PREFILL): the draft reads bare "
               "placeholder tokens and its vision tower never runs")
        notes["hf_assisted"] = {
            "assistant_sees_image": sees,
            "summary": f"{version}: the assistant (draft) " + (
                "received image/video inputs (see measured)" if sees else f"does NOT see the image or video; {why}"),
            "measured": seen,
            "schedule": f"hf_assisted = schedule={DEFAULT_SCHEDULE}, transformers' default (num_assistant_tokens 20, "
                        "assistant_confidence_threshold 0.4); set on the draft's generation_config and restored "
                        "after each run, so 'heuristic' starts every run afresh",
        }
    notes["stats"] = ("HF runs: tau and target_forwards count the target forwards after the first (prefill) one; "
                      "no per-step events, trees or draft pruning")
    return notes
