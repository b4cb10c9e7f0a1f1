"""Pure-PyTorch EAGLE-3 draft, numerically the same forward as SGLang 0.5.23's `LlamaForCausalLMEagle3`.

SGLang's draft (``sglang/srt/models/llama_eagle3.py``), one decoder layer:

    h   = fc(aux)                       # only when the input width differs from the embedding width
    res = h
    x   = cat([input_layernorm(embed(ids)), hidden_norm(h)])      # 2H wide into q/k/v
    s   = o_proj(attn(x)) + res
    s2  = mlp(post_attention_layernorm(s)) + s
    logits = lm_head(norm(s2))          # over the draft vocabulary; top-1 maps to a target id via d2t
    next hidden = s2                    # pre-norm, fed back as the input of the next draft step

The embedding is the target's (SGLang calls ``set_embed`` with the target's embedding), so it is a
frozen buffer here and is not part of the checkpoint. ``state_dict_sglang`` writes the checkpoint
layout SGLang loads (``midlayer.*``, separate q/k/v and gate/up projections).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class DraftShape:
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    num_aux: int = 3
    draft_vocab: int = 256
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class RMSNorm(nn.Module):
    """SGLang's RMSNorm: computed in float32, weight applied after the cast back."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x.to(dtype)) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding (SGLang's Llama default, HF's ``rotate_half``). x: [..., T, D]."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = positions.float()[..., None] * inv_freq  # [..., T, D/2]
    cos, sin = freqs.cos(), freqs.sin()
    while cos.dim() < x.dim():
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Eagle3Draft(nn.Module):
    """The draft's parameters plus two forwards: one chain step (inference) and the TTT unroll (training)."""

    def __init__(self, shape: DraftShape, target_embed: torch.Tensor) -> None:
        super().__init__()
        s = shape
        self.shape = s
        self.register_buffer("embed", target_embed.detach().clone(), persistent=False)
        self.fc = nn.Linear(s.num_aux * s.hidden, s.hidden, bias=False)
        self.input_layernorm = RMSNorm(s.hidden, s.rms_eps)
        self.hidden_norm = RMSNorm(s.hidden, s.rms_eps)
        self.q_proj = nn.Linear(2 * s.hidden, s.heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * s.hidden, s.kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * s.hidden, s.kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.rms_eps)
        self.gate_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.up_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, s.hidden, bias=False)
        self.norm = RMSNorm(s.hidden, s.rms_eps)
        self.lm_head = nn.Linear(s.hidden, s.draft_vocab, bias=False)

    # -- pieces shared by both forwards -------------------------------------------------------
    def _qkv(self, ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """Returns q [B,heads,T,D], k/v [B,kv_heads,T,D] and the residual (the un-normed hidden)."""
        s = self.shape
        x = torch.cat([self.input_layernorm(F.embedding(ids, self.embed)), self.hidden_norm(hidden)], -1)
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, s.heads, s.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        return rope(q, positions, s.rope_theta), rope(k, positions, s.rope_theta), v

    def _after_attention(self, attn: torch.Tensor, residual: torch.Tensor):
        """attn [B,heads,T,D] -> (logits over the draft vocab, pre-norm hidden for the next step)."""
        b, _, t, _ = attn.shape
        s1 = self.o_proj(attn.transpose(1, 2).reshape(b, t, -1)) + residual
        h = self.post_attention_layernorm(s1)
        s2 = self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)) + s1
        return self.lm_head(self.norm(s2)), s2

    def _expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(self.shape.heads // self.shape.kv_heads, dim=1)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """SGLang applies fc only when the incoming width differs from the embedding width."""
        return self.fc(hidden) if hidden.shape[-1] != self.embed.shape[-1] else hidden

    # -- inference: a causal pass with an explicit KV list, as SGLang's extend/decode do ----------
    def forward_causal(self, ids, hidden, positions, past: tuple[torch.Tensor, torch.Tensor] | None = None):
        """ids [B,T], hidden [B,T,K*H or H], positions [B,T]; attends to `past` keys/values then causally.

        Returns (logits [B,T,V_draft], next hidden [B,T,H], (keys, values) including this call's)."""
        h = self.project(hidden)
        q, k, v = self._qkv(ids, h, positions)
        p = 0
        if past is not None:
            p = past[0].shape[2]
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        t = q.shape[2]
        mask = torch.ones(t, p + t, dtype=torch.bool).tril(diagonal=p)
        attn = F.scaled_dot_product_attention(q, self._expand_kv(k), self._expand_kv(v), attn_mask=mask)
        logits, nxt = self._after_attention(attn, h)
        return logits, nxt, (k, v)

    # -- training: training-time-test unroll ----------------------------------------------------
    def forward_ttt(self, ids: torch.Tensor, aux: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Unrolled draft over every prefix of a sequence at once.

        Row t of step 0 sees (token t+1, aux t) at position t, like SGLang's draft extend. Step k >= 1
        sees (token t+1+k, the hidden step k-1 produced for row t) at position t+k and attends to the
        step-0 keys of rows 0..t plus its own row's keys of steps 1..k, exactly what a draft decode
        step attends to in SGLang's KV cache. ids [B,T] is the plain token sequence (step k reads
        ids[:, t+1+k], zero past the end); aux [B,T,K*H]. Returns logits per step, each [B,T,V_draft].
        """
        b, t = ids.shape
        scale = self.shape.head_dim**-0.5
        pos = torch.arange(t).expand(b, t)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        hidden = self.fc(aux)
        keys, values, out = [], [], []
        for k in range(steps):
            tok = F.pad(ids[:, 1 + k :], (0, 1 + k))
            q, kk, vv = self._qkv(tok, hidden, pos + k)
            keys.append(self._expand_kv(kk))
            values.append(self._expand_kv(vv))
            s0 = (q @ keys[0].transpose(-1, -2)) * scale
            s0 = s0.masked_fill(~causal, float("-inf"))
            diag = [(q * kj).sum(-1, keepdim=True) * scale for kj in keys[1:]]
            p = torch.softmax(torch.cat([s0, *diag], -1), -1)
            attn = p[..., :t] @ values[0]
            for j, vj in enumerate(values[1:]):
                attn = attn + p[..., t + j : t + j + 1] * vj
            logits, hidden = self._after_attention(attn, hidden)
            out.append(logits)
        return out

    # -- checkpoint layout ---------------------------------------------------------------------
    def state_dict_sglang(self) -> dict[str, torch.Tensor]:
        """Tensors under the names SGLang's `LlamaForCausalLMEagle3.load_weights` maps (no d2t/t2d)."""
        m = "midlayer."
        names = {
            "fc.weight": self.fc.weight,
            m + "input_layernorm.weight": self.input_layernorm.weight,
            m + "hidden_norm.weight": self.hidden_norm.weight,
            m + "self_attn.q_proj.weight": self.q_proj.weight,
            m + "self_attn.k_proj.weight": self.k_proj.weight,
            m + "self_attn.v_proj.weight": self.v_proj.weight,
            m + "self_attn.o_proj.weight": self.o_proj.weight,
            m + "post_attention_layernorm.weight": self.post_attention_layernorm.weight,
            m + "mlp.gate_proj.weight": self.gate_proj.weight,
            m + "mlp.up_proj.weight": self.up_proj.weight,
            m + "mlp.down_proj.weight": self.down_proj.weight,
            "norm.weight": self.norm.weight,
            "lm_head.weight": self.lm_head.weight,
        }
        return {k: v.detach().contiguous().clone() for k, v in names.items()}

    def load_sglang(self, tensors: dict[str, torch.Tensor]) -> None:
        """Inverse of `state_dict_sglang`; raises KeyError naming a missing tensor."""
        own = dict(zip(self.state_dict_sglang().keys(), self._params_in_sglang_order()))
        with torch.no_grad():
            for name, param in own.items():
                if name not in tensors:
                    raise KeyError(f"draft checkpoint lacks {name!r}")
                param.copy_(tensors[name])

    def _params_in_sglang_order(self) -> list[nn.Parameter]:
        return [
            self.fc.weight, self.input_layernorm.weight, self.hidden_norm.weight, self.q_proj.weight,
            self.k_proj.weight, self.v_proj.weight, self.o_proj.weight, self.post_attention_layernorm.weight,
            self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight, self.norm.weight, self.lm_head.weight,
        ]
