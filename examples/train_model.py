"""The model of examples/train.py: a Llama-style decoder over one rank's packed tokens.

Tokens arrive flattened, [T] per rank, never as [batch, seq]: a step is one packed batch of
documents and attention sees document boundaries only through its mask (the dcp plan, or a
FlexAttention block mask). RoPE therefore takes each token's position inside its document, not
its index in the batch. Layers: RMSNorm, fused QKV projection with grouped-query heads, RoPE,
attention (supplied by the caller per step), output projection; RMSNorm, SwiGLU. Weights and
the residual stream are fp32; under bf16 autocast the matmuls run in bf16 and attention gets
bf16 q, k, v.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Dict

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# attend(q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D], layer) -> o [T, Hq, D]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


@dataclass(frozen=True)
class ModelConfig:
    dim: int
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int = 256           # bytes
    rope_theta: float = 500000.0  # long documents: a base large enough for 64K positions
    norm_eps: float = 1e-5
    lr: float = 3e-4           # the preset's default peak learning rate

    def num_params(self) -> int:
        per_layer = (self.dim * (self.q_heads + 2 * self.kv_heads) * self.head_dim
                     + self.q_heads * self.head_dim * self.dim + 3 * self.dim * self.ffn + 2 * self.dim)
        return self.layers * per_layer + 2 * self.vocab * self.dim + self.dim


PRESETS: Dict[str, ModelConfig] = {
    # The one-H200 training anchor of shared/device.md: 542M parameters.
    "anchor": ModelConfig(dim=2048, layers=12, q_heads=16, kv_heads=4, head_dim=128, ffn=5632, lr=3e-4),
    # Small enough that 300 steps of 64K tokens take well under a minute on one H200, with the
    # anchor's head size and GQA ratio (the attention kernels see the same shapes per head).
    "small": ModelConfig(dim=512, layers=4, q_heads=4, kv_heads=1, head_dim=128, ffn=1408, lr=1e-3),
    # CPU tests: a few thousand tokens per step in seconds.
    "tiny": ModelConfig(dim=64, layers=2, q_heads=4, kv_heads=2, head_dim=16, ffn=128, lr=1e-3),
}


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float):
    """cos and sin [T, 1, head_dim] (fp32) of each token's position inside its document."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)[:, None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates the two halves of each head (the rotate-half convention) in fp32; returns x's dtype."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight, self.eps)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.qkv = nn.Linear(cfg.dim, (cfg.q_heads + 2 * cfg.kv_heads) * cfg.head_dim, bias=False)
        self.out = nn.Linear(cfg.q_heads * cfg.head_dim, cfg.dim, bias=False)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.gate_up = nn.Linear(cfg.dim, 2 * cfg.ffn, bias=False)
        self.down = nn.Linear(cfg.ffn, cfg.dim, bias=False)

    def pre_attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, compute_dtype: torch.dtype):
        """q [T, Hq, D], k, v [T, Hkv, D] in compute_dtype: norm, fused projection, RoPE."""
        cfg = self.cfg
        tokens = x.shape[0]
        qkv = self.qkv(self.attn_norm(x)).view(tokens, cfg.q_heads + 2 * cfg.kv_heads, cfg.head_dim)
        q = qkv[:, :cfg.q_heads]
        k = qkv[:, cfg.q_heads:cfg.q_heads + cfg.kv_heads]
        v = qkv[:, cfg.q_heads + cfg.kv_heads:]  # a strided view of the projection: no copy
        return apply_rope(q, cos, sin).to(compute_dtype), apply_rope(k, cos, sin).to(compute_dtype), v.to(compute_dtype)

    def post_attention(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The residual stream after the output projection and the SwiGLU MLP."""
        x = x + self.out(o.reshape(x.shape[0], -1))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend,
                compute_dtype: torch.dtype) -> torch.Tensor:
        q, k, v = self.pre_attention(x, cos, sin, compute_dtype)
        return self.post_attention(x, attend(q, k, v, self.layer))


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Normal(0, 0.02) weights, the residual-branch outputs scaled by 1/sqrt(2 x layers) so
        that the residual stream's variance does not grow with depth; unit norm gains. Drawn
        from a generator on the weights' own device, seeded here: equal seeds give equal
        models on every rank and in every mode."""
        device = self.embed.weight.device
        gen = torch.Generator(device=device).manual_seed(seed)
        scale = 0.02 / math.sqrt(2 * self.cfg.layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, scale if name.endswith(("out.weight", "down.weight")) else 0.02, generator=gen)

    def compile_parts(self) -> None:
        """Compiles everything around attention with torch.compile: each block's two halves (the
        norms, RoPE, the SwiGLU product, the residual adds and the bf16 casts fuse into a few
        kernels around the GEMMs) and the final norm with the head. Attention stays outside the
        graphs, so every attention mode runs the same compiled model; the blocks share one graph
        per half (same code, parameters as inputs)."""
        for block in self.blocks:
            block.pre_attention = torch.compile(block.pre_attention)
            block.post_attention = torch.compile(block.post_attention)
        self.final = torch.compile(self.final)

    def final(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x))

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, attend: Attend, compute_dtype: torch.dtype,
                activation_checkpointing: bool = False) -> torch.Tensor:
        """Logits [T, vocab] of this rank's tokens `ids` [T] at document positions `positions`."""
        cos, sin = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
        x = self.embed(ids)
        for block in self.blocks:
            if activation_checkpointing:
                x = checkpoint(block, x, cos, sin, attend, compute_dtype, use_reentrant=False)
            else:
                x = block(x, cos, sin, attend, compute_dtype)
        return self.final(x)


def describe(cfg: ModelConfig) -> Dict[str, object]:
    return dict(asdict(cfg), params=cfg.num_params())
