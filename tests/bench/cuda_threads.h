// Just enough of CUDA to run bench/topk_softmax.cu on a CPU, one OS thread per CUDA thread (tests only).
// A block's threads run at once and meet at std::barrier (__syncthreads, a warp's __syncwarp and shuffles); blocks
// run one after the other, so a kernel's __shared__ arrays are function statics, shared by the block's threads.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__
#define __launch_bounds__(n)
#define __shared__ static

struct dim3s { int x = 0, y = 0, z = 0; };
inline thread_local dim3s threadIdx, blockIdx;
struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };

struct Block {  // the running block's barriers and each warp's shuffle slots
  std::unique_ptr<std::barrier<>> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<uint32_t> slots;
};
inline Block* block_now = nullptr;

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline void __syncthreads() { block_now->all->arrive_and_wait(); }
inline void __syncwarp() { block_now->warps[threadIdx.x / 32]->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return *p; }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
using std::min;

template <typename T> inline T __shfl_xor_sync(unsigned, T v, int offset) {
  static_assert(sizeof(T) == 4);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  block_now->slots[warp * 32 + lane] = bits;
  __syncwarp();
  bits = block_now->slots[warp * 32 + (lane ^ offset)];
  __syncwarp();
  std::memcpy(&v, &bits, 4);
  return v;
}

// Runs kernel(args...) over grid (gx, gy) of blocks of `threads` threads.
template <typename F> void launch(int gx, int gy, int threads, F kernel) {
  for (int y = 0; y < gy; ++y)
    for (int x = 0; x < gx; ++x) {
      Block b{std::make_unique<std::barrier<>>(threads), {}, std::vector<uint32_t>(threads)};
      for (int w = 0; w < threads / 32; ++w) b.warps.push_back(std::make_unique<std::barrier<>>(32));
      block_now = &b;
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
          threadIdx = {t, 0, 0};
          blockIdx = {x, y, 0};
          kernel();
        });
      for (auto& th : pool) th.join();
    }
}
