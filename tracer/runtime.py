"""The tracer inside one scheduler process: state, sinks, writer, and the work each hook does.

Hook-thread state (step counters, sampling cache, draft top-k waiting for their verify) is touched only
by SGLang's scheduler thread; per-request totals are touched only by the writer thread.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import time
import uuid
from typing import Any, Callable, Dict, List, Optional

import torch

from . import facts as facts_mod
from .config import TracerConfig
from .devicecopy import STAT_FIELDS, HostCopy, probs_topk, row_stats
from .health import Health
from .sampling import request_sampled, step_sampled
from .writer import Writer

log = logging.getLogger("draftscope.tracer")
FC_MAX_ROWS = 64  # rows per request on which fc is recomputed off-graph


class InjectedFault(RuntimeError):
    """Raised inside a probe named in DRAFTSCOPE_FAULT (tests the fault path)."""


def _finite(v: float) -> Optional[float]:
    return v if v == v and v not in (float("inf"), float("-inf")) else None


def sample_record(point: str, phase: str, at: float, rid: Optional[str], step: Optional[int],
                  shape: List[int], dtype: str, stats: torch.Tensor) -> dict:
    s = dict(zip(STAT_FIELDS, stats.tolist()))
    rec = {"point": point, "phase": phase, "at": at, "rid": rid, "step_index": step, "shape": shape,
           "dtype": dtype, "width": int(shape[-1]) if shape else 0, "rows": int(s["rows"]),
           "nan_count": int(s["nan_count"]), "inf_count": int(s["inf_count"])}
    for k in ("l2_mean", "l2_max", "mean", "std", "absmax"):
        rec[k] = _finite(s[k])
    return rec


def _topk_lists(probs: torch.Tensor, ids: torch.Tensor) -> List[List[List[float]]]:
    return [[[int(i), round(float(p), 6)] for i, p in zip(id_row, p_row)]
            for id_row, p_row in zip(ids.tolist(), probs.tolist())]


class Tracer:
    def __init__(self, config: TracerConfig, sglang_version: str):
        self.config = config
        self.sglang_version = sglang_version
        self.health = Health(config.probe_failure_limit)
        self.run_id = uuid.uuid4().hex
        self.run: Dict[str, Any] = {"engine": "sglang", "engine_version": sglang_version, "source": "tracer",
                                    "status": "running", "started_at": time.time(), "host": socket.gethostname(),
                                    "pid": os.getpid(), "tracer_config": config.public()}
        self.writer: Optional[Writer] = None
        self.recording = False  # this rank writes records (first TP rank of its DP group, last PP rank)
        self.active = True
        # hook-thread state
        self.verify_calls = 0
        self.step_of: Dict[str, int] = {}
        self.first_seen: Dict[str, float] = {}
        self._sampled: Dict[str, bool] = {}
        self.draft_seed: Dict[str, tuple] = {}  # rid -> (probs, ids) of the draft's next position 1
        self.draft_steps: Dict[str, list] = {}  # rid -> [(probs, ids)] for positions 2.. of this round
        self.target_hidden: Optional[int] = None
        self.num_draft_tokens: Optional[int] = None
        # writer-thread state: rid -> [(verify_id, accept_len, proposed)]
        self.totals: Dict[str, list] = {}

    # -- plumbing ---------------------------------------------------------------------------------
    def guard(self, probe: str, fn: Callable, *args) -> Any:
        """Run ``fn``; any exception is counted against ``probe``, never raised into SGLang."""
        if self.health.is_disabled(probe):
            return None
        try:
            if probe in self.config.fault:
                raise InjectedFault(f"DRAFTSCOPE_FAULT={probe}")
            out = fn(*args)
            self.health.ok(probe)
            return out
        except Exception as exc:
            if self.health.failed(probe, exc):
                log.warning("draftscope: probe %s failed %d times in a row and is disabled (%s)",
                            probe, self.health.failure_limit, self.health.last_error[probe])
            return None

    def submit(self, probe: str, job: Callable) -> bool:
        job.probe = probe
        return self.writer is not None and self.writer.submit(job)

    def sampled(self, rid: str) -> bool:
        s = self._sampled.get(rid)
        if s is None:
            s = self._sampled[rid] = request_sampled(rid, self.config.sample_rate)
        return s

    def step_wanted(self, rid: str, step: int) -> bool:
        return self.sampled(rid) and step_sampled(step, self.config.step_stride)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    # -- attach -----------------------------------------------------------------------------------
    def attach(self, scheduler) -> None:
        """After the scheduler built its workers: rank, facts, sink, writer."""
        from .sinks import open_sink

        self.recording = _is_recording_rank()
        spec = getattr(scheduler, "draft_worker", None)
        self.num_draft_tokens = getattr(spec, "speculative_num_draft_tokens", None)
        self.target_hidden = facts_mod._safe(lambda: scheduler.tp_worker.model_runner.model_config.hidden_size)
        if not self.recording:
            return
        facts, run_fields = facts_mod.collect(scheduler, self.sglang_version)
        self.run.update(run_fields, facts=facts)
        sink = open_sink(self.config, self.health.drop)
        if sink is None:
            self.active = False
            return
        c = self.config
        self.writer = Writer(sink, self.health, lambda: dict(self.run), run_id=self.run_id,
                             max_queue_items=c.max_queue_items, max_batch_items=c.max_batch_items,
                             flush_interval_s=c.flush_interval_s, health_interval_s=c.health_interval_s)
        atexit.register(self.close)

    # -- prefill: target aux -> draft extend --------------------------------------------------------
    def on_prefill(self, worker, batch, target_hidden: torch.Tensor, logits: Optional[torch.Tensor]) -> None:
        now = time.time()
        reqs = list(batch.reqs)
        for r in reqs:
            self.first_seen.setdefault(r.rid, now)
        rows = [i for i, r in enumerate(reqs) if self.step_wanted(r.rid, 0)]
        if not rows or not self.recording or batch.forward_mode.is_idle():
            return
        extend_lens = list(batch.extend_lens)
        starts = [sum(extend_lens[:i]) for i in range(len(extend_lens))]
        tensors, meta = {}, []
        for i in rows:
            rid = reqs[i].rid
            h = target_hidden[starts[i]: starts[i] + extend_lens[i]]
            self._feature_stats(tensors, meta, worker, h, rid, 0, "prefill", with_aux=True)
        if logits is not None:
            idx = torch.tensor(rows, device=logits.device)
            self._draft_logits(tensors, meta, worker, logits[idx], [reqs[i].rid for i in rows], "prefill", 0)
        copy = HostCopy(tensors)
        self.submit("prefill", lambda: {"samples": self._samples(copy, meta, now)})

    def _feature_stats(self, tensors, meta, worker, h, rid, step, phase, with_aux) -> None:
        """draft.input (+ target.aux[i] chunks, + draft.fc.out recomputed) of one request's rows."""
        key = f"{phase}:{rid}:{len(meta)}"
        tensors[key] = row_stats(h)
        meta.append((key, "draft.input", rid, step, phase, list(h.shape), str(h.dtype).replace("torch.", "")))
        H = self.target_hidden
        width = int(h.shape[-1])
        if with_aux and H and width % H == 0:
            for c in range(width // H):
                k = f"{key}:aux{c}"
                tensors[k] = row_stats(h[:, c * H:(c + 1) * H])
                meta.append((k, f"target.aux[{c}]", rid, step, phase, [int(h.shape[0]), H],
                             str(h.dtype).replace("torch.", "")))
        fc_out = _recompute_fc(worker.draft_runner.model, h[-FC_MAX_ROWS:])
        if fc_out is not None:
            k = f"{key}:fc"
            tensors[k] = row_stats(fc_out)
            meta.append((k, "draft.fc.out", rid, step, phase, list(fc_out.shape),
                         str(fc_out.dtype).replace("torch.", "")))

    def _draft_logits(self, tensors, meta, worker, logits, rids, phase, step_offset) -> None:
        """draft.logits stats per request and its top-k, mapped to target ids, as the next position 1."""
        probs, ids = probs_topk(logits, self.config.topk)
        hot = getattr(worker, "hot_token_id", None)
        if hot is not None:
            ids = hot[ids]
        for j, rid in enumerate(rids):
            key = f"{phase}:{rid}:logits"
            tensors[key] = row_stats(logits[j:j + 1])
            step = self.step_of.get(rid, 0) - step_offset
            meta.append((key, "draft.logits", rid, step, phase, [1, int(logits.shape[-1])], "float32"))
            self.draft_seed[rid] = (probs[j], ids[j])

    def _samples(self, copy: HostCopy, meta, at: float) -> List[dict]:
        host = copy.wait()
        return [sample_record(point, phase, at, rid, step, shape, dtype, host[key])
                for key, point, rid, step, phase, shape, dtype in meta]

    # -- draft decode -----------------------------------------------------------------------------
    def on_draft_input(self, worker, batch) -> List[int]:
        """draft.input of the draft steps; returns the sampled rows (topk 1 only) for step logits."""
        if not self.recording or batch.forward_mode.is_idle() or worker.topk != 1:
            return []
        reqs = list(batch.reqs)
        rows = [i for i, r in enumerate(reqs) if self.step_wanted(r.rid, self.step_of.get(r.rid, 0))]
        if not rows:
            return []
        for i in rows:
            self.draft_steps[reqs[i].rid] = []
        h = batch.spec_info.hidden_states
        if h is None:
            return rows
        now, tensors, meta = time.time(), {}, []
        for i in rows:
            rid = reqs[i].rid
            self._feature_stats(tensors, meta, worker, h[i:i + 1], rid, self.step_of.get(rid, 0),
                                "draft_decode", with_aux=False)
        copy = HostCopy(tensors)
        self.submit("draft", lambda: {"samples": self._samples(copy, meta, now)})
        return rows

    def on_draft_step_logits(self, worker, batch, rows: List[int], logits: torch.Tensor) -> None:
        idx = torch.tensor(rows, device=logits.device)
        probs, ids = probs_topk(logits[idx], self.config.topk)
        hot = getattr(worker, "hot_token_id", None)
        if hot is not None:
            ids = hot[ids]
        reqs = batch.reqs
        for j, i in enumerate(rows):
            self.draft_steps.setdefault(reqs[i].rid, []).append((probs[j], ids[j]))

    # -- verify -----------------------------------------------------------------------------------
    def on_verify(self, batch, verify_input, result) -> None:
        reqs = list(batch.reqs)
        bs = len(reqs)
        if bs == 0 or result is None or getattr(result, "accept_lens", None) is None:
            return
        self.verify_calls += 1
        vid = self.verify_calls
        N = int(verify_input.draft_token_num)
        rids = [r.rid for r in reqs]
        steps = []
        for rid in rids:
            s = self.step_of.get(rid, 0)
            steps.append(s)
            self.step_of[rid] = s + 1
        rows = [i for i, rid in enumerate(rids) if self.step_wanted(rid, steps[i])]
        if not self.recording:
            return
        tensors: Dict[str, torch.Tensor] = {"accept_lens": result.accept_lens[:bs]}
        draft_topk: Dict[str, tuple] = {}
        if rows:
            dev = result.accept_lens.device
            idx = torch.tensor(rows, device=dev)
            nodes = (idx[:, None] * N + torch.arange(N, device=dev)[None, :]).reshape(-1)
            lo = result.logits_output
            tensors["draft_token"] = verify_input.draft_token[nodes]
            tensors["predict"] = result.next_token_ids[nodes]
            tensors["seq_lens"] = batch.seq_lens[idx]
            tprobs, tids = probs_topk(lo.next_token_logits[nodes], self.config.topk)
            tensors["target_probs"], tensors["target_ids"] = tprobs, tids
            hidden = lo.hidden_states
            H = self.target_hidden
            if hidden is not None and H and hidden.shape[-1] % H == 0:
                h = hidden[nodes]
                C = int(hidden.shape[-1]) // H
                tensors["aux"] = torch.stack([torch.stack([row_stats(h[j * N:(j + 1) * N, c * H:(c + 1) * H])
                                                           for c in range(C)]) for j in range(len(rows))])
                tensors["aux_shape"] = torch.tensor([N, H], dtype=torch.int64)
                aux_dtype = str(hidden.dtype).replace("torch.", "")
            for i in rows:
                rid = rids[i]
                seed = self.draft_seed.pop(rid, None)
                seq = ([seed] if seed is not None else []) + self.draft_steps.pop(rid, [])
                if seq:
                    tensors[f"dp:{rid}"] = torch.stack([p for p, _ in seq])
                    tensors[f"di:{rid}"] = torch.stack([d for _, d in seq])
                    draft_topk[rid] = True
        copy = HostCopy(tensors)
        now = time.time()

        def build() -> dict:
            host = copy.wait()
            acc = host["accept_lens"].tolist()
            for rid, a in zip(rids, acc):
                self.totals.setdefault(rid, []).append((vid, int(a), N - 1))
            out = {"steps": [], "samples": []}
            for j, i in enumerate(rows):
                rid, a = rids[i], int(acc[i])
                drafted = host["draft_token"][j * N + 1:(j + 1) * N].tolist()
                step = {"rid": rid, "step_index": steps[i], "at": now,
                        "seq_pos": int(host["seq_lens"][j]), "drafted_tokens": [int(t) for t in drafted],
                        "accept_len": a, "accept_flags": [p <= a - 1 for p in range(1, N)],
                        "bonus_token": int(host["predict"][j * N + a - 1]),
                        "target_topk": _topk_lists(host["target_probs"][j * N:j * N + N - 1],
                                                   host["target_ids"][j * N:j * N + N - 1])}
                if rid in draft_topk:
                    step["draft_topk"] = _topk_lists(host[f"dp:{rid}"][:N - 1], host[f"di:{rid}"][:N - 1])
                out["steps"].append(step)
                if "aux" in host:
                    for c, stats in enumerate(host["aux"][j]):
                        out["samples"].append(sample_record(
                            f"target.aux[{c}]", "verify", now, rid, steps[i], host["aux_shape"].tolist(),
                            aux_dtype, stats))
            return out

        self.submit("verify", build)

    # -- draft extend after verify ----------------------------------------------------------------
    def on_draft_extend(self, worker, batch, batch_result, logits: Optional[torch.Tensor]) -> None:
        """draft.input/fc.out of the verify step just done; draft logits at the last accepted row, which
        seed position 1 of the next step."""
        if not self.recording or batch.forward_mode.is_idle():
            return
        reqs = list(batch.reqs)
        done = [i for i, r in enumerate(reqs) if self.step_wanted(r.rid, self.step_of.get(r.rid, 1) - 1)]
        upcoming = [i for i, r in enumerate(reqs) if self.step_wanted(r.rid, self.step_of.get(r.rid, 0))]
        N = worker.speculative_num_draft_tokens
        tensors, meta, now = {}, [], time.time()
        h = batch_result.logits_output.hidden_states
        for i in done if h is not None else ():
            rid = reqs[i].rid
            self._feature_stats(tensors, meta, worker, h[i * N:(i + 1) * N], rid,
                                self.step_of.get(rid, 1) - 1, "draft_extend", with_aux=False)
        if upcoming and logits is not None and logits.shape[0] == len(reqs) * N:
            idx = torch.tensor(upcoming, device=logits.device)
            sel = idx * N + batch_result.accept_lens[idx].to(torch.int64) - 1
            self._draft_logits(tensors, meta, worker, logits[sel], [reqs[i].rid for i in upcoming],
                               "draft_extend", 1)
        if tensors:
            copy = HostCopy(tensors)
            self.submit("draft_extend", lambda: {"samples": self._samples(copy, meta, now)})

    # -- request finished -------------------------------------------------------------------------
    def on_finished(self, reqs, upto: Optional[int]) -> None:
        now = time.time()
        infos = []
        for req in reqs:
            rid = req.rid
            ct = int(getattr(req, "spec_verify_ct", 0))
            reason = getattr(req, "finished_reason", None)
            reason = facts_mod._safe(lambda: reason.to_json().get("type")) if reason is not None else None
            infos.append({"rid": rid, "sampled": self.sampled(rid),
                          "prompt_len": len(req.origin_input_ids), "output_len": len(req.output_ids),
                          "started_at": self.first_seen.pop(rid, None), "finished_at": now,
                          "finish_reason": reason, "spec_verify_ct": ct,
                          "spec_accepted_drafts": int(getattr(req, "spec_num_correct_drafts", 0)),
                          "spec_proposed_drafts": ct * (self.num_draft_tokens - 1) if self.num_draft_tokens else None})
            for d in (self.step_of, self._sampled, self.draft_seed, self.draft_steps):
                d.pop(rid, None)
        if not self.recording:
            return

        def build() -> dict:
            out = []
            for info in infos:
                steps = self.totals.pop(info["rid"], [])
                if upto is not None:
                    counted = [s for s in steps if s[0] <= upto]
                    info.update(traced_verify_ct=len(counted),
                                traced_accepted_drafts=sum(a - 1 for _, a, _ in counted),
                                traced_proposed_drafts=sum(p for _, _, p in counted))
                out.append({k: v for k, v in info.items() if v is not None})
            return {"requests": out}

        self.submit("finish", build)


def _recompute_fc(model, h: torch.Tensor) -> Optional[torch.Tensor]:
    """The draft's ``fc`` (with its input norms) applied off-graph to rows ``h``; None when fc would not run."""
    inner = getattr(model, "model", None)
    fc = getattr(inner, "fc", None)
    embed = getattr(inner, "embed_tokens", None)
    if fc is None or embed is None or h.shape[0] == 0 or h.shape[-1] == embed.weight.shape[-1]:
        return None
    if facts_mod._fc_in_features(fc) != h.shape[-1]:
        return None  # fc would raise in the draft itself; draft.input records the width
    with torch.no_grad():
        x = h
        if getattr(inner, "input_norm", None) is not None:
            x = inner.input_norm(x)
        if getattr(inner, "fc_norm", None) is not None:
            chunks = x.chunk(inner.num_aux_hidden_states, dim=-1)
            x = torch.cat([norm(c) for norm, c in zip(inner.fc_norm, chunks)], dim=-1)
        out = fc(x)
        return out[0] if isinstance(out, tuple) else out


def _is_recording_rank() -> bool:
    try:
        from sglang.srt.runtime_context import get_parallel

        p = get_parallel()
        last_pp = getattr(getattr(p, "pp_group", None), "is_last_rank", True)
        return getattr(p, "attn_tp_rank", getattr(p, "tp_rank", 0)) == 0 and bool(last_pp)
    except Exception:
        return True
