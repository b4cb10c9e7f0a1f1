"""Train the tiny EAGLE-3 draft on the tiny target's own aux hidden states and greedy continuations.

Deterministic (seeded, fixed thread count) and short: it runs in CI from a clean clone. The data are
the target's greedy continuations (HF transformers) of seeded prompts; labels are the target's
argmax at every position, mapped into the draft vocabulary (the 256 target ids the target emits
most often on those continuations). Training unrolls 3 draft steps (training-time test): steps 2..3
take the draft's own hidden state, as SGLang's draft decode does.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from testbed.eagle3_draft import DraftShape, Eagle3Draft
from testbed.texts import DEMO_PROMPTS, TOKENIZER_CORPUS

# One thread: float reductions (hence the bytes written) do not depend on the host, and a busy
# 2-core CI box does not stall on OpenMP spin-waits.
TRAIN_THREADS = 1
DEMO_REPEATS = 4  # the demo prompts' continuations are weighted up in the corpus


@dataclass
class Corpus:
    ids: list[torch.Tensor]  # per length group: [N, T] prompt + continuation
    aux: list[torch.Tensor]  # [N, T, K*H]: HF hidden_states[i+1] for each aux id i
    greedy: list[torch.Tensor]  # [N, T]: the target's argmax after each position
    prompt_len: list[int]


@dataclass
class Trained:
    state: dict[str, torch.Tensor]  # SGLang checkpoint names
    hot_ids: list[int]
    stats: dict


def training_prompts(tokenizer, count: int, seed: int) -> list[list[int]]:
    """The demo prompts (the draft is trained on the target's own continuations of them, as a real
    draft is trained on its target's outputs), then seeded spans of the tokenizer sentences and random
    token strings of 2..10 tokens."""
    rng = random.Random(seed)
    sentences = [tokenizer.encode(s) for s in TOKENIZER_CORPUS]
    vocab = len(tokenizer)
    prompts = [tokenizer.encode(p) for p in DEMO_PROMPTS] * DEMO_REPEATS
    for i in range(count - len(prompts)):
        length = rng.randint(2, 10)
        if i % 2 == 0:
            sent = rng.choice(sentences)
            start = rng.randint(0, max(0, len(sent) - length))
            prompts.append(sent[start : start + length])
        else:
            prompts.append([rng.randrange(5, vocab) for _ in range(length)])
    return prompts


@torch.no_grad()
def greedy_continue(target, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation with HF's KV cache, ignoring EOS (the server runs with a token budget)."""
    out = target(input_ids=ids, use_cache=True)
    seq = [ids]
    for _ in range(new_tokens):
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        seq.append(nxt)
        out = target(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    return torch.cat(seq, 1)


@torch.no_grad()
def target_features(target, ids: torch.Tensor, aux_layer_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux [N,T,K*H], greedy [N,T]): the aux states SGLang captures for these ids, and the argmax."""
    out = target(input_ids=ids, output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i + 1] for i in aux_layer_ids], -1)
    return aux, out.logits.argmax(-1)


def build_corpus(target, prompts: list[list[int]], new_tokens: int, aux_layer_ids) -> Corpus:
    groups: dict[int, list[list[int]]] = {}
    for p in prompts:
        groups.setdefault(len(p), []).append(p)
    corpus = Corpus([], [], [], [])
    for length in sorted(groups):
        ids = greedy_continue(target, torch.tensor(groups[length]), new_tokens)
        aux, greedy = target_features(target, ids, aux_layer_ids)
        corpus.ids.append(ids)
        corpus.aux.append(aux)
        corpus.greedy.append(greedy)
        corpus.prompt_len.append(length)
    return corpus


def hot_vocab(corpus: Corpus, size: int, vocab: int) -> list[int]:
    """The `size` target ids the target emits most often on the continuations (ties: lower id)."""
    counts = torch.zeros(vocab, dtype=torch.int64)
    for ids, plen in zip(corpus.ids, corpus.prompt_len):
        counts += torch.bincount(ids[:, plen:].reshape(-1), minlength=vocab)
    order = sorted(range(vocab), key=lambda i: (-int(counts[i]), i))
    return sorted(order[:size])


def ttt_labels(greedy: torch.Tensor, to_draft: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Step k row t must predict the target's argmax after position t+1+k, as a draft id (-100: none)."""
    n, t = greedy.shape
    labels = []
    for k in range(steps):
        shifted = F.pad(greedy[:, 1 + k :], (0, 1 + k), value=-1)
        lab = torch.where(shifted >= 0, to_draft[shifted.clamp(min=0)], torch.full_like(shifted, -100))
        labels.append(lab)
    return labels


def init_draft(target, spec, hot_ids: list[int]) -> Eagle3Draft:
    t = spec.target
    shape = DraftShape(
        hidden=t.hidden, heads=t.heads, kv_heads=t.kv_heads, intermediate=spec.draft.intermediate,
        num_aux=len(spec.draft.aux_layer_ids), draft_vocab=spec.draft.draft_vocab,
        rms_eps=t.rms_eps, rope_theta=t.rope_theta,
    )
    draft = Eagle3Draft(shape, target.get_input_embeddings().weight)
    with torch.no_grad():
        # The target's own head rows are a useful prior. fc keeps its random init on purpose: an fc
        # near "pass the deepest aux state through" would make the target's final hidden (what the
        # draft gets when aux capture is off) almost as good as the aux states.
        draft.lm_head.weight.copy_(target.get_output_embeddings().weight[hot_ids])
    return draft


def train(target, tokenizer, spec) -> Trained:
    """Build the corpus, pick the draft vocabulary and train; returns tensors and measured stats."""
    threads = torch.get_num_threads()
    torch.set_num_threads(TRAIN_THREADS)
    try:
        return _train(target, tokenizer, spec)
    finally:
        torch.set_num_threads(threads)


def _train(target, tokenizer, spec) -> Trained:
    d = spec.draft
    started = time.monotonic()
    torch.manual_seed(spec.seed + 1)
    prompts = training_prompts(tokenizer, d.corpus_prompts, spec.seed)
    corpus = build_corpus(target, prompts, d.corpus_new_tokens, d.aux_layer_ids)
    hot_ids = hot_vocab(corpus, d.draft_vocab, spec.target.vocab)
    to_draft = torch.full((spec.target.vocab,), -100, dtype=torch.int64)
    to_draft[torch.tensor(hot_ids)] = torch.arange(len(hot_ids))
    corpus_s = time.monotonic() - started

    draft = init_draft(target, spec, hot_ids)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=d.learning_rate, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=d.learning_rate, total_steps=max(d.train_steps, 1))
    batches = [
        (ids, aux, ttt_labels(g, to_draft, d.ttt_steps)) for ids, aux, g in zip(corpus.ids, corpus.aux, corpus.greedy)
    ]
    gen = torch.Generator().manual_seed(spec.seed + 2)
    losses = []
    for step in range(d.train_steps):
        ids, aux, labels = batches[step % len(batches)]
        rows = torch.randperm(ids.shape[0], generator=gen)[: d.batch_size]
        logits = draft.forward_ttt(ids[rows], aux[rows], d.ttt_steps)
        loss = sum(
            (0.8**k) * F.cross_entropy(lg.flatten(0, 1), lab[rows].flatten(), ignore_index=-100)
            for k, (lg, lab) in enumerate(zip(logits, labels))
        )
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(loss.detach().item())

    acc = step_accuracy(draft, batches, d.ttt_steps)
    stats = {
        "corpus_sequences": sum(int(i.shape[0]) for i in corpus.ids),
        "corpus_s": round(corpus_s, 1),
        "train_steps": d.train_steps,
        "train_s": round(time.monotonic() - started - corpus_s, 1),
        "final_loss": round(sum(losses[-20:]) / max(len(losses[-20:]), 1), 4) if losses else None,
        "train_top1_by_step": acc,
    }
    return Trained(draft.state_dict_sglang(), hot_ids, stats)


@torch.no_grad()
def step_accuracy(draft: Eagle3Draft, batches, steps: int) -> list[float]:
    """Teacher-forced top-1 accuracy per unrolled step on the training corpus (labels in the draft vocab)."""
    hit, total = [0] * steps, [0] * steps
    for ids, aux, labels in batches:
        for k, lg in enumerate(draft.forward_ttt(ids, aux, steps)):
            ok = labels[k] != -100
            hit[k] += int((lg.argmax(-1) == labels[k])[ok].sum())
            total[k] += int(ok.sum())
    return [round(h / max(t, 1), 3) for h, t in zip(hit, total)]


@torch.no_grad()
def simulated_accept_length(
    target, draft: Eagle3Draft, hot_ids, aux_layer_ids, prompt_ids: list[int], new_tokens: int, steps: int
) -> float:
    """Chain speculative decoding as SGLang runs it (topk 1, greedy): completion tokens / verify rounds.

    `aux_layer_ids=None` feeds the target's final post-norm hidden instead, as SGLang does when aux
    capture is off."""
    hot = torch.tensor(hot_ids)
    seq = greedy_continue(target, torch.tensor([prompt_ids]), new_tokens)[0]
    if aux_layer_ids is None:
        ids_aux = target(input_ids=seq[None], output_hidden_states=True).hidden_states[-1]
    else:
        ids_aux, _ = target_features(target, seq[None], aux_layer_ids)
    n = len(prompt_ids)  # the prefill produced seq[n]; tokens known: seq[: n + 1]
    verifies = 0
    while n + 1 < len(seq):
        rows = torch.arange(n)
        logits, hidden, past = draft.forward_causal(seq[1 : n + 1][None], ids_aux[:, :n], rows[None])
        proposals = [int(hot[logits[0, -1].argmax()])]
        h = hidden[:, -1:]
        for k in range(1, steps):
            tok = torch.tensor([[proposals[-1]]])
            logits, h, past = draft.forward_causal(tok, h, torch.tensor([[n - 1 + k]]), past)
            proposals.append(int(hot[logits[0, -1].argmax()]))
        accepted = 0
        for i, p in enumerate(proposals):
            if n + 1 + i < len(seq) and int(seq[n + 1 + i]) == p:
                accepted += 1
            else:
                break
        verifies += 1
        n += accepted + 1
    return new_tokens / max(verifies, 1)
