"""Backends: the ways a model's cached forward (a decode step, a draft level, a verify pass) can be computed.

Every backend is one small object with the same protocol:

    name: str                      what reports call it
    __call__(ids, positions, mask, cache, top=None) -> logits [1, q, V]
                                   ids, positions [1, q] (positions already shifted by the family's rule), mask
                                   [1, 1, q, kv] additive (0 / finfo.min) or None (one token that sees every column);
                                   appends the tokens' keys and values to `cache`
    takes_lists: bool              True: also `run(tokens, positions, blocked, cache, top_k, vocab)`, the runner's
                                   lists and boolean pattern as they are (no tensors to build)
    buffers: KVBuffers | None      the preallocated keys and values the cache's layers view, where it writes them so
    prompt_layers                  the torch layers a whole prompt can go through (prompt_path.py), or None
    compiled: bool                 a drafted step can run in one compiled call on it (draft_compiled.py)

| `--tree-forward` | module | where it applies | otherwise |
|---|---|---|---|
| forward | hf_forward.py | every model, device, dtype, size, accelerate device maps (the GPU path) | - |
| layers | hf_layers.py | a known family on one device, full-attention layers; bit-identical to forward() | forward |
| fused (+packed) | fused_torch.py | pre-norm attention + SwiGLU layers with a static rotary, up to 16M weights; float32 (rows padded so a target's row never depends on the row count) or bf16, any single device | layers |
| numpy | numpy_host.py | a draft's fused layers in float32 on the CPU, equal key heads and head size per layer | fused |
| numba | numba_layers.py | the same where Numba is installed and every layer has the same query heads | numpy |
| (prompt) | prompt_path.py, vision_tower.py | a whole prompt through a kept fused backend's torch layers; a Qwen2.5-VL-style vision tower in float32 on the CPU in fewer calls | forward |

`choose.offer` lists what applies to a model (`--tree-forward auto`: all of it); `choose.check_cached` and
`choose.prompt_close` keep only what computes forward()'s numbers (bit for bit for "layers", within 1e-3 with the same
argmax on every row for the fused ones) and the fastest of those; each one turned down leaves a note that
`SpecEngine.backends()`, the bench report, `generate --json` and the app's run record carry.
"""

from .choose import BACKENDS

__all__ = ["BACKENDS"]
