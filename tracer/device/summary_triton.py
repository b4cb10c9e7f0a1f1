"""The Summarizer's fast path on CUDA: one Triton launch per summary (per row and chunk statistics in one
fp32 pass; per-block logits max / exp-sum / top-k candidates; the final top-k and softmax by the last block
of each row to finish) and its scratch. A launch through Triton's ``JITFunction`` costs ~30 µs of host time
(argument binding and specialisation); :class:`Launches` keeps each compiled kernel and launches it
directly after the first time, which costs a few µs."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from draftscope_tracer.device.summary_ring import Outputs

try:  # Triton ships with every SGLang GPU install; without it the pure-torch path runs.
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - any import failure only disables the fast path
    triton = None
try:  # Triton >= 3.4; before it, every launch takes the ``JITFunction`` path
    from triton import knobs
except Exception:  # noqa: BLE001
    knobs = None


def pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _int_key(v: int) -> tuple:
    """What Triton may specialise an int argument on (a superset: equal to 1, divisible by 16, its width)."""
    return v == 1, v % 16 == 0, -2**31 <= v < 2**31


def hooked() -> bool:
    """Whether a Triton launch hook is set (Triton >= 3.4 keeps an empty ``HookChain`` when none is), or
    Triton is too old for direct launches."""
    if knobs is None:
        return True
    hook = knobs.runtime.launch_enter_hook
    return hook is not None and bool(getattr(hook, "calls", True))


class Launches:
    """One Triton kernel's compiled variants, launched without the ``JITFunction`` dispatch.

    The first launch of each variant goes through ``kernel[grid](...)`` (:meth:`first`: it compiles or finds
    the kernel and returns it); later ones call the compiled kernel's launcher (:meth:`planned`) with every
    tensor given as its address, an int, which the launcher takes as is (a tensor costs it a ``data_ptr``
    call and a driver query each). The caller names the variant by ``key``: every argument property Triton
    specialises on (``_int_key`` of each int that varies between launches; the dtype and 16-byte alignment
    of each tensor that does), so a kernel is never launched with arguments it was not compiled for. With a
    Triton launch hook set (a profiler), every launch takes the ``JITFunction`` path."""

    def __init__(self, kernel, warps: Callable[[], int]):
        """``warps()``: the warps per program now (a bench may tune them between launches)."""
        self.kernel, self.warps = kernel, warps
        self._compiled: dict = {}

    def compiled(self, key: tuple) -> Optional[tuple]:
        """The launcher of ``key``'s compiled variant (see :meth:`planned`), or None when the launch must go
        through :meth:`first`."""
        compiled = self._compiled.get((self.warps(), *key))
        return None if compiled is None or hooked() else compiled

    def first(self, grid: tuple, key: tuple, *args) -> None:
        """Launch through the ``JITFunction`` (tensors as tensors) and keep the compiled variant's launcher."""
        warps = self.warps()
        compiled = self.kernel[grid](*args, num_warps=warps)
        self._compiled[(warps, *key)] = None if compiled is None else _launcher(compiled)

    @staticmethod
    def planned(launcher: tuple, grid: tuple, device: int, before: tuple, after: Callable[[Outputs], tuple]):
        """A direct launch of a variant (its :meth:`compiled` launcher) on the current stream of CUDA device
        ``device``, as a function of the destination: ``plan(out)`` launches with ``(*before, *after(out))``, the
        arguments of :meth:`first` with every tensor replaced by its ``data_ptr()``."""
        fn, head = launcher
        stream = torch._C._cuda_getCurrentRawStream
        g0, g1 = grid

        def plan(out: Outputs) -> None:
            fn(g0, g1, 1, stream(device), *head, *before, *after(out))

        return plan


def _launcher(compiled) -> tuple:
    """``(fn, head)``: ``fn(gridX, gridY, gridZ, stream, *head, *kernel args)`` launches ``compiled``. Where
    Triton's CUDA launcher needs no scratch memory (Triton 3.6: ``CudaLauncher``), its C ``launch`` is called
    directly, without the Python wrapper that allocates scratch (a few µs a launch); else its ``run``."""
    run = compiled.run
    if getattr(run, "global_scratch_size", 1) == 0 and getattr(run, "profile_scratch_size", 1) == 0 \
            and hasattr(run, "launch") and hasattr(run, "launch_cooperative_grid"):
        return run.launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                            compiled.packed_metadata, None, None, None)
    return run, (compiled.function, compiled.packed_metadata, None, None, None)


if triton is not None:
    @triton.jit
    def _hidden_stats(hidden, stride_row, n_rows, rows, rows_out, sums, absmax, r, c, R, K, H,
                      BLOCK_H: tl.constexpr):
        """Chunk c of selected row r in one fp32 pass; also copies rows[r] out (at c == 0)."""
        row = tl.load(rows + r)
        if c == 0:
            tl.store(rows_out + r, row)
        valid = row >= 0  # padding rows (-1) read nothing: a large capacity costs no bandwidth
        row = tl.minimum(tl.maximum(row, 0), n_rows - 1)
        base = hidden + row * stride_row + c * H
        acc_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc_sq = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc_nan = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc_inf = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc_max = tl.zeros([BLOCK_H], dtype=tl.float32)
        for start in range(0, H, BLOCK_H):
            offs = start + tl.arange(0, BLOCK_H)
            x = tl.load(base + offs, mask=(offs < H) & valid, other=0.0).to(tl.float32)
            is_nan = x != x
            ax = tl.abs(x)
            acc_sum += x
            acc_sq += x * x
            acc_nan += is_nan.to(tl.float32)
            acc_inf += (ax == float("inf")).to(tl.float32)
            acc_max = tl.maximum(acc_max, tl.where(is_nan, 0.0, ax))
        nan = tl.sum(acc_nan, axis=0)
        out = r * K + c
        plane = R * K
        tl.store(sums + out, tl.sum(acc_sum, axis=0))
        tl.store(sums + plane + out, nan)
        tl.store(sums + 2 * plane + out, nan + tl.sum(acc_inf, axis=0))
        tl.store(sums + 3 * plane + out, tl.sum(acc_sq, axis=0))
        tl.store(absmax + out, tl.where(nan > 0, float("nan"), tl.max(acc_max, axis=0)))

    @triton.jit
    def _logits_block(logits, stride_row, n_rows, rows, bmax, bsum, cand_val, cand_id, r, b,
                      V, NB, TOPK: tl.constexpr, BLOCK_V: tl.constexpr):
        """Block b of selected row r: max, sum of exp(x - max) and the top-TOPK (value, id)."""
        row = tl.load(rows + r)
        valid = row >= 0
        row = tl.minimum(tl.maximum(row, 0), n_rows - 1)
        idx = tl.arange(0, BLOCK_V)
        offs = b * BLOCK_V + idx
        x = tl.load(logits + row * stride_row + offs, mask=(offs < V) & valid, other=float("-inf"))
        m = tl.max(x, axis=0)
        s = tl.where(m == float("-inf"), 0.0, tl.sum(tl.exp(x - m), axis=0))
        tl.store(bmax + r * NB + b, m)
        tl.store(bsum + r * NB + b, s)
        out = (r * NB + b) * TOPK
        for j in tl.static_range(TOPK):
            v, i = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
            tl.store(cand_val + out + j, v)
            tl.store(cand_id + out + j, b * BLOCK_V + i)
            x = tl.where(idx == i, float("-inf"), x)

    @triton.jit
    def _logits_final(bmax, bsum, cand_val, cand_id, topk_p, topk_id, r,
                      NB, TOPK: tl.constexpr, NB_P2: tl.constexpr, NC_P2: tl.constexpr):
        """Row r: max and softmax denominator from its blocks; final top-TOPK, best first."""
        ob = tl.arange(0, NB_P2)
        bm = tl.load(bmax + r * NB + ob, mask=ob < NB, other=float("-inf"))
        bs = tl.load(bsum + r * NB + ob, mask=ob < NB, other=0.0)
        m = tl.max(bm, axis=0)
        denom = tl.sum(tl.where(bm > float("-inf"), bs * tl.exp(bm - m), 0.0), axis=0)
        oc = tl.arange(0, NC_P2)
        nc = NB * TOPK
        cv = tl.load(cand_val + r * nc + oc, mask=oc < nc, other=float("-inf"))
        ci = tl.load(cand_id + r * nc + oc, mask=oc < nc, other=0)
        for j in tl.static_range(TOPK):
            v, i = tl.max(cv, axis=0, return_indices=True, return_indices_tie_break_left=True)
            tok = tl.sum(tl.where(oc == i, ci, 0), axis=0)
            tl.store(topk_id + r * TOPK + j, tok.to(tl.int64))
            tl.store(topk_p + r * TOPK + j, tl.exp(v - m) / denom)
            cv = tl.where(oc == i, float("-inf"), cv)

    @triton.jit
    def _hidden_stats_kernel(hidden, stride_row, n_rows, rows, rows_out, sums, absmax,
                             R, K, H, BLOCK_H: tl.constexpr):
        """Program (r, c): ``_hidden_stats`` (a layout without logits); a padding row only marks itself."""
        r = tl.program_id(0)
        c = tl.program_id(1)
        if tl.load(rows + r) >= 0:
            _hidden_stats(hidden, stride_row, n_rows, rows, rows_out, sums, absmax, r, c, R, K, H, BLOCK_H)
        elif c == 0:
            tl.store(rows_out + r, -1)

    @triton.jit
    def _gather_ints(ia, ma, ib, mb, iseq, mseq, iacc, macc, ints_out, rows, r, NODES):
        """Row r's [draft token, target token, sequence length, accept length] (a verify's node ``row`` and
        its request ``row // NODES``); -1 for a padding row. Each source is read as int32 words, ``m`` words
        per element (2 for int64: its low word; ids and lengths fit in 31 bits)."""
        row = tl.load(rows + r)
        ok = row >= 0
        node = tl.maximum(row, 0)
        req = node // NODES
        tl.store(ints_out + r * 4, tl.load(ia + node * ma, mask=ok, other=-1).to(tl.int64))
        tl.store(ints_out + r * 4 + 1, tl.load(ib + node * mb, mask=ok, other=-1).to(tl.int64))
        tl.store(ints_out + r * 4 + 2, tl.load(iseq + req * mseq, mask=ok, other=-1).to(tl.int64))
        tl.store(ints_out + r * 4 + 3, tl.load(iacc + req * macc, mask=ok, other=-1).to(tl.int64))

    # the int32 word counts of the gathered ints are never specialised (1 for int32 sources, 2 for int64): one
    # compiled kernel for every mix of dtypes
    @triton.jit(do_not_specialize=["ma", "mb", "mseq", "macc"])
    def _summary_kernel(hidden, stride_h, n_h, logits, stride_l, n_l, rows, rows_out, sums, absmax,
                        bmax, bsum, cand_val, cand_id, topk_p, topk_id, tickets, ia, ma, ib, mb, iseq, mseq, iacc,
                        macc, ints_out,
                        NODES, R, K, H, V, NB,
                        BLOCK_H: tl.constexpr, TOPK: tl.constexpr, BLOCK_V: tl.constexpr,
                        NB_P2: tl.constexpr, NC_P2: tl.constexpr, GATHER: tl.constexpr):
        """The whole summary in one launch. Program (r, j): chunk j of row r's hidden statistics for
        j < K, else logits block j - K; the last block of a row to finish (a ticket per row, taken with
        an acquire-release atomic, so the other blocks' writes are visible) computes the row's final
        top-k and resets the ticket for the next launch (graph replays included). With ``GATHER``, program
        (r, 0) also reads the verify's token ids at row r (``_gather_ints``). A padding row (-1) does nothing
        but mark itself: a layout's capacity (256 rows at 64 requests x 4 draft tokens) costs next to nothing
        when a launch uses 4 of them (computed in full, padding rows took 0.76 ms at Kimi-K2.5's vocabulary)."""
        r = tl.program_id(0)
        j = tl.program_id(1)
        if tl.load(rows + r) < 0:
            if j == 0:
                tl.store(rows_out + r, -1)
        elif j < K:
            _hidden_stats(hidden, stride_h, n_h, rows, rows_out, sums, absmax, r, j, R, K, H, BLOCK_H)
            if GATHER:
                if j == 0:
                    _gather_ints(ia, ma, ib, mb, iseq, mseq, iacc, macc, ints_out, rows, r, NODES)
        else:
            _logits_block(logits, stride_l, n_l, rows, bmax, bsum, cand_val, cand_id, r, j - K, V, NB, TOPK,
                          BLOCK_V)
            if tl.atomic_add(tickets + r, 1) == NB - 1:
                _logits_final(bmax, bsum, cand_val, cand_id, topk_p, topk_id, r, NB, TOPK, NB_P2, NC_P2)
                tl.atomic_xchg(tickets + r, 0)


class TritonPath:
    """Scratch and the one launch of a Summarizer layout. ``run`` returns False for
    inputs it does not take (rows not contiguous) and raises on failure; the Summarizer then runs the
    torch path (for that launch, or from then on)."""

    def __init__(self, *, max_rows: int, num_chunks: int, chunk_width: int, vocab_size: Optional[int],
                 topk: int, block: Optional[int], device: torch.device, gather: bool = False):
        self.max_rows, self.num_chunks, self.chunk_width = max_rows, num_chunks, chunk_width
        self.vocab_size, self.topk = vocab_size, topk
        self.hblock = min(pow2_at_least(chunk_width), 8192)
        # Warps per program of the three parts (tuned on an H200 by bench/gpu_summarize.py): the hidden-only
        # kernel uses "hidden"; the one-launch summary the most of the three.
        self.warps = {"hidden": max(1, min(16, self.hblock // 512)), "block": 4, "final": 4}
        self.block = None
        # the last launch, when it was direct: launches it again with the same inputs into another destination
        self.plan: Optional[Callable[[Outputs], None]] = None
        self._hidden = Launches(_hidden_stats_kernel, lambda: self.warps["hidden"])
        if vocab_size is None:
            return
        V, k, R = vocab_size, topk, max_rows
        tb = max(pow2_at_least(block or 2048), pow2_at_least(k))
        tb = min(tb, max(pow2_at_least(V), pow2_at_least(k)))
        while pow2_at_least(-(-V // tb) * k) > 16384:  # keep the final stage's candidates in registers
            tb *= 2
        self.block = tb
        self.nb = -(-V // tb)
        self.bmax = torch.zeros(R, self.nb, dtype=torch.float32, device=device)
        self.bsum = torch.zeros(R, self.nb, dtype=torch.float32, device=device)
        self.cval = torch.zeros(R, self.nb * k, dtype=torch.float32, device=device)
        self.cid = torch.zeros(R, self.nb * k, dtype=torch.int32, device=device)
        self.tickets = torch.zeros(R, dtype=torch.int32, device=device)  # blocks of each row done, this launch
        self._scratch = (self.bmax.data_ptr(), self.bsum.data_ptr(), self.cval.data_ptr(), self.cid.data_ptr())
        self._tickets = self.tickets.data_ptr()
        self._summary = Launches(_summary_kernel, lambda: max(self.warps.values()))

    def run(self, hidden: torch.Tensor, rows: torch.Tensor, logits: Optional[torch.Tensor], out: Outputs,
            ints: Optional[tuple] = None) -> bool:
        """Write rows, statistics and top-k of the selected rows into ``out`` (the device buffer's or a ring slot's
        outputs), and the verify's ``ints`` at them (``Summarizer.summarize``)."""
        self.plan = None
        if hidden.stride(1) != 1 or (logits is not None and logits.stride(1) != 1):
            return False
        R, K = self.max_rows, self.num_chunks
        sh, nh = hidden.stride(0), hidden.shape[0]
        hp, rp = hidden.data_ptr(), rows.data_ptr()
        if self.vocab_size is None:
            key = ((hidden.dtype, hp % 16 == 0), (rows.dtype, rp % 16 == 0), _int_key(sh), _int_key(nh))
            compiled = self._hidden.compiled(key)
            if compiled is None:
                v = out.views
                self._hidden.first((R, K), key, hidden, sh, nh, rows, v["rows"], v["sums"], v["absmax"], R, K,
                                   self.chunk_width, self.hblock)
            else:
                tail = (R, K, self.chunk_width, self.hblock)
                self.plan = Launches.planned(compiled, (R, K), hidden.device.index, (hp, sh, nh, rp),
                                             lambda o: (*o.head, *tail))
                self.plan(out)
            return True
        nb, k = self.nb, self.topk
        sl, nl, lp = logits.stride(0), logits.shape[0], logits.data_ptr()
        key = ((hidden.dtype, hp % 16 == 0), (logits.dtype, lp % 16 == 0), (rows.dtype, rp % 16 == 0), _int_key(sh),
               _int_key(nh), _int_key(sl), _int_key(nl))
        if ints is not None:  # each source as int32 words (its address), and the words per element
            *tensors, nodes = ints
            words = []
            for t in tensors:
                if t.dim() != 1 or t.stride(0) != 1 or t.dtype not in (torch.int32, torch.int64):
                    return False
                words += [t.data_ptr(), 2 if t.dtype == torch.int64 else 1]
            key += tuple((torch.int32, w % 16 == 0) for w in words[::2]) + (_int_key(nodes),)
        else:  # unused pointers (GATHER is off): any address of this device
            words, nodes = [rp, 1] * 4, 1
        grid = (R, K + nb)
        compiled = self._summary.compiled(key)
        if compiled is None:
            tensors = [t.view(torch.int32) for t in ints[:4]] if ints is not None else [rows] * 4
            words = [x for t, m in zip(tensors, words[1::2]) for x in (t, m)]
            v = out.views
            self._summary.first(grid, key, hidden, sh, nh, logits, sl, nl, rows, v["rows"], v["sums"],
                                v["absmax"], self.bmax, self.bsum, self.cval, self.cid, v["topk_p"], v["topk_id"],
                                self.tickets, *words, v.get("ints", rows), nodes, R, K, self.chunk_width,
                                self.vocab_size, nb, self.hblock, k, self.block, pow2_at_least(nb),
                                pow2_at_least(nb * k), ints is not None)
        else:
            scratch, middle = self._scratch, (self._tickets, *words)
            tail = (nodes, R, K, self.chunk_width, self.vocab_size, nb, self.hblock, k, self.block, pow2_at_least(nb),
                    pow2_at_least(nb * k), ints is not None)
            self.plan = Launches.planned(
                compiled, grid, hidden.device.index, (hp, sh, nh, lp, sl, nl, rp),
                lambda o: (*o.head, *scratch, *o.topk, *middle, rp if o.ints is None else o.ints, *tail))
            self.plan(out)
        return True
