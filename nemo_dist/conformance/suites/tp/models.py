"""The tp suite's own model: a tiny Llama-family causal LM, float64 throughout, with Hugging Face's module names.

Names as ``LlamaForCausalLM`` has them (``model.embed_tokens``,
``model.layers.N.self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``,
``input_layernorm``, ``post_attention_layernorm``, ``model.norm``,
``lm_head``), so every Llama-style plan applies to it; grouped-query
attention (8 heads, 4 key-value heads) that reads its head counts from its
own ``num_heads``/``num_key_value_heads`` in forward, so a plan that leaves
them global fails loudly, and norms that compute in the input's dtype (no
float32 upcast: a float64 run is exact to reduction order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TinyConfig", "TinyLlamaForCausalLM"]


@dataclass
class TinyConfig:
    """Sizes of :class:`TinyLlamaForCausalLM`: every sharded size divides 1, 2 and 4 ranks, none divides 3."""

    vocab_size: int = 32
    hidden_size: int = 32
    intermediate_size: int = 64
    num_hidden_layers: int = 1
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 4
    tie_word_embeddings: bool = False
    rms_norm_eps: float = 1e-6
    #: A bias on attention's output projection (the gallery's bias-before-all-reduce plan needs one).
    o_proj_bias: bool = False
    #: Dropout on attention's output, in training (0: none; the gallery's dropout plans need it).
    attention_dropout: float = 0.0


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class _Attention(nn.Module):
    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        width, kv_width = self.num_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv_width, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv_width, bias=False)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=config.o_proj_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length = x.shape[0], x.shape[1]
        q = self.q_proj(x).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        groups = self.num_heads // self.num_key_value_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim))


class _MLP(nn.Module):
    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.input_layernorm = _RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = _Attention(config)
        self.post_attention_layernorm = _RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = _MLP(config)
        self.dropout = config.attention_dropout

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + F.dropout(self.self_attn(self.input_layernorm(h)), self.dropout, self.training)
        return h + self.mlp(self.post_attention_layernorm(h))


class _Body(nn.Module):
    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config.num_hidden_layers))
        self.norm = _RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


class TinyLlamaForCausalLM(nn.Module):
    """``forward(input_ids [batch, seq]) -> logits [batch, seq, vocab]``; ``tie_word_embeddings`` ties the head."""

    base_model_prefix = "model"

    def __init__(self, config: TinyConfig | None = None) -> None:
        super().__init__()
        self.config = config or TinyConfig()
        self.model = _Body(self.config)
        self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_size, bias=False)
        with torch.no_grad():  # norms away from 1, so a norm whose gradient is lost shows
            for module in self.modules():
                if isinstance(module, _RMSNorm):
                    module.weight.uniform_(0.5, 1.5)
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def get_input_embeddings(self) -> nn.Module:
        """The token embedding."""
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        """The LM head."""
        return self.lm_head

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(input_ids))
