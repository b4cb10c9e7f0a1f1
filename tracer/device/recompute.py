"""Small parts of the draft's forward, recomputed off-graph on the sampled rows with its own modules.

SGLang runs the draft's forwards as CUDA-graph replays (draft decode, draft extend) or eagerly; either
way it hands back the draft's output hidden states (``EagleDraftInput.hidden_states``: one row per
request, the state the next draft step starts from) and the verify's aux hidden states. From those the
hooks recompute what the replays keep inside the graph, so that a trace does not depend on whether
SGLang took its graph branches:

* :func:`fc`: the draft's ``fc`` (with its input norms) on the aux rows it receives;
* :func:`logits`: the draft's logits at position 1 of the next verify step, from its output hidden
  state through its final norm and ``lm_head`` (as its logits processor computes them).

Both run under ``no_grad`` on the rows they are given (a handful per sampled request) and never read a
tensor back to the host.
"""

from __future__ import annotations

from typing import Optional

import torch



def fc(model, h: torch.Tensor) -> Optional[torch.Tensor]:
    """The draft's ``fc`` (with its input norms) applied to rows ``h``; None when fc would not run."""
    inner = getattr(model, "model", None)
    fc_layer = getattr(inner, "fc", None)
    embed = getattr(inner, "embed_tokens", None)
    if fc_layer is None or embed is None or h.shape[0] == 0 or h.shape[-1] == embed.weight.shape[-1]:
        return None
    if fc_in_features(fc_layer) != h.shape[-1]:
        return None  # fc would raise in the draft itself; draft.input records the width
    with torch.no_grad():
        x = h
        if getattr(inner, "input_norm", None) is not None:
            x = inner.input_norm(x)
        if getattr(inner, "fc_norm", None) is not None:
            chunks = x.chunk(inner.num_aux_hidden_states, dim=-1)
            x = torch.cat([norm(c) for norm, c in zip(inner.fc_norm, chunks)], dim=-1)
        out = fc_layer(x)
        return out[0] if isinstance(out, tuple) else out


def logits(model, h: torch.Tensor) -> Optional[torch.Tensor]:
    """float32 ``[n, draft vocab]`` logits of the draft at its output hidden states ``h`` (pre-norm, as
    an EAGLE-3 draft hands them to its next step; already normed when its config sets
    ``norm_output``). None when the draft has no final norm / ``lm_head`` / logits processor of that
    shape, or when its ``lm_head`` is split over TP ranks (the full row exists only after a gather,
    a collective no hook may issue)."""
    inner = getattr(model, "model", None)
    norm = getattr(inner, "norm", None)
    head = getattr(model, "lm_head", None)
    proc = getattr(model, "logits_processor", None)
    vocab = getattr(getattr(proc, "config", None), "vocab_size", None)
    if norm is None or head is None or proc is None or not isinstance(vocab, int) or h.shape[0] == 0:
        return None
    if getattr(proc, "do_tensor_parallel_all_gather", False):
        return None
    with torch.no_grad():
        x = h if getattr(inner, "norm_output", False) else norm(h)
        out = proc._compute_lm_head(x, head).float()[:, :vocab]
        if getattr(proc, "logit_scale", None) is not None:
            out = out * proc.logit_scale
        cap = getattr(proc, "final_logit_softcapping", None)
        if cap:
            out = cap * torch.tanh(out / cap)
        return out


def fc_in_features(fc) -> Optional[int]:
    """The input width of the draft's ``fc`` (a torch ``Linear`` or SGLang's parallel linear), if it has one."""
    if fc is None:
        return None
    for attr in ("in_features", "input_size"):
        if isinstance(getattr(fc, attr, None), int):
            return getattr(fc, attr)
    return None
