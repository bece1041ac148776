// The continuous-batching workload that pagedkv_bench_replay --generate writes as a trace
// (replay_trace.hpp), from a fixed seed with its own generator (no std distributions, whose
// results differ between standard libraries), so every machine replays the same ops.
//
// Warm-up (untimed): sequences of 1,024 unique tokens fill every block of the pool at once and
// finish. The seed grows its flat storage on first use (Vec::resize, zero-filled, with
// reallocation); pagedkv's pool pages are faulted in on first touch (on this build machine's VM a
// 2 MiB page fault costs ~5-10 ms). The warm-up takes both costs out of the timed part.
//
// Timed: `requests` requests through a running set of at most `running` sequences. A request's
// prompt is one of four shared system prompts (512, 384, 264 and 128 tokens: full blocks and a
// partial one) and 8-199 tokens of its own; one in ten repeats an earlier request's whole prompt
// (a full hit: the last prompt token is recomputed into a shared block). It decodes 16-159
// tokens. Per step: up to two admissions while there is room; one decode step over the running
// set; a read of one random layer of one random running sequence; with probability 1/8 a
// rollback of a random running sequence by 1-4 of its generated tokens (rejected speculative
// tokens; it generates them again); each sequence that reached its output length is read once
// more (one layer) and finished.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "benchmarks/replay_trace.hpp"

namespace pagedkv::bench::replay {

struct Workload {
  Model model;
  int64_t requests = 0;
  int64_t running = 0;
};

/// "small" (8 layers x 4 heads x 64) or "large" (32 x 8 x 128, a 4 GiB pool); false otherwise.
inline bool find_workload(const std::string& name, Workload* w) {
  if (name == "small") {
    *w = Workload{{"small", 8, 4, 64, 16, 2048}, 384, 32};
  } else if (name == "large") {
    *w = Workload{{"large", 32, 8, 128, 16, 2048}, 96, 16};
  } else {
    return false;
  }
  return true;
}

/// splitmix64: the trace must not depend on the standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() { return mix64(state_ += kGold); }
  /// Uniform enough in [0, n) for a workload.
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }

 private:
  uint64_t state_;
};

/// Writes the workload's trace.
inline void write_trace(const Workload& w, std::ostream& out) {
  const Model& m = w.model;
  Rng rng(0x5EEDC0DEull);
  auto token = [&] { return static_cast<int32_t>(1 + rng.below(31999)); };
  out << "pagedkv-replay-trace 1\n";
  out << "model " << m.name << ' ' << m.layers << ' ' << m.heads << ' ' << m.head_dim << ' '
      << m.block_size << ' ' << m.blocks << '\n';
  auto admit = [&](uint64_t id, const std::vector<int32_t>& prompt) {
    out << "A " << id << ' ' << prompt.size();
    for (int32_t t : prompt) out << ' ' << t;
    out << '\n';
  };

  // Warm-up: fill the whole pool, then finish everything.
  const int64_t warm_len = 1024;
  const int64_t warm_seqs = m.blocks / (warm_len / m.block_size);
  for (int64_t i = 0; i < warm_seqs; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(warm_len));
    for (int32_t& t : prompt) t = token();
    admit(static_cast<uint64_t>(1 + i), prompt);
  }
  for (int64_t i = 0; i < warm_seqs; ++i) out << "F " << 1 + i << '\n';
  out << "T\n";

  std::vector<std::vector<int32_t>> prefixes;
  for (int64_t len : {512, 384, 264, 128}) {
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (int32_t& t : p) t = token();
    prefixes.push_back(std::move(p));
  }
  struct Running {
    uint64_t id;
    int64_t length, generated, target;
  };
  std::vector<Running> running;
  std::vector<std::vector<int32_t>> prompts;
  uint64_t next_id = 1000;
  int64_t admitted = 0;
  while (admitted < w.requests || !running.empty()) {
    for (int k = 0;
         k < 2 && admitted < w.requests && static_cast<int64_t>(running.size()) < w.running; ++k) {
      std::vector<int32_t> prompt;
      if (!prompts.empty() && rng.below(10) == 0) {
        prompt = prompts[static_cast<size_t>(rng.below(static_cast<int64_t>(prompts.size())))];
      } else {
        prompt = prefixes[static_cast<size_t>(rng.below(4))];
        const int64_t own = 8 + rng.below(192);
        for (int64_t i = 0; i < own; ++i) prompt.push_back(token());
      }
      admit(next_id, prompt);
      running.push_back({next_id, static_cast<int64_t>(prompt.size()), 0, 16 + rng.below(144)});
      prompts.push_back(std::move(prompt));
      ++next_id;
      ++admitted;
    }
    out << "D " << running.size();
    for (Running& r : running) {
      out << ' ' << r.id << ' ' << token();
      ++r.length;
      ++r.generated;
    }
    out << '\n';
    const Running& pick =
        running[static_cast<size_t>(rng.below(static_cast<int64_t>(running.size())))];
    out << "P " << pick.id << ' ' << rng.below(m.layers) << '\n';
    if (rng.below(8) == 0) {
      Running& r = running[static_cast<size_t>(rng.below(static_cast<int64_t>(running.size())))];
      const int64_t back = std::min<int64_t>(1 + rng.below(4), r.generated);
      if (back > 0) {
        r.length -= back;
        r.generated -= back;
        out << "B " << r.id << ' ' << r.length << '\n';
      }
    }
    for (size_t i = 0; i < running.size();) {
      if (running[i].generated < running[i].target) {
        ++i;
        continue;
      }
      out << "P " << running[i].id << ' ' << rng.below(m.layers) << '\n';
      out << "F " << running[i].id << '\n';
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
}

}  // namespace pagedkv::bench::replay
