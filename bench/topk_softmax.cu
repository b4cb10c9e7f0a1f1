// A summary of selected rows in one launch, by warp shuffles: the CUDA C++ prototype of issue 33 item 1 (option a),
// compiled at run time by NVRTC (torch.cuda._compile_kernel) and timed by bench/gpu_topk_nvrtc.py: the softmax top-k
// of each row's logits and, when asked (kc > 0), the statistics of its bf16 hidden row's kc chunks, as the tracer's
// Triton summary kernel computes both (the verify's token ids, which that kernel also gathers, are left out).
//
// Grid (kc * slices + C, R): block (x, y) works for row slot y (rows[y] < 0: an unused slot, the block returns at
// once). Blocks x < kc * slices each read one slice of one hidden chunk (sum, NaN count, non-finite count, sum of
// squares, absmax without NaN, in float32); the others read logits chunk c = x - kc * slices. For those, each thread
// keeps a sorted top-K of the elements it reads and their online softmax statistics (max, sum of exp); a warp merges
// its lanes' lists in K rounds of a 5-step shuffle argmax, the block its warps' in K more. Every block writes its
// partials; the last block of the row to arrive (a ticket, reset for the next launch) merges them: the row's K ids,
// best first (ties: the lower id), with their softmax probabilities, and each hidden chunk's statistics. NaN logits
// are left out of both the top-k and the softmax (unlike torch.topk, which ranks them first).

#define K 8
#define THREADS 256
#define WARPS (THREADS / 32)
#define NEG_INF __int_as_float(0xff800000)
#define NO_ID 0x7fffffff

__device__ __forceinline__ bool better(float av, int ai, float bv, int bi) {
  return av > bv || (av == bv && ai < bi);
}

// x into the sorted (best first) list v/id, if it beats its last entry
__device__ __forceinline__ void push(float (&v)[K], int (&id)[K], float x, int xi) {
  if (!better(x, xi, v[K - 1], id[K - 1])) return;
  v[K - 1] = x;
  id[K - 1] = xi;
#pragma unroll
  for (int j = K - 1; j > 0; --j) {
    if (better(v[j], id[j], v[j - 1], id[j - 1])) {
      float tv = v[j]; v[j] = v[j - 1]; v[j - 1] = tv;
      int ti = id[j]; id[j] = id[j - 1]; id[j - 1] = ti;
    }
  }
}

// online softmax statistics: m the max so far, s the sum of exp(x - m)
__device__ __forceinline__ void online(float& m, float& s, float x) {
  if (!(x > NEG_INF)) return;  // -inf adds nothing; NaN is left out
  if (x > m) { s = s * expf(m - x) + 1.f; m = x; }
  else s += expf(x - m);
}

__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
  if (!(m2 > NEG_INF)) return;
  if (!(m > NEG_INF)) { m = m2; s = s2; return; }
  float M = fmaxf(m, m2);
  s = s * expf(m - M) + s2 * expf(m2 - M);
  m = M;
}

// The warp's best K of its lanes' sorted lists, into every lane's (wv, wi) (lane j's j-th best is in wv[j]).
__device__ __forceinline__ void warp_topk(float (&v)[K], int (&id)[K], float (&wv)[K], int (&wi)[K]) {
#pragma unroll
  for (int r = 0; r < K; ++r) {
    float bv = v[0];
    int bi = id[0];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffff, bv, o);
      int oi = __shfl_xor_sync(0xffffffff, bi, o);
      if (better(ov, oi, bv, bi)) { bv = ov; bi = oi; }
    }
    wv[r] = bv;
    wi[r] = bi;
    if (id[0] == bi && bi != NO_ID) {  // this lane's head won: pop it
#pragma unroll
      for (int j = 0; j < K - 1; ++j) { v[j] = v[j + 1]; id[j] = id[j + 1]; }
      v[K - 1] = NEG_INF;
      id[K - 1] = NO_ID;
    }
  }
}

__device__ __forceinline__ void warp_stats(float& m, float& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffff, m, o);
    float s2 = __shfl_xor_sync(0xffffffff, s, o);
    combine(m, s, m2, s2);
  }
}

// The block's best K and statistics from each thread's list and statistics: into (bv, bi, bm, bs) of thread 0..
__device__ void block_merge(float (&v)[K], int (&id)[K], float m, float s, float* sv, int* si, float* sm, float* ss) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float wv[K];
  int wi[K];
  warp_topk(v, id, wv, wi);
  warp_stats(m, s);
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < K; ++j) { sv[warp * K + j] = wv[j]; si[warp * K + j] = wi[j]; }
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {  // WARPS * K candidates over 32 lanes
#pragma unroll
    for (int j = 0; j < K; ++j) { v[j] = NEG_INF; id[j] = NO_ID; }
    for (int c = lane; c < WARPS * K; c += 32) push(v, id, sv[c], si[c]);
    float m0 = NEG_INF, s0 = 0.f;
    if (lane < WARPS) { m0 = sm[lane]; s0 = ss[lane]; }
    warp_stats(m0, s0);
    warp_topk(v, id, wv, wi);
    __syncwarp();  // every lane's reads of the lists above before lane 0 overwrites them
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < K; ++j) { sv[j] = wv[j]; si[j] = wi[j]; }
      sm[0] = m0;
      ss[0] = s0;
    }
    __syncwarp();  // lanes 0..K-1 read the block's list next
  }
}

// One slice of a bf16 hidden chunk: the block's sum, NaN count, non-finite count, sum of squares and absmax
// (NaN left out) into part[0..4]
__device__ void hidden_slice(const unsigned short* r, int lo, int hi, float* part, float* sh) {
  float sum = 0.f, nan = 0.f, nonfinite = 0.f, sq = 0.f, amax = 0.f;
  for (int i = lo + threadIdx.x * 8; i < hi; i += THREADS * 8) {  // 16-byte loads of 8 bf16 (slices of 8s)
    uint4 q = __ldcs(reinterpret_cast<const uint4*>(r + i));
    unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float x = __uint_as_float(j & 1 ? w[j / 2] & 0xffff0000u : w[j / 2] << 16);
      bool is_nan = x != x, is_inf = fabsf(x) == __int_as_float(0x7f800000);
      sum += x; sq += x * x;
      nan += is_nan; nonfinite += is_nan || is_inf;
      if (!is_nan) amax = fmaxf(amax, fabsf(x));
    }
  }
  float vals[5] = {sum, nan, nonfinite, sq, amax};
#pragma unroll
  for (int k = 0; k < 5; ++k)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float other = __shfl_xor_sync(0xffffffff, vals[k], o);
      vals[k] = k == 4 ? fmaxf(vals[k], other) : vals[k] + other;
    }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0)
#pragma unroll
    for (int k = 0; k < 5; ++k) sh[warp * 5 + k] = vals[k];
  __syncthreads();
  if (threadIdx.x < 5) {
    float t = 0.f;  // (absmax is >= 0)
    for (int w = 0; w < WARPS; ++w) t = threadIdx.x == 4 ? fmaxf(t, sh[w * 5 + 4]) : t + sh[w * 5 + threadIdx.x];
    part[threadIdx.x] = t;
  }
}

template <typename LOAD>
__device__ void topk_softmax(LOAD load, long stride, const long* rows, int vocab, int chunk, int chunks,
                             float* part_v, int* part_i, float* part_m, float* part_s, int* tickets,
                             float* out_p, long* out_id, const unsigned short* hidden, int hstride, int hwidth,
                             int kc, int slices, float* hpart, float* hstats) {
  __shared__ float sv[WARPS * K];
  __shared__ int si[WARPS * K];
  __shared__ float sm[WARPS], ss[WARPS];
  __shared__ float sh[WARPS * 5];
  __shared__ bool last;
  const int hb = kc * slices, y = blockIdx.y;
  const long row = rows[y];
  if (row < 0) return;
  float v[K];
  int id[K];
  float m = NEG_INF, s = 0.f;
  if (blockIdx.x < hb) {  // a slice of a hidden chunk
    const int p = blockIdx.x, width = (hwidth / slices + 7) / 8 * 8, lo = (p % slices) * width;
    hidden_slice(hidden + row * hstride + (long)(p / slices) * hwidth, lo, min(lo + width, hwidth),
                 hpart + ((long)y * hb + p) * 5, sh);
  } else {  // a logits chunk
    const int c = blockIdx.x - hb;
#pragma unroll
    for (int j = 0; j < K; ++j) { v[j] = NEG_INF; id[j] = NO_ID; }
    const int lo = c * chunk, hi = min(lo + chunk, vocab);
    load(row * stride, lo, hi, v, id, m, s);
    block_merge(v, id, m, s, sv, si, sm, ss);
    const long slot = (long)y * chunks + c;
    if (threadIdx.x < K) { part_v[slot * K + threadIdx.x] = sv[threadIdx.x]; part_i[slot * K + threadIdx.x] = si[threadIdx.x]; }
    if (threadIdx.x == 0) { part_m[slot] = sm[0]; part_s[slot] = ss[0]; }
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(&tickets[y], 1) == hb + chunks - 1;
    if (last) tickets[y] = 0;  // for the next launch (a graph replays this one)
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int q = threadIdx.x; q < kc * 5; q += THREADS) {  // each hidden chunk's statistics over its slices
    const int chunk_of = q / 5, k = q % 5;
    float t = 0.f;
    for (int sl = 0; sl < slices; ++sl) {
      const float x = __ldcg(hpart + ((long)y * hb + chunk_of * slices + sl) * 5 + k);
      t = k == 4 ? fmaxf(t, x) : t + x;
    }
    hstats[((long)y * kc + chunk_of) * 5 + k] = t;
  }
#pragma unroll
  for (int j = 0; j < K; ++j) { v[j] = NEG_INF; id[j] = NO_ID; }
  m = NEG_INF;
  s = 0.f;
  const long base = (long)y * chunks;
  for (int p = threadIdx.x; p < chunks * K; p += THREADS)
    push(v, id, __ldcg(part_v + base * K + p), __ldcg(part_i + base * K + p));
  for (int p = threadIdx.x; p < chunks; p += THREADS) combine(m, s, __ldcg(part_m + base + p), __ldcg(part_s + base + p));
  __syncthreads();  // the block's shared lists are reused
  block_merge(v, id, m, s, sv, si, sm, ss);
  if (threadIdx.x < K) {
    const float M = sm[0], S = ss[0];
    const int i = si[threadIdx.x];
    out_id[(long)y * K + threadIdx.x] = i == NO_ID ? -1 : i;
    out_p[(long)y * K + threadIdx.x] = i == NO_ID ? 0.f : expf(sv[threadIdx.x] - M) / S;
  }
}

struct LoadF32 {
  const float* p;
  __device__ void operator()(long at, int lo, int hi, float (&v)[K], int (&id)[K], float& m, float& s) const {
    const float* r = p + at;
    int i = lo + threadIdx.x * 4;
    for (; i + 3 < hi; i += THREADS * 4) {  // 16-byte loads (the row and the chunk start 16-byte aligned)
      float4 q = __ldcs(reinterpret_cast<const float4*>(r + i));
      push(v, id, q.x, i); online(m, s, q.x);
      push(v, id, q.y, i + 1); online(m, s, q.y);
      push(v, id, q.z, i + 2); online(m, s, q.z);
      push(v, id, q.w, i + 3); online(m, s, q.w);
    }
    for (; i < hi; ++i) { float x = r[i]; push(v, id, x, i); online(m, s, x); }  // a tail of under 4
  }
};

struct LoadBF16 {
  const unsigned short* p;
  __device__ void operator()(long at, int lo, int hi, float (&v)[K], int (&id)[K], float& m, float& s) const {
    const unsigned short* r = p + at;
    int i = lo + threadIdx.x * 8;
    for (; i + 7 < hi; i += THREADS * 8) {  // 16-byte loads of 8 bf16
      uint4 q = __ldcs(reinterpret_cast<const uint4*>(r + i));
      unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float a = __uint_as_float(w[j] << 16), b = __uint_as_float(w[j] & 0xffff0000u);
        push(v, id, a, i + 2 * j); online(m, s, a);
        push(v, id, b, i + 2 * j + 1); online(m, s, b);
      }
    }
    for (; i < hi; ++i) { float x = __uint_as_float(((unsigned)r[i]) << 16); push(v, id, x, i); online(m, s, x); }
  }
};

// hidden: bf16 rows of kc chunks of hwidth (hstride apart), each chunk read in `slices` blocks; kc 0: no hidden
// (its pointers then unused). hpart [R, kc * slices, 5] and hstats [R, kc, 5]: sum, NaN, non-finite, sum of squares,
// absmax.
extern "C" __global__ void __launch_bounds__(THREADS) topk_softmax_f32(
    const float* logits, int stride, const long* rows, int vocab, int chunk, int chunks, float* part_v, int* part_i,
    float* part_m, float* part_s, int* tickets, float* out_p, long* out_id, const unsigned short* hidden, int hstride,
    int hwidth, int kc, int slices, float* hpart, float* hstats) {
  topk_softmax(LoadF32{logits}, stride, rows, vocab, chunk, chunks, part_v, part_i, part_m, part_s, tickets, out_p,
               out_id, hidden, hstride, hwidth, kc, slices, hpart, hstats);
}

extern "C" __global__ void __launch_bounds__(THREADS) topk_softmax_bf16(
    const unsigned short* logits, int stride, const long* rows, int vocab, int chunk, int chunks, float* part_v,
    int* part_i, float* part_m, float* part_s, int* tickets, float* out_p, long* out_id, const unsigned short* hidden,
    int hstride, int hwidth, int kc, int slices, float* hpart, float* hstats) {
  topk_softmax(LoadBF16{logits}, stride, rows, vocab, chunk, chunks, part_v, part_i, part_m, part_s, tickets, out_p,
               out_id, hidden, hstride, hwidth, kc, slices, hpart, hstats);
}
