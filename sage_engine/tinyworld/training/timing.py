"""Per-forward cost of a model on this machine: 1 new token after a cached prefix, and
n-token forwards (a verification tree's width), medians over interleaved repeats."""
from __future__ import annotations

import statistics
import time

import torch


@torch.no_grad()
def forward_ms(model, n_tokens: int, prefix: int = 130, repeats: int = 15, dtype=torch.float32) -> float:
    vocab = model.config.text_config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, vocab - 10, (1, prefix), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        cache = model(input_ids=ids, use_cache=True).past_key_values
        x = torch.randint(10, vocab - 10, (1, n_tokens), generator=g)
        # (3, B, n): the M-RoPE positions of text tokens
        pos = torch.arange(prefix, prefix + n_tokens).view(1, 1, -1).expand(3, 1, -1)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            model(input_ids=x, past_key_values=cache, position_ids=pos, use_cache=True)
            times.append(time.perf_counter() - t)
            cache.crop(-n_tokens)
    return 1000 * statistics.median(times)


def measure(target, draft, rounds: int = 3) -> dict:
    """Interleave target and draft measurements (machine noise); report per-config medians."""
    cells = {("target", 1): [], ("target", 16): [], ("target", 32): [], ("draft", 1): [], ("draft", 10): []}
    for _ in range(rounds):
        for (role, n), acc in cells.items():
            acc.append(forward_ms(target if role == "target" else draft, n))
    return {f"{role}_{n}": round(statistics.median(v), 2) for (role, n), v in cells.items()}
