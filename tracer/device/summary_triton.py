"""The Summarizer's fast path on CUDA: one Triton launch per summary, every input byte read once, and its
scratch. Each selected row is split over many programs (slices of its hidden chunks: fp32 sums, counts and
absmax; chunks of its logits: max, exp-sum and top-k candidates, found by ranking the maxima of small column
groups rather than the columns), and the last program of the row to finish merges them: the row's statistics,
softmax denominator and top-k. A launch through Triton's ``JITFunction`` costs ~30 µs of host time (argument
binding and specialisation); :class:`Launches` keeps each compiled kernel and launches it directly after the
first time, which costs a few µs."""

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


class WordCopy:
    """Copies of one device buffer (bytes, a multiple of 8; the same buffer at every call) into pinned host memory
    mapped for the device, by a small kernel launched directly after the first time (:class:`Launches`): a few µs
    of host time, where ``Tensor.copy_`` into pinned memory costs a ``cudaMemcpyAsync`` and an event of PyTorch's
    pinned-memory allocator, and a copy engine's transfer of a few KB takes several µs on the stream."""

    BLOCK = 1024

    def __init__(self, src: torch.Tensor):
        self.src = src.view(torch.int64)
        self.n = self.src.numel()
        self.grid = (-(-self.n // self.BLOCK), 1)
        self._launches = Launches(_copy_words, lambda: 4)
        self._plans: dict = {}  # the destination's 16-byte alignment -> its direct launch

    def __call__(self, dst: torch.Tensor, address: int) -> None:
        """Into host tensor ``dst`` (at least the buffer's bytes), which kernels reach at ``address``."""
        key = (address % 16 == 0,)
        plan = self._plans.get(key)
        if plan is not None and not hooked():
            plan(address)
            return
        compiled = self._launches.compiled(key)
        if compiled is None:
            self._launches.first(self.grid, key, self.src, dst.view(torch.int64), self.n, self.BLOCK)
        else:
            n, block = self.n, self.BLOCK
            plan = self._plans[key] = Launches.planned(compiled, self.grid, self.src.device.index,
                                                       (self.src.data_ptr(),), lambda a: (a, n, block))
            plan(address)


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

    @triton.jit
    def _copy_words(src, dst, n, BLOCK: tl.constexpr):
        """Words [p * BLOCK, (p + 1) * BLOCK) of ``src`` into ``dst``, for program p."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    _NONE = tl.constexpr(-0x7FFFFFFFFFFFFFFF)  # below every order key: an entry already taken

    @triton.jit
    def _order_keys(x, ids):
        """int64 keys of float32 values ``x`` at columns ``ids`` whose integer order is (value, then smaller id):
        the order torch.topk breaks ties in; distinct ids give distinct keys. One max is then a top-1 with its id."""
        b = x.to(tl.int32, bitcast=True)
        b = tl.maximum(b ^ ((b >> 31) & 0x7FFFFFFF), -0x7FFFFFFF)  # monotone in the value (NaN above +inf)
        return (b.to(tl.int64) << 32) | (0x7FFFFFFF - ids).to(tl.int64)

    @triton.jit
    def _key_value(key):
        b = (key >> 32).to(tl.int32)
        return (b ^ ((b >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)

    @triton.jit
    def _key_id(key):
        return 0x7FFFFFFF - key.to(tl.int32)

    @triton.jit
    def _clock():
        """The SM's cycle counter (a program's stages are timed on it: ``STAMPS``)."""
        return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)

    @triton.jit
    def _hidden_part(hidden, stride_row, n_rows, rows, hpart, r, p, R, P, H, S, HS, BLOCK_HS: tl.constexpr):
        """Part p of selected row r (chunk p // S, its slice p % S of width HS) in one read, fp32: sum, NaN count,
        non-finite count, sum of squares, absmax ignoring NaN, into plane q of ``hpart [5, R, P]``."""
        row = tl.load(rows + r)
        row = tl.minimum(tl.maximum(row, 0), n_rows - 1)
        lo = (p % S) * HS
        offs = lo + tl.arange(0, BLOCK_HS)
        x = tl.load(hidden + row * stride_row + (p // S) * H + offs, mask=(offs < H) & (offs < lo + HS),
                    other=0.0).to(tl.float32)
        is_nan = x != x
        ax = tl.abs(x)
        nan = tl.sum(is_nan.to(tl.float32), axis=0)
        at = r * P + p
        plane = R * P
        tl.store(hpart + at, tl.sum(x, axis=0))
        tl.store(hpart + plane + at, nan)
        tl.store(hpart + 2 * plane + at, nan + tl.sum((ax == float("inf")).to(tl.float32), axis=0))
        tl.store(hpart + 3 * plane + at, tl.sum(x * x, axis=0))
        tl.store(hpart + 4 * plane + at, tl.max(tl.where(is_nan, 0.0, ax), axis=0))

    @triton.jit
    def _logits_chunk(logits, stride_row, n_rows, rows, bmax, bsum, keys_out, r, b, V, NB, st,
                      TOPK: tl.constexpr, TOPK_P2: tl.constexpr, GROUPS: tl.constexpr, GROUP: tl.constexpr,
                      STAMPS: tl.constexpr):
        """Chunk b of selected row r (GROUPS groups of GROUP columns; its logits row ``rows[r]``, any float dtype,
        fp32 from the load on), read once: its max, sum of exp(x - max) and the order keys of its top TOPK. Those
        lie in the TOPK_P2 groups whose maxima rank highest (a value in any other group is outranked by the maxima
        of those), so only they are read again, from cache, and ranked. ``STAMPS``: the cycle counter after the
        read with its softmax partials, the groups' ranking and the columns' into ``st[2:5]``."""
        row = tl.load(rows + r)
        row = tl.minimum(tl.maximum(row, 0), n_rows - 1)
        base = logits + row * stride_row
        start = b * (GROUPS * GROUP)
        g = tl.arange(0, GROUPS)
        e = tl.arange(0, GROUP)
        cols = start + g[:, None] * GROUP + e[None, :]
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        gmax = tl.max(x, axis=1)
        m = tl.max(gmax, axis=0)
        s = tl.sum(tl.sum(tl.exp(x - m), axis=1), axis=0)
        tl.store(bmax + r * NB + b, m)
        tl.store(bsum + r * NB + b, tl.where(m == float("-inf"), 0.0, s))
        if STAMPS:
            tl.store(st + 2, _clock())
        gkeys = _order_keys(gmax, g)
        k = tl.arange(0, TOPK_P2)
        picked = tl.zeros([TOPK_P2], dtype=tl.int32)
        for j in tl.static_range(TOPK_P2):
            best = tl.max(gkeys, axis=0)
            picked = tl.where(k == j, _key_id(best), picked)
            gkeys = tl.where(gkeys == best, _NONE, gkeys)
        if STAMPS:
            tl.store(st + 3, _clock())
        cols = start + picked[:, None] * GROUP + e[None, :]
        keys = _order_keys(tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32), cols)
        out = keys_out + (r * NB + b) * TOPK
        for j in tl.static_range(TOPK):
            best = tl.max(tl.max(keys, axis=1), axis=0)
            tl.store(out + j, best)
            keys = tl.where(keys == best, _NONE, keys)
        if STAMPS:
            tl.store(st + 4, _clock())

    @triton.jit
    def _row_final(hpart, sums, absmax, bmax, bsum, keys, topk_p, topk_id, r, R, K, S, NB, TOPK: tl.constexpr,
                   K_P2: tl.constexpr, S_P2: tl.constexpr, NB_P2: tl.constexpr, NC_P2: tl.constexpr):
        """Row r from its parts: each chunk's statistics (over its slices), the logits max and softmax denominator
        (over the chunks'), the top TOPK of the chunks' candidates and their probabilities."""
        c = tl.arange(0, K_P2)
        s = tl.arange(0, S_P2)
        ok = (c[:, None] < K) & (s[None, :] < S)
        P = K * S
        at = hpart + r * P + c[:, None] * S + s[None, :]
        plane = R * P
        nan = tl.sum(tl.load(at + plane, mask=ok, other=0.0), axis=1)
        o = sums + r * K + c
        oplane = R * K
        okc = c < K
        tl.store(o, tl.sum(tl.load(at, mask=ok, other=0.0), axis=1), mask=okc)
        tl.store(o + oplane, nan, mask=okc)
        tl.store(o + 2 * oplane, tl.sum(tl.load(at + 2 * plane, mask=ok, other=0.0), axis=1), mask=okc)
        tl.store(o + 3 * oplane, tl.sum(tl.load(at + 3 * plane, mask=ok, other=0.0), axis=1), mask=okc)
        amax = tl.max(tl.load(at + 4 * plane, mask=ok, other=0.0), axis=1)
        tl.store(absmax + r * K + c, tl.where(nan > 0, float("nan"), amax), mask=okc)
        ob = tl.arange(0, NB_P2)
        bm = tl.load(bmax + r * NB + ob, mask=ob < NB, other=float("-inf"))
        bs = tl.load(bsum + r * NB + ob, mask=ob < NB, other=0.0)
        m = tl.max(bm, axis=0)
        denom = tl.sum(tl.where(bm > float("-inf"), bs * tl.exp(bm - m), 0.0), axis=0)
        oc = tl.arange(0, NC_P2)
        ck = tl.load(keys + r * NB * TOPK + oc, mask=oc < NB * TOPK, other=_NONE)
        for j in tl.static_range(TOPK):
            best = tl.max(ck, axis=0)
            tl.store(topk_id + r * TOPK + j, _key_id(best).to(tl.int64))
            tl.store(topk_p + r * TOPK + j, tl.exp(_key_value(best) - m) / denom)
            ck = tl.where(ck == best, _NONE, ck)

    # the int32 word counts of the gathered ints are never specialised (1 for int32 sources, 2 for int64): one
    # compiled kernel for every mix of dtypes
    @triton.jit(do_not_specialize=["ma", "mb", "mseq", "macc"])
    def _summary_kernel(hidden, stride_h, n_h, logits, stride_l, n_l, rows, logit_rows, rows_out, sums, absmax,
                        hpart, bmax, bsum, keys, topk_p, topk_id, tickets, ia, ma, ib, mb, iseq, mseq, iacc, macc,
                        ints_out, stamps, NODES, R, K, H, S, HS, V, NB,
                        BLOCK_HS: tl.constexpr, TOPK: tl.constexpr, TOPK_P2: tl.constexpr, GROUPS: tl.constexpr,
                        GROUP: tl.constexpr, K_P2: tl.constexpr, S_P2: tl.constexpr, NB_P2: tl.constexpr,
                        NC_P2: tl.constexpr, GATHER: tl.constexpr, STAMPS: tl.constexpr):
        """The whole summary in one launch, every input byte read once. Program (j, r) of selected row r: for
        j < K * S, slice j of its hidden chunks (``_hidden_part``), else logits chunk j - K * S of its logits row
        ``logit_rows[r]`` (``_logits_chunk``). The last program of a row to finish (a ticket per row, taken with an
        acquire-release atomic, so the others' partial results are visible) merges them (``_row_final``) and resets
        the ticket for the next launch (graph replays included). Program (0, r) also copies rows[r] out and, with
        ``GATHER``, reads the verify's token ids at row r (``_gather_ints``). A padding row (-1) does nothing but
        mark itself: a layout's capacity (256 rows at 64 requests x 4 draft tokens) costs next to nothing when a
        launch uses 4 of them. ``STAMPS`` (a bench's profile, ``bench/gpu_summary_stages.py``): program (j, r) writes
        ``stamps[r, j, :]``: the nanosecond timer at its start, then the cycle counter at its start, after its
        part's stages (a hidden slice: one, written three times; a logits chunk: three), after its ticket and (the
        row's merger only) after the merge, then the timer and the counter at its end."""
        j = tl.program_id(0)
        r = tl.program_id(1)
        P = K * S
        st = stamps + (r * (P + NB) + j) * 9
        if STAMPS:
            tl.store(st, tl.extra.cuda.globaltimer())
            tl.store(st + 1, _clock())
        row = tl.load(rows + r)
        if row < 0:
            if j == 0:
                tl.store(rows_out + r, -1)
        else:
            if j < P:
                _hidden_part(hidden, stride_h, n_h, rows, hpart, r, j, R, P, H, S, HS, BLOCK_HS)
                if STAMPS:
                    now = _clock()
                    tl.store(st + 2, now)
                    tl.store(st + 3, now)
                    tl.store(st + 4, now)
                if j == 0:
                    tl.store(rows_out + r, row)
                    if GATHER:
                        _gather_ints(ia, ma, ib, mb, iseq, mseq, iacc, macc, ints_out, rows, r, NODES)
            else:
                _logits_chunk(logits, stride_l, n_l, logit_rows, bmax, bsum, keys, r, j - P, V, NB, st, TOPK, TOPK_P2,
                              GROUPS, GROUP, STAMPS)
            ticket = tl.atomic_add(tickets + r, 1)
            if STAMPS:
                tl.store(st + 5, _clock())
            if ticket == P + NB - 1:
                _row_final(hpart, sums, absmax, bmax, bsum, keys, topk_p, topk_id, r, R, K, S, NB, TOPK, K_P2, S_P2,
                           NB_P2, NC_P2)
                tl.atomic_xchg(tickets + r, 0)
                if STAMPS:
                    tl.store(st + 6, _clock())
            if STAMPS:
                tl.store(st + 7, tl.extra.cuda.globaltimer())
                tl.store(st + 8, _clock())

class TritonPath:
    """Scratch and the one launch of a Summarizer layout. ``run`` returns False for inputs it does not take (a
    hidden or logits row, or a row index, not contiguous) and raises on failure; the Summarizer then runs the
    torch path (for that launch, or from then on)."""

    def __init__(self, *, max_rows: int, num_chunks: int, chunk_width: int, vocab_size: Optional[int],
                 topk: int, block: Optional[int], device: torch.device, gather: bool = False):
        self.max_rows, self.num_chunks, self.chunk_width = max_rows, num_chunks, chunk_width
        self.vocab_size, self.topk = vocab_size, topk
        self.hblock = min(pow2_at_least(chunk_width), 8192)
        # Tuned on an H200 by bench/gpu_summarize.py, which tries others: warps per program of the hidden-only
        # kernel ("hidden_warps") and of the summary kernel ("warps"); the summary's group width ("group": the
        # columns whose max ranks them within a logits chunk) and widest hidden slice read by one program
        # ("hidden_slice", at least 1024; None: 2048 per warp, at most 8192). "stamps": None in service; a bench's
        # int64 buffer of ``stamp_shape()`` makes the summary kernel time its stages into it (``_summary_kernel``).
        self.tuning = {"hidden_warps": max(1, min(16, self.hblock // 512)), "warps": 4, "group": 16,
                       "hidden_slice": None, "stamps": None}
        self.block = None
        # the last launch, when it was direct: launches it again with the same inputs into another destination
        self.plan: Optional[Callable[[Outputs], None]] = None
        self._hidden = Launches(_hidden_stats_kernel, lambda: self.tuning["hidden_warps"])
        self._copy: Optional[WordCopy] = None  # the Summarizer's device buffer into ring slots, made at first use
        if vocab_size is None:
            return
        V, k, R, K = vocab_size, topk, max_rows, num_chunks
        tb = max(pow2_at_least(block or 8192), pow2_at_least(k))
        tb = min(tb, max(pow2_at_least(V), pow2_at_least(k)))
        while pow2_at_least(-(-V // tb) * k) > 4096:  # keep the merge's candidates in registers
            tb *= 2
        self.block = tb  # the logits chunk of one program
        self.nb = -(-V // tb)
        slices = -(-chunk_width // 1024)  # the most any hidden_slice gives
        self.hpart = torch.zeros(5, R, K * slices, dtype=torch.float32, device=device)
        self.bmax = torch.zeros(R, self.nb, dtype=torch.float32, device=device)
        self.bsum = torch.zeros(R, self.nb, dtype=torch.float32, device=device)
        self.keys = torch.zeros(R, self.nb * k, dtype=torch.int64, device=device)
        self.tickets = torch.zeros(R, dtype=torch.int32, device=device)  # programs of each row done, this launch
        self._scratch = (self.hpart.data_ptr(), self.bmax.data_ptr(), self.bsum.data_ptr(), self.keys.data_ptr())
        self._tickets = self.tickets.data_ptr()
        self._summary = Launches(_summary_kernel, lambda: self.tuning["warps"])

    def geometry(self) -> tuple:
        """``(S, HS, constexprs)`` of the summary kernel under the current tuning: hidden slices per chunk and
        their width, then BLOCK_HS, TOPK, TOPK_P2, GROUPS, GROUP, K_P2, S_P2, NB_P2, NC_P2."""
        H, k, tb, nb = self.chunk_width, self.topk, self.block, self.nb
        slice_ = self.tuning["hidden_slice"] or min(8192, 2048 * self.tuning["warps"])
        S = -(-H // max(1024, slice_))
        HS = -(-H // S)
        kp2 = pow2_at_least(k)
        group = max(1, min(pow2_at_least(self.tuning["group"]), tb // kp2))
        return S, HS, (pow2_at_least(HS), k, kp2, tb // group, group, pow2_at_least(self.num_chunks),
                       pow2_at_least(S), pow2_at_least(nb), pow2_at_least(nb * k))

    def stamp_shape(self) -> tuple:
        """The shape of a ``tuning["stamps"]`` buffer: a slot of 9 per program (selected row, program of the row)."""
        S = self.geometry()[0]
        return self.max_rows, self.num_chunks * S + self.nb, 9

    def copy(self, buf: torch.Tensor, out: Outputs) -> None:
        """The device buffer ``buf`` (bytes, a multiple of 8; the same at every call) into the ring slot of ``out``,
        by a kernel: a copy engine's transfer of a few KB takes several µs on the stream, a kernel about two. The
        slot's first field (rows) starts the slot: the kernel writes all of it from there."""
        if self._copy is None:
            self._copy = WordCopy(buf)
        self._copy(out.views["rows"], out.head[0])

    def run(self, hidden: torch.Tensor, rows: torch.Tensor, logits: Optional[torch.Tensor], out: Outputs,
            ints: Optional[tuple] = None, logit_rows: Optional[torch.Tensor] = None) -> bool:
        """Write rows, statistics and top-k of the selected rows into ``out`` (the device buffer's or a ring slot's
        outputs), and the verify's ``ints`` at them (``Summarizer.summarize``: ``logit_rows``, the logits' row of
        each selected row, default ``rows``)."""
        self.plan = None
        lrows = rows if logit_rows is None else logit_rows
        if hidden.stride(1) != 1 or rows.stride(0) != 1 or lrows.stride(0) != 1 \
                or (logits is not None and logits.stride(1) != 1):
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
        nb, stamps = self.nb, self.tuning["stamps"]
        S, HS, consts = self.geometry()
        sl, nl, lp, lrp = logits.stride(0), logits.shape[0], logits.data_ptr(), lrows.data_ptr()
        key = ((hidden.dtype, hp % 16 == 0), (logits.dtype, lp % 16 == 0), (rows.dtype, rp % 16 == 0),
               (lrows.dtype, lrp % 16 == 0), _int_key(sh), _int_key(nh), _int_key(sl), _int_key(nl), consts,
               stamps is not None)
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
        grid = (K * S + nb, R)
        sizes = (nodes, R, K, self.chunk_width, S, HS, self.vocab_size, nb, *consts, ints is not None,
                 stamps is not None)
        compiled = self._summary.compiled(key)
        if compiled is None:
            tensors = [t.view(torch.int32) for t in ints[:4]] if ints is not None else [rows] * 4
            words = [x for t, m in zip(tensors, words[1::2]) for x in (t, m)]
            v = out.views
            self._summary.first(grid, key, hidden, sh, nh, logits, sl, nl, rows, lrows, v["rows"], v["sums"],
                                v["absmax"], self.hpart, self.bmax, self.bsum, self.keys, v["topk_p"], v["topk_id"],
                                self.tickets, *words, v.get("ints", rows), rows if stamps is None else stamps, *sizes)
        else:
            scratch, middle = self._scratch, (self._tickets, *words)
            sp = rp if stamps is None else stamps.data_ptr()
            self.plan = Launches.planned(
                compiled, grid, hidden.device.index, (hp, sh, nh, lp, sl, nl, rp, lrp),
                lambda o: (*o.head, *scratch, *o.topk, *middle, rp if o.ints is None else o.ints, sp, *sizes))
            self.plan(out)
        return True
