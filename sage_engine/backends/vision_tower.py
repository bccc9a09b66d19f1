"""A Qwen2.5-VL-style vision tower in fewer, larger calls, for prompts that go through the fused layers.

A small tower's forward is mostly per-call overhead, like a small decoder's (fused_torch.py): on the embedded target
its products are a small part of a picture's pass through the tower's own forward. It
computes per call what only depends on the grid (rotary positions, the window order, the segment boundaries), runs
its patch embedding as a Conv3d whose kernel is its stride, splits each attention into one SDPA call per window
and calls a dozen modules per block. `FusedVision` computes the same tower from its weights:
  - the patch embedding as one product (a Conv3d whose kernel equals its stride is a matrix product over each
    patch's flattened pixels);
  - per grid, once (`_Plan`, kept for the last few grids): the window order, the rotary cos and signed sin in that
    order, a block-diagonal mask per block (none where the block sees a single segment) and the order back;
  - per block: q, k and v as one product with the RMSNorm's weight folded into it, q and k rotated together, one
    SDPA over every window under the mask, the gate and up products as one (the second norm folded in);
  - the merger's RMSNorm folded into its first product.
On the embedded pair the towers take a third of their own forward's time or less (docs/log/SPEED.md).

Exactness: the same sums in another order, so the features differ from the tower's own in the last bits (there:
~7e-6 on features of magnitude ~17, ~5e-5 on ~140). The runner uses it only inside the fused prompt path, which
is already close to forward() rather than bit-identical, and keeps it only once a real prompt through it came out
close to forward() with the same argmax (`prompt_path.FusedPrompt.check`); the features reach the model's forward
through its `mm_encoder_outputs` argument, so the merge into the text and the positions are the model's own.

Used where the tower is exactly this block structure in float32 on the CPU (patch embedding without bias, pre-norm
blocks of RMSNorms, a qkv / proj attention and a SiLU-gated MLP, a merger of RMSNorm, Linear, GELU, Linear) and
the model's forward takes `mm_encoder_outputs`, for prompts of at most MAX_PATCHES patches; anything else keeps the
tower's own forward.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.vision_utils import get_vision_attention_seqlens, get_vision_position_ids, get_vision_window_index

from .fused_products import MAX_FUSED_PARAMS, Norm, _norm, _rms, _rotate

PLANS_KEPT = 8  # grids whose plans are kept (a run's prompts mostly share a handful of picture sizes)
# more patches than this: the tower's own forward (a plan's masks are [S, S]; a tower this small reads far fewer)
MAX_PATCHES = 4096
_MEDIA = (("image", "pixel_values", "image_grid_thw"), ("video", "pixel_values_videos", "video_grid_thw"))
_BLOCK_PARTS = {"norm1", "norm2", "attn", "mlp"}


@dataclass(frozen=True)
class _Block:
    qkv: torch.Tensor  # [C, 3C]: (qkv weight with norm1's weight folded in)^T
    qkv_bias: torch.Tensor
    proj: torch.Tensor  # [C, C]
    proj_bias: torch.Tensor
    gate_up: torch.Tensor  # [C, 2I]: gate and up stacked, norm2's weight folded in
    gate_up_bias: torch.Tensor
    down: torch.Tensor  # [I, C]
    down_bias: torch.Tensor
    norm1: Norm  # its weight folded into qkv
    norm2: Norm  # its weight folded into gate_up
    heads: int
    scaling: float


@dataclass(frozen=True)
class _Plan:
    """What a grid alone decides: the order the tower works in and what each block attends to."""

    rows: torch.Tensor  # [S] patch index in window order
    cos: torch.Tensor  # [S, 1, hd] in window order
    signed_sin: torch.Tensor  # [S, 1, hd]: sin with its first half negated (fused._rotate)
    masks: tuple[torch.Tensor | None, ...]  # per block: [S, S] block-diagonal (True: attend), None: one segment
    back: torch.Tensor  # [S / unit] merged rows back to the grid's order


def _linear(module, bias: bool = True) -> bool:
    return type(module) is torch.nn.Linear and (module.bias is not None) == bias


def _block(block: torch.nn.Module, act: str) -> _Block | None:
    """The block as a _Block, or None unless it is exactly norm1 -> attn(qkv, proj) -> norm2 -> SiLU-gated MLP."""
    parts = dict(block.named_children())
    if set(parts) != _BLOCK_PARTS or act not in ("silu", "swish"):
        return None
    attn, mlp = parts["attn"], parts["mlp"]
    if {n for n, _ in attn.named_children()} != {"qkv", "proj"} or not (_linear(attn.qkv) and _linear(attn.proj)):
        return None
    if not all(_linear(getattr(mlp, n, None)) for n in ("gate_proj", "up_proj", "down_proj")):
        return None
    rms1, rms2 = _rms(parts["norm1"]), _rms(parts["norm2"])
    heads, scaling = getattr(attn, "num_heads", None), getattr(attn, "scaling", None)
    if rms1 is None or rms2 is None or heads is None or scaling is None:
        return None
    (norm1, n1), (norm2, n2) = _norm(rms1, fold=True), _norm(rms2, fold=True)  # fused.Norm: weights folded
    gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach() * n2
    return _Block(
        qkv=(attn.qkv.weight.detach() * n1).t().contiguous(), qkv_bias=attn.qkv.bias.detach(),
        proj=attn.proj.weight.detach().t().contiguous(), proj_bias=attn.proj.bias.detach(),
        gate_up=gate_up.t().contiguous(), gate_up_bias=torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias]).detach(),
        down=mlp.down_proj.weight.detach().t().contiguous(), down_bias=mlp.down_proj.bias.detach(),
        norm1=norm1, norm2=norm2, heads=int(heads), scaling=float(scaling),
    )


class FusedVision:
    """The tower's features for `pixels` and `grid` [n, 3] (`__call__`), or a prompt's batch with its pixels replaced by
    those features (`encoded`). Build it with `fused_vision(model)`."""

    def __init__(self, tower: torch.nn.Module, blocks: list[_Block], merger: torch.nn.Module,
                 ln_q: tuple[torch.Tensor, float]):
        self.tower, self.blocks = tower, blocks
        weight = tower.patch_embed.proj.weight.detach()
        self.patch = weight.reshape(weight.shape[0], -1).t().contiguous()  # [in * t * p * p, C]
        self.unit = tower.spatial_merge_unit
        first, second = merger.mlp[0], merger.mlp[2]
        self.ln_q, factor = _norm(ln_q, fold=True)
        folded = first.weight.detach() * factor.repeat(self.unit)  # ln_q's weight, per patch of a merged cell
        self.merge_in, self.merge_in_bias = folded.t().contiguous(), first.bias.detach()
        self.merge_out, self.merge_out_bias = second.weight.detach().t().contiguous(), second.bias.detach()
        self.gelu = merger.mlp[1].approximate
        self._plans: OrderedDict[tuple, _Plan] = OrderedDict()

    def plan(self, grid: torch.Tensor) -> _Plan:
        """The grid's plan, from transformers' own helpers for the positions, the windows and the segments."""
        key = tuple(map(tuple, grid.tolist()))
        if sum(t * h * w for t, h, w in key) > MAX_PATCHES:
            raise ValueError(f"more than {MAX_PATCHES} patches: left to the tower's own forward")
        found = self._plans.get(key)
        if found is not None:
            self._plans.move_to_end(key)
            return found
        tower = self.tower
        positions = get_vision_position_ids(grid, tower.spatial_merge_size)
        segments, _ = get_vision_attention_seqlens(grid, tower.config)
        order, windows = get_vision_window_index(grid, tower.spatial_merge_size, tower.window_size, tower.patch_size)
        rows = (order[:, None] * self.unit + torch.arange(self.unit)).reshape(-1)  # a merged cell = `unit` patches
        cos, sin = tower.rotary_pos_emb(self.patch, positions)  # [S, hd] each (its first argument gives the device)
        half = cos.shape[-1] // 2
        sign = torch.cat([-torch.ones(half), torch.ones(half)]).to(sin)
        size = rows.shape[0]

        def mask(bounds: torch.Tensor) -> torch.Tensor | None:
            cuts = bounds.tolist()
            if len(cuts) <= 2:
                return None
            allowed = torch.zeros(size, size, dtype=torch.bool)
            for a, b in zip(cuts[:-1], cuts[1:]):
                allowed[a:b, a:b] = True
            return allowed

        full = set(tower.fullatt_block_indexes)
        masks = tuple(mask(segments if i in full else windows) for i in range(len(self.blocks)))
        plan = _Plan(rows, cos[rows][:, None], (sin * sign)[rows][:, None], masks, torch.argsort(order))
        self._plans[key] = plan
        if len(self._plans) > PLANS_KEPT:
            self._plans.popitem(last=False)
        return plan

    def __call__(self, pixels: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        """The merged visual features, as the tower's own forward gives them (its pooler output).  # [S / unit, D]"""
        plan = self.plan(grid)
        x = (pixels.reshape(pixels.shape[0], -1).to(self.patch.dtype) @ self.patch)[plan.rows]  # [S, C]
        size, width = x.shape
        for b, mask in zip(self.blocks, plan.masks):
            hd = width // b.heads
            qkv = torch.addmm(b.qkv_bias, b.norm1(x), b.qkv).view(size, 3, b.heads, hd)
            qk = _rotate(qkv[:, :2], plan.cos[:, None], plan.signed_sin[:, None])  # q and k: [S, 2, H, hd]
            q, k, v = (t.transpose(0, 1) for t in (qk[:, 0], qk[:, 1], qkv[:, 2]))  # [H, S, hd] each
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=b.scaling)
            x = x + torch.addmm(b.proj_bias, a.transpose(0, 1).reshape(size, width), b.proj)
            gate, up = torch.addmm(b.gate_up_bias, b.norm2(x), b.gate_up).chunk(2, dim=-1)
            x = x + torch.addmm(b.down_bias, F.silu(gate) * up, b.down)
        x = self.ln_q(x).view(-1, width * self.unit)
        x = torch.addmm(self.merge_in_bias, x, self.merge_in)
        return torch.addmm(self.merge_out_bias, F.gelu(x, approximate=self.gelu), self.merge_out)[plan.back]

    def encoded(self, batch: dict) -> dict:
        """`batch` with its pixels replaced by their features (the model's `mm_encoder_outputs` argument)."""
        out, encoded = dict(batch), {}
        for kind, pixels, grid in _MEDIA:
            if out.get(pixels) is not None:
                features = self(out.pop(pixels), out[grid])
                encoded[kind] = BaseModelOutputWithPooling(pooler_output=(features,))
        if encoded:
            out["mm_encoder_outputs"] = encoded
        return out


def fused_vision(model: torch.nn.Module) -> FusedVision | None:
    """The model's vision tower as a FusedVision, or None where it is not exactly the structure FusedVision computes
    (see the module's docstring), not float32 on the CPU, larger than MAX_FUSED_PARAMS, or its forward cannot take
    the features (`mm_encoder_outputs`)."""
    if "mm_encoder_outputs" not in inspect.signature(type(model).forward).parameters:
        return None
    tower = getattr(getattr(model, "model", model), "visual", None)
    if tower is None or not all(hasattr(tower, n) for n in ("patch_embed", "rotary_pos_emb", "blocks", "merger")):
        return None
    if not all(hasattr(tower, n) for n in ("spatial_merge_unit", "spatial_merge_size", "window_size", "patch_size",
                                            "fullatt_block_indexes")):
        return None
    conv = getattr(tower.patch_embed, "proj", None)
    if type(conv) is not torch.nn.Conv3d or conv.bias is not None or conv.kernel_size != conv.stride or any(
            conv.padding) or conv.groups != 1 or conv.weight.dtype != torch.float32 or conv.weight.device.type != "cpu":
        return None
    if sum(p.numel() for p in tower.parameters()) > MAX_FUSED_PARAMS:
        return None
    merger = tower.merger
    mlp = getattr(merger, "mlp", None)
    ln_q = getattr(merger, "ln_q", None)
    ln_q = None if ln_q is None else _rms(ln_q)
    if ln_q is None or not isinstance(mlp, torch.nn.Sequential) or len(mlp) != 3 or not (
            _linear(mlp[0]) and type(mlp[1]) is torch.nn.GELU and _linear(mlp[2])):
        return None
    if {n for n, _ in merger.named_children()} != {"ln_q", "mlp"}:
        return None
    act = getattr(tower.config, "hidden_act", None)
    blocks = [_block(b, act) for b in tower.blocks]
    if not blocks or any(b is None for b in blocks):
        return None
    return FusedVision(tower, blocks, merger, ln_q)
