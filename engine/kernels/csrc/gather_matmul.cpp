// The experts' products of a mixture of experts (mx.gather_qmm, mlx-lm's QuantizedSwitchLinear):
// the pairs (row of x, expert) grouped by expert, so each expert's weights are read once for all
// the rows routed to it. Experts with few rows (decoding: a token's k experts, one row each) share
// one pass in which the threads split every expert's weight rows together, so 2 cores stay busy
// on small matrices; an expert with many rows (prefill) runs as a product of its own, on the
// dense products' paths for many rows.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "matmul.h"
#include "matmul_parts.h"
#include "threads.h"

namespace exo_kernels {

int gather_joint_max_rows = 16;

namespace {

using namespace detail;

// Weight rows of one expert a piece of the shared pass takes (a multiple of 4, the GEMV's
// blocks): a decoding step's 8 experts of 768 rows make 96 pieces, which 2 threads share evenly.
constexpr int PIECE_ROWS = 64;

struct GatherScratch {
  std::vector<int> starts, order;  // pairs by expert: order[starts[e] .. starts[e + 1])
  std::vector<char> x;             // each expert's rows of x, one after the other
  std::vector<float> out;          // fp32 outputs, each expert's rows one after the other
  std::vector<Scratch> prepared;   // x as the GEMV reads it, one an expert of the shared pass
};

GatherScratch& gather_scratch() {
  thread_local GatherScratch buffers;
  return buffers;
}

std::size_t item_bytes(Scalar type) { return type == Scalar::f32 ? 4 : 2; }

// One expert's share of the work: its weights, its rows of x and where their outputs go.
struct ExpertJob {
  int first, count;  // its pairs: order[first .. first + count)
  const uint32_t* w;
  const void* scales;
  const void* biases;
  const char* x;  // count * m rows
  float* out;     // count * m rows of n
};

}  // namespace

long run_gather_quantized_matmul(const void* x_in, Scalar x_type, int m, int k, const uint32_t* xi,
                                 const uint32_t* e, int pairs, int x_count, int experts,
                                 const uint32_t* w, const void* scales, const void* biases,
                                 Scalar scale_type, int n, int group_size, int bits, bool mxfp4,
                                 void* out, Scalar out_type) {
  const Isa& isa = best_isa();
  GatherScratch& g = gather_scratch();
  const std::size_t x_row = static_cast<std::size_t>(k) * item_bytes(x_type);
  const std::size_t out_row = static_cast<std::size_t>(n) * item_bytes(out_type);
  const std::size_t pair_x = x_row * m, pair_out = out_row * m, pair_out32 = std::size_t{4} * n * m;
  char* out_bytes = static_cast<char*>(out);

  // Pairs by expert (a counting sort); a pair whose index is out of range gets NaN, not a read.
  const auto in_range = [&](int t) {
    return e[t] < static_cast<uint32_t>(experts) && xi[t] < static_cast<uint32_t>(x_count);
  };
  long refused = 0;
  g.starts.assign(static_cast<std::size_t>(experts) + 1, 0);
  for (int t = 0; t < pairs; ++t) {
    if (!in_range(t)) {
      std::vector<float> nan(static_cast<std::size_t>(m) * n, std::numeric_limits<float>::quiet_NaN());
      isa.from_f32(nan.data(), out_type, nan.size(), out_bytes + t * pair_out);
      ++refused;
      continue;
    }
    ++g.starts[e[t] + 1];
  }
  for (int x = 0; x < experts; ++x) g.starts[x + 1] += g.starts[x];
  g.order.resize(static_cast<std::size_t>(pairs));
  {
    std::vector<int> next(g.starts.begin(), g.starts.end() - 1);
    for (int t = 0; t < pairs; ++t)
      if (in_range(t)) g.order[next[e[t]]++] = t;
  }
  const int routed = g.starts[experts];
  if (routed == 0) return refused;

  // Each expert's rows of x side by side, and room for their fp32 outputs.
  g.x.resize(routed * pair_x);
  for (int i = 0; i < routed; ++i)
    std::memcpy(g.x.data() + i * pair_x,
                static_cast<const char*>(x_in) + xi[g.order[i]] * pair_x, pair_x);
  float* out32 = sized(g.out, static_cast<std::size_t>(routed) * m * n);

  const int groups = k / group_size;
  const std::size_t w_words = static_cast<std::size_t>(n) * k * bits / 32;
  const std::size_t group_count = static_cast<std::size_t>(n) * groups;
  const std::size_t scale_bytes = mxfp4 ? 1 : item_bytes(scale_type);
  std::vector<ExpertJob> joint, solo;
  for (int x = 0; x < experts; ++x) {
    const int first = g.starts[x], count = g.starts[x + 1] - first;
    if (count == 0) continue;
    const ExpertJob job{
        first,
        count,
        w + x * w_words,
        static_cast<const char*>(scales) + x * group_count * scale_bytes,
        mxfp4 ? nullptr : static_cast<const char*>(biases) + x * group_count * scale_bytes,
        g.x.data() + first * pair_x,
        out32 + static_cast<std::size_t>(first) * m * n};
    (count * m <= gather_joint_max_rows ? joint : solo).push_back(job);
  }

  for (const ExpertJob& job : solo)
    run_quantized_matmul(job.x, x_type, job.count * m, k, job.w, job.scales, job.biases,
                         scale_type, n, group_size, bits, mxfp4, job.out, Scalar::f32);

  if (!joint.empty()) {
    const bool nibble_dot =
        !mxfp4 && takes_nibble_dot(isa, x_type, bits, scale_type, k, group_size);
    const bool byte_dot = takes_byte_dot(isa, x_type, bits, mxfp4, scale_type, k);
    if (g.prepared.size() < joint.size()) g.prepared.resize(joint.size());
    std::vector<QuantizedArgs> args;
    args.reserve(joint.size());
    for (std::size_t j = 0; j < joint.size(); ++j) {
      const ExpertJob& job = joint[j];
      const int rows = job.count * m;
      const GemvX px = prepare_x(isa, g.prepared[j], job.x, x_type, rows, k, group_size, bits,
                                 nibble_dot, true, false, byte_dot, mxfp4);
      args.push_back(QuantizedArgs{px.prepared, px.sums, rows, k, n, job.w, job.scales,
                                   job.biases, scale_type, group_size, bits, job.out, n, px.xq,
                                   px.xq_scales, px.xq8, mxfp4, px.xb});
    }
    const int per_expert = (n + PIECE_ROWS - 1) / PIECE_ROWS;
    const int pieces = per_expert * static_cast<int>(joint.size());
    const std::size_t bytes = joint.size() * (w_words * 4 + group_count * scale_bytes * 2);
    // Several parts a thread, taken as each thread comes free (see matmul.cpp's gemv_parallel).
    const int parts = work_parts(bytes, std::min(pieces, thread_count() * 4));
    parallel_for(parts, [&](int part) {
      // Parts of whole pieces, in order: a part takes consecutive pieces of one or more experts.
      const int p0 = static_cast<int>(static_cast<long>(pieces) * part / parts);
      const int p1 = static_cast<int>(static_cast<long>(pieces) * (part + 1) / parts);
      for (int p = p0; p < p1; ++p) {
        const int j = p / per_expert, piece = p % per_expert;
        const int n0 = piece * PIECE_ROWS, n1 = std::min(n, n0 + PIECE_ROWS);
        isa.quantized_gemv(args[j], n0, n1);
      }
    });
    for (std::size_t j = 0; j < joint.size(); ++j) {
      const ExpertJob& job = joint[j];
      redo_non_finite(isa, nullptr, job.x, x_type, job.count * m, k, job.w, job.scales,
                      job.biases, scale_type, n, group_size, bits, mxfp4, job.out);
    }
  }

  // Each pair's outputs to its place, in the output's type.
  for (int i = 0; i < routed; ++i)
    isa.from_f32(out32 + i * pair_out32 / 4, out_type, static_cast<std::size_t>(m) * n,
                 out_bytes + g.order[i] * pair_out);
  return refused;
}

}  // namespace exo_kernels
