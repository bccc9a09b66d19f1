"""Presets are consistent data; a hub preset without a reachable hub fails fast with one line."""

import socket
import time

import pytest
import torch

from sage_engine.errors import ModelError
from sage_engine.models.loading import load_pair
from sage_engine.models.presets import PRESETS, hub_problem, resolve


def test_every_preset_is_self_consistent():
    assert "tinyworld" in PRESETS and PRESETS["tinyworld"].local
    for p in PRESETS.values():
        assert p.why_valid and p.dtype in ("float32", "bfloat16", "float16") and p.device in ("auto", "cpu", "cuda",
                                                                                               "multi")
        if p.tokenizer_len and p.target_vocab and p.draft_vocab:  # embedding rows cover the tokenizer
            assert min(p.target_vocab, p.draft_vocab) >= p.tokenizer_len, p.name
        if p.tokenizer_len and p.image_token_id is not None:
            assert p.image_token_id < p.tokenizer_len, p.name
        if not p.local:
            assert p.target.count("/") == 1 and p.draft.count("/") == 1 and p.target != p.draft
        if p.target_vocab is None or p.tokenizer_len is None:
            assert "unverified" in p.why_valid or p.local, p.name  # say so rather than guess


def test_the_text_qwen3_vl_qwen3_5_and_gemma_presets_cite_their_sources():
    """The paper's pairs (Qwen3-VL MoE, Llama text), a dense Qwen3-VL, Qwen3.5 (dense and MoE), Gemma 3, Qwen3 text:
    each why_valid names a source listed at the top of presets.py, and a text pair takes neither images nor video."""
    import re

    import sage_engine.models.presets as presets

    sources = set(re.findall(r"^  (\[[\w.-]+\])", presets.__doc__, re.M))
    new = {"qwen3-vl-235b-a22b/2b": "Qwen/Qwen3-VL-235B-A22B-Instruct", "qwen3-vl-32b/4b": "Qwen/Qwen3-VL-32B-Instruct",
           "gemma-3-27b/4b": "google/gemma-3-27b-it", "llama-3.1-8b/3.2-1b": "meta-llama/Llama-3.1-8B-Instruct",
           "qwen3-8b/0.6b": "Qwen/Qwen3-8B", "qwen3.5-9b/0.8b": "Qwen/Qwen3.5-9B", "qwen3.5-27b/2b": "Qwen/Qwen3.5-27B",
           "qwen3.5-35b-a3b/0.8b": "Qwen/Qwen3.5-35B-A3B", "lfm2-vl-1.6b/450m": "LiquidAI/LFM2-VL-1.6B",
           "lfm2-2.6b/350m": "LiquidAI/LFM2-2.6B", "gemma-3n-e4b/e2b": "google/gemma-3n-E4B-it"}
    for name, target in new.items():
        p = PRESETS[name]
        cited = set(re.findall(r"\[[\w.-]+\]", p.why_valid))
        assert p.target == target and cited and cited <= sources, (name, cited - sources)
    for name in ("llama-3.1-8b/3.2-1b", "qwen3-8b/0.6b", "lfm2-2.6b/350m"):
        assert PRESETS[name].image_token_id is None and not PRESETS[name].video
    assert PRESETS["llama-3.1-8b/3.2-1b"].target_vocab == PRESETS["llama-3.1-8b/3.2-1b"].draft_vocab == 128256
    assert PRESETS["qwen3-vl-235b-a22b/2b"].device == "multi"
    from sage_engine.models.families import FAMILIES, QWEN3_5

    for name in ("qwen3.5-9b/0.8b", "qwen3.5-27b/2b", "qwen3.5-35b-a3b/0.8b"):  # the recurrent family reads both sides
        p = PRESETS[name]
        assert all(FAMILIES[t] is QWEN3_5 for t in p.family.split("/")) and p.video and p.image_token_id == 248056


def test_resolve_names_and_local_pairs(saved_qwen_pair):
    assert resolve("llava-onevision-72b/7b").draft == "llava-hf/llava-onevision-qwen2-7b-ov-hf"
    target, draft = saved_qwen_pair
    assert resolve(f"{target},{draft}").target == target
    with pytest.raises(ModelError, match="unknown preset"):
        resolve("gpt-5/nano")


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"},  # declared offline: no probe at all
                                 {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"},  # refused
                                 {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://10.255.255.1:81"},  # black hole / proxy
                                 {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:{port}"}])  # silent server
def test_hub_preset_without_hub_fails_fast_with_one_line(monkeypatch, env):
    silent = socket.socket()  # accepts connections (backlog) and never answers: a hanging hub
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    for k, v in env.items():
        monkeypatch.setenv(k, v.format(port=silent.getsockname()[1]))
    t0 = time.perf_counter()
    assert hub_problem("Qwen/Qwen2.5-VL-72B-Instruct") is not None
    with pytest.raises(ModelError) as err:
        load_pair("qwen2.5-vl-72b/7b", device="cpu")
    assert time.perf_counter() - t0 < 6.0  # two probes of at most ~2.2 s each, never a hang
    msg = str(err.value)
    assert "\n" not in msg and "Qwen/Qwen2.5-VL-72B-Instruct" in msg and "unreachable" in msg
    silent.close()


def test_auto_device_on_a_cpu_machine_loads_a_local_pair_on_the_cpu(saved_qwen_pair):
    if torch.cuda.is_available():
        pytest.skip("this checks the CPU fallback")
    target, draft = saved_qwen_pair
    pair = load_pair(target, draft, device="auto")
    assert pair.target.device.type == "cpu" and pair.draft.device.type == "cpu"
