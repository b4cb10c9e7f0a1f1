// bench/topk_softmax.cu run on a CPU (cuda_threads.h), for tests/bench/test_topk_softmax_kernel.py:
//   topk_softmax_cpu f32|bf16 LOGITS STRIDE VOCAB CHUNK LAUNCHES OUT HIDDEN HSTRIDE HWIDTH KC SLICES ROW...
// LOGITS holds the raw logits rows (float32, or bf16 as uint16), HIDDEN the bf16 hidden rows (KC 0: none, "-");
// OUT gets K float32 probabilities then K int64 ids per row slot, then the KC x 5 hidden statistics per slot, after
// LAUNCHES launches (the row tickets must reset themselves for the next one).
#include "cuda_threads.h"
#include "../../bench/topk_softmax.cu"
#include <cstdio>
#include <cstdlib>
#include <string>

static std::vector<unsigned char> read(const char* path) {
  std::vector<unsigned char> data;
  if (FILE* f = std::fopen(path, "rb")) {
    for (int c; (c = std::fgetc(f)) != EOF;) data.push_back((unsigned char)c);
    std::fclose(f);
  }
  data.resize(data.size() + 16);  // (a pointer for kc 0)
  return data;
}

int main(int argc, char** argv) {
  if (argc < 14) return 2;
  const std::string dtype = argv[1];
  const int stride = std::atoi(argv[3]), vocab = std::atoi(argv[4]), chunk = std::atoi(argv[5]);
  const int launches = std::atoi(argv[6]), hstride = std::atoi(argv[9]), hwidth = std::atoi(argv[10]);
  const int kc = std::atoi(argv[11]), slices = std::atoi(argv[12]);
  std::vector<long> rows;
  for (int a = 13; a < argc; ++a) rows.push_back(std::atol(argv[a]));
  std::vector<unsigned char> data = read(argv[2]), hidden = read(argv[8]);
  const int slots = (int)rows.size(), chunks = (vocab + chunk - 1) / chunk;
  std::vector<float> part_v(slots * chunks * K), part_m(slots * chunks), part_s(slots * chunks), out_p(slots * K, -2.f);
  std::vector<float> hpart(slots * kc * slices * 5 + 1), hstats(slots * kc * 5 + 1, -2.f);
  std::vector<int> part_i(slots * chunks * K), tickets(slots, 0);
  std::vector<long> out_id(slots * K, -2);
  const auto* h = (const unsigned short*)hidden.data();
  for (int n = 0; n < launches; ++n)
    launch(kc * slices + chunks, slots, THREADS, [&] {
      if (dtype == "f32")
        topk_softmax_f32((const float*)data.data(), stride, rows.data(), vocab, chunk, chunks, part_v.data(),
                         part_i.data(), part_m.data(), part_s.data(), tickets.data(), out_p.data(), out_id.data(), h,
                         hstride, hwidth, kc, slices, hpart.data(), hstats.data());
      else
        topk_softmax_bf16((const unsigned short*)data.data(), stride, rows.data(), vocab, chunk, chunks,
                          part_v.data(), part_i.data(), part_m.data(), part_s.data(), tickets.data(), out_p.data(),
                          out_id.data(), h, hstride, hwidth, kc, slices, hpart.data(), hstats.data());
    });
  for (int t : tickets) if (t != 0) return 3;  // a ticket not reset: the next launch would merge too early
  FILE* o = std::fopen(argv[7], "wb");
  std::fwrite(out_p.data(), 4, out_p.size(), o);
  std::fwrite(out_id.data(), 8, out_id.size(), o);
  std::fwrite(hstats.data(), 4, slots * kc * 5, o);
  std::fclose(o);
  return 0;
}
