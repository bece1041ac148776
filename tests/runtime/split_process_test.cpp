// Split-process tensor parallelism (step_plan.hpp): a scheduler's cache records the moves,
// copies and batches of its calls; worker processes, each holding one rank's part of the model,
// apply them.
//
// - Two and four worker processes (fork, a socket pair each) apply the encoded plans of a
//   randomized run (prefix hits, prefill chunks, decode steps, fork and copy-on-write, offload,
//   restore, eviction under pressure, finish, erase) and write their heads through the batches
//   they get; at the end every worker's pools equal, byte for byte, that rank's pools of the
//   in-process tensor-parallel cache driven by the same calls. One group, and two (full
//   attention and a window) sharing the blocks. A scheduler on null backends (no memory)
//   records the same plans, byte for byte.
// - StepPlan's bytes: a round trip, and every truncation or corruption refused.
// - A worker refuses a plan outside its pools with nothing changed, and makes no decisions.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "pagedkv/cache.hpp"
#include "runtime/kv_model.hpp"
#include "runtime/null_storage.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv {
namespace {

using testing::kv_value;

// One K/V group (`groups` 1), or two sharing the blocks (`groups` 2): full attention on layers 0
// and 2 (8 heads of 4) and a sliding window of 8 tokens on layer 1 (4 heads of 10).
CacheConfig model_config(BackendKind kind, int32_t groups = 1) {
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 4;
  c.head_dim = 6;
  c.block_size = 4;
  c.num_device_blocks = 24;
  c.num_host_blocks = 16;
  c.backend = kind;
  if (groups == 2) {
    c.num_layers = 3;
    KvGroup full, window;
    full.name = "full";
    full.layers = {0, 2};
    full.num_kv_heads = 8;
    full.head_dim = 4;
    window.name = "window";
    window.layers = {1};
    window.num_kv_heads = 4;
    window.head_dim = 10;
    window.sliding_window = 8;
    for (KvGroup* g : {&full, &window}) {
      g->num_device_blocks = 24;
      g->num_host_blocks = 16;
    }
    c.groups = {full, window};
  }
  return c;
}

// ---- a socket pair's framed messages: u64 length, then the bytes ----

bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool send_msg(int fd, const std::string& m) {
  const uint64_t n = m.size();
  return write_all(fd, &n, sizeof(n)) && write_all(fd, m.data(), m.size());
}

bool recv_msg(int fd, std::string* m) {
  uint64_t n = 0;
  if (!read_all(fd, &n, sizeof(n))) return false;
  m->resize(static_cast<size_t>(n));
  return read_all(fd, m->data(), m->size());
}

// ---- what the model writes, the same in every process ----

// Rows [n, heads, head_dim] of one layer's keys (part 0) or values (part 1) for the n tokens of
// step `step`'s batch, heads [first, first + heads) of the model's.
std::vector<uint16_t> step_rows(int64_t n, int32_t step, int32_t layer, int32_t part, int32_t first,
                                int32_t heads, int32_t head_dim) {
  std::vector<uint16_t> out;
  for (int64_t t = 0; t < n; ++t)
    for (int32_t h = first; h < first + heads; ++h)
      for (int32_t d = 0; d < head_dim; ++d)
        out.push_back(kv_value(int64_t{step} * 1000 + t, 7, layer, part, h, d));
  return out;
}

// Writes step `step`'s K/V of every layer through its group's batch (`batches`, by group), on a
// cache holding heads [rank * heads, (rank + 1) * heads) of each group.
Status write_step(KvCache& cache, const std::vector<DeviceBatch>& batches, int32_t step,
                  int32_t rank) {
  for (int32_t layer = 0; layer < cache.config().num_layers; ++layer) {
    PAGEDKV_ASSIGN_OR_RETURN(const LayerGroup lg, cache.layer_group(layer));
    const CacheConfig& c = cache.shard_config(lg.group);
    const DeviceBatch& batch = batches[static_cast<size_t>(lg.group)];
    const int64_t n = static_cast<int64_t>(batch.host->slot_mapping.size());
    const int32_t first = rank * c.num_kv_heads;
    const auto k = step_rows(n, step, layer, 0, first, c.num_kv_heads, c.head_dim);
    const auto v = step_rows(n, step, layer, 1, first, c.num_kv_heads, c.head_dim);
    PAGEDKV_RETURN_IF_ERROR(
        cache.write_kv_batch(batch, layer, k.data(), v.data(), DType::kFloat16));
  }
  return ok_status();
}

// Every pool of rank `rank` (device, then host, by group) as bytes; pools live in host memory on
// the CPU backend.
std::string pool_bytes(KvCache& cache, int32_t rank) {
  std::string out;
  for (const PoolRegion& r : cache.regions()) {
    if (r.rank != rank) continue;
    out.append(reinterpret_cast<const char*>(r.base), static_cast<size_t>(r.bytes));
  }
  return out;
}

void zero_pools(KvCache& cache) {
  for (const PoolRegion& r : cache.regions()) {
    std::memset(reinterpret_cast<void*>(r.base), 0, static_cast<size_t>(r.bytes));
  }
}

// ---- the worker process ----

// Message kinds: a plan ('P', the step number, the plan's bytes), the end ('F'). Answers: 'K'
// (applied), 'E' and a message (failed), and to 'F' the pools' bytes.
std::string plan_msg(int32_t step, const std::string& plan) {
  std::string m = "P";
  m.append(reinterpret_cast<const char*>(&step), sizeof(step));
  return m + plan;
}

std::string apply_one(KvCache& cache, const std::string& msg, int32_t rank) {
  int32_t step = 0;
  std::memcpy(&step, msg.data() + 1, sizeof(step));
  StatusOr<StepPlan> plan = StepPlan::decode(std::string_view(msg).substr(1 + sizeof(step)));
  if (!plan.ok()) return "E" + plan.status().to_string();
  StatusOr<std::vector<DeviceBatch>> batches = cache.apply_step_plan(*plan);
  if (!batches.ok()) return "E" + batches.status().to_string();
  const size_t groups = static_cast<size_t>(cache.num_groups());
  if (batches->size() >= groups) {  // the last build's batches, one per group
    const std::vector<DeviceBatch> last(batches->end() - static_cast<std::ptrdiff_t>(groups),
                                        batches->end());
    const Status s = write_step(cache, last, step, rank);
    if (!s.ok()) return "E" + s.to_string();
  }
  const Status inv = cache.check_invariants();
  return inv.ok() ? "K" : "E" + inv.to_string();
}

// A worker's life: its cache of rank `rank`'s part of the model, the plans it is sent, then its
// pools. Returns the process's exit code.
int worker_main(int fd, int32_t tp, int32_t groups, int32_t rank) {
  StatusOr<CacheConfig> config = rank_config(model_config(BackendKind::kCpu, groups), tp);
  if (!config.ok()) return 2;
  StatusOr<std::unique_ptr<KvCache>> cache = KvCache::create(*config);
  if (!cache.ok()) return 3;
  zero_pools(**cache);
  std::string msg;
  while (recv_msg(fd, &msg) && !msg.empty()) {
    if (msg[0] == 'F') {
      if (!(*cache)->synchronize().ok()) return 4;
      return send_msg(fd, pool_bytes(**cache, 0)) ? 0 : 5;
    }
    if (!send_msg(fd, apply_one(**cache, msg, rank))) return 6;
  }
  return 7;
}

struct Worker {
  pid_t pid = -1;
  int fd = -1;
};

// Forks `tp` workers, each on its end of a socket pair. Forked before the test creates any
// backend, so the children start from a process with no threads of the test's.
std::vector<Worker> start_workers(int32_t tp, int32_t groups) {
  std::vector<Worker> workers;
  for (int32_t r = 0; r < tp; ++r) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return workers;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      for (const Worker& w : workers) ::close(w.fd);
      ::_exit(worker_main(fds[1], tp, groups, r));
    }
    ::close(fds[1]);
    workers.push_back({pid, fds[0]});
  }
  return workers;
}

// Closes the sockets (a worker still waiting reads the end and exits) and reaps every worker;
// the exit codes.
std::vector<int> stop_workers(std::vector<Worker>& workers) {
  std::vector<int> codes;
  for (Worker& w : workers) ::close(w.fd);
  for (Worker& w : workers) {
    int status = 0;
    ::waitpid(w.pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  workers.clear();
  return codes;
}

// Stops the workers when a test ends early (a failed assertion).
struct WorkerGuard {
  std::vector<Worker>& workers;
  ~WorkerGuard() {
    if (!workers.empty()) stop_workers(workers);
  }
};

// ---- the scheduler's side ----

// The in-process tensor-parallel cache (CPU backends, which holds the data) and a scheduler on
// null backends (no memory), both recording, driven by the same calls.
struct Schedulers {
  std::unique_ptr<KvCache> in_process;
  std::unique_ptr<KvCache> null;

  // Runs `call` on both; they must answer alike.
  template <typename F>
  Status both(F call) {
    const Status a = call(*in_process);
    const Status b = call(*null);
    EXPECT_EQ(a.code(), b.code()) << a.to_string() << " / " << b.to_string();
    return a;
  }
};

std::unique_ptr<KvCache> recording_cache(BackendKind kind, int32_t tp, int32_t groups = 1) {
  KvCacheOptions o;
  o.tp_size = tp;
  o.record_step_plans = true;
  StatusOr<std::unique_ptr<KvCache>> c = KvCache::create(model_config(kind, groups), o);
  EXPECT_OK(c);
  return c.ok() ? std::move(*c) : nullptr;
}

struct RunCounts {
  int64_t moves = 0, copies = 0, batches = 0;
};

// Sends the plans the schedulers recorded since the last call to every worker (checking the
// null scheduler's are the same bytes) and waits for each to apply them.
void ship(Schedulers& s, std::vector<Worker>& workers, int32_t step, RunCounts* counts) {
  const StepPlan plan = s.in_process->take_step_plan();
  const std::string bytes = plan.encode();
  ASSERT_EQ(bytes, s.null->take_step_plan().encode()) << "step " << step;
  if (plan.empty()) return;
  for (const StepRecord& r : plan.records) {
    counts->moves += static_cast<int64_t>(r.moves.size());
    counts->copies += static_cast<int64_t>(r.copies.size());
    counts->batches += r.kind == StepRecord::Kind::kBatch ? 1 : 0;
  }
  for (Worker& w : workers) ASSERT_TRUE(send_msg(w.fd, plan_msg(step, bytes)));
  for (size_t r = 0; r < workers.size(); ++r) {
    std::string answer;
    ASSERT_TRUE(recv_msg(workers[r].fd, &answer)) << "worker " << r << " is gone";
    ASSERT_EQ(answer, "K") << "worker " << r << " at step " << step;
  }
}

// (tp_size, groups)
class SplitProcess : public ::testing::TestWithParam<std::tuple<int32_t, int32_t>> {};

TEST_P(SplitProcess, WorkersApplyingThePlansEndByteIdenticalToTheInProcessCache) {
  const auto [tp, groups] = GetParam();
  std::vector<Worker> workers = start_workers(tp, groups);
  WorkerGuard guard{workers};
  ASSERT_EQ(static_cast<int32_t>(workers.size()), tp);
  Schedulers s{recording_cache(BackendKind::kCpu, tp, groups),
               recording_cache(BackendKind::kNull, tp, groups)};
  ASSERT_NE(s.in_process, nullptr);
  ASSERT_NE(s.null, nullptr);
  zero_pools(*s.in_process);

  std::mt19937 rng(20261206u + static_cast<uint32_t>(tp));
  const std::vector<TokenId> system = {11, 12, 13, 14, 15, 16, 17, 18};
  std::map<SequenceId, std::vector<TokenId>> unwritten;  // prompt tokens not yet written
  std::vector<SequenceId> live;
  SequenceId next_id = 1;
  RunCounts counts;
  for (int32_t step = 1; step <= 160 && !HasFatalFailure(); ++step) {
    const int action = std::uniform_int_distribution<int>(0, 9)(rng);
    if (live.size() < 3 || (action == 0 && live.size() < 7)) {
      std::vector<TokenId> prompt = system;
      const int tail = std::uniform_int_distribution<int>(1, 9)(rng);
      for (int i = 0; i < tail; ++i) prompt.push_back(100 + static_cast<TokenId>(rng() % 50));
      const SequenceId id = next_id++;
      int64_t hit = 0;
      const Status st = s.both([&](KvCache& c) {
        StatusOr<int64_t> h = c.add_sequence(id, prompt);
        if (h.ok()) hit = *h;
        return h.status();
      });
      if (st.ok()) {
        live.push_back(id);
        unwritten[id].assign(prompt.begin() + hit, prompt.end());
      }
    } else if (action == 1) {  // fork: the child shares the parent's blocks until it writes
      const SequenceId parent = live[rng() % live.size()];
      if (!unwritten[parent].empty()) continue;
      const SequenceId id = next_id++;
      if (s.both([&](KvCache& c) { return c.fork(parent, id); }).ok()) live.push_back(id);
    } else if (action == 2) {
      const SequenceId id = live[rng() % live.size()];
      s.both([&](KvCache& c) {
         return c.offload(id);
       }).ignore_error();  // may be refused: both alike
    } else if (action == 3) {
      const SequenceId id = live[rng() % live.size()];
      s.both([&](KvCache& c) { return c.restore(id); }).ignore_error();
    } else if (action == 4 && live.size() > 3) {
      const size_t i = rng() % live.size();
      const SequenceId id = live[i];
      const bool finish = rng() % 2 == 0;
      s.both([&](KvCache& c) { return finish ? c.finish(id) : c.erase(id); }).ignore_error();
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
      unwritten.erase(id);
    } else {  // a step: each chosen sequence writes a prefill chunk or one decoded token
      std::vector<SequenceId> batch;
      std::map<SequenceId, std::vector<TokenId>> tokens;
      for (SequenceId id : live) {
        if (rng() % 3 == 0) continue;
        std::vector<TokenId>& rest = unwritten[id];
        std::vector<TokenId> t;
        if (rest.empty()) {
          t.push_back(200 + static_cast<TokenId>(rng() % 50));
        } else {
          const size_t n = std::min<size_t>(rest.size(), 1 + rng() % 6);
          t.assign(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(n));
        }
        const int64_t n = static_cast<int64_t>(t.size());
        if (!s.both([&](KvCache& c) { return c.reserve(id, n).status(); }).ok()) continue;
        batch.push_back(id);
        tokens[id] = t;
      }
      // A later reservation may have offloaded an earlier one to make room: it sits this step
      // out (its reservation taken back), decided on the in-process cache, done on both.
      std::vector<SequenceId> ready;
      for (SequenceId id : batch) {
        if (!s.in_process->contains(id)) continue;  // dropped to make room
        StatusOr<SequenceResidency> where = s.in_process->residency(id);
        ASSERT_OK(where);
        if (*where == SequenceResidency::kDevice) {
          ready.push_back(id);
          continue;
        }
        const int64_t committed = s.in_process->length(id).value();
        ASSERT_OK(s.both([&](KvCache& c) { return c.rollback(id, committed); }));
      }
      batch = ready;
      if (batch.empty()) continue;
      // Every other step builds the window group's table as a ring, which the plan carries.
      BatchOptions options;
      options.ring_window_tables = step % 2 == 1;
      StatusOr<std::vector<DeviceBatch>> built = s.in_process->build_batches(batch, options);
      ASSERT_OK(built);
      ASSERT_OK(s.null->build_batches(batch, options));
      for (int32_t r = 0; r < tp; ++r) {
        std::vector<DeviceBatch> mine;
        for (const DeviceBatch& b : *built) mine.push_back(s.in_process->rank_batch(b, r).value());
        ASSERT_OK(write_step(*s.in_process, mine, step, r));
      }
      ship(s, workers, step, &counts);
      for (SequenceId id : batch) {
        ASSERT_OK(s.both([&](KvCache& c) { return c.commit(id, tokens[id]); }));
        std::vector<TokenId>& rest = unwritten[id];
        rest.erase(rest.begin(),
                   rest.begin() +
                       std::min<std::ptrdiff_t>(static_cast<std::ptrdiff_t>(rest.size()),
                                                static_cast<std::ptrdiff_t>(tokens[id].size())));
      }
    }
    ship(s, workers, step, &counts);
    // Sequences dropped to make room are gone from both.
    const std::vector<SequenceId> dropped = s.in_process->drain_evicted_sequences();
    EXPECT_EQ(dropped, s.null->drain_evicted_sequences());
    for (SequenceId id : dropped) {
      live.erase(std::remove(live.begin(), live.end(), id), live.end());
      unwritten.erase(id);
    }
    ASSERT_OK(s.in_process->check_invariants());
    ASSERT_OK(s.null->check_invariants());
  }
  // The run moved blocks both ways, copied blocks on write and built batches.
  EXPECT_GT(counts.moves, 0);
  EXPECT_GT(counts.copies, 0);
  EXPECT_GT(counts.batches, 20);

  ASSERT_OK(s.in_process->synchronize());
  for (int32_t r = 0; r < tp; ++r) {
    Worker& w = workers[static_cast<size_t>(r)];
    ASSERT_TRUE(send_msg(w.fd, "F"));
    std::string pools;
    ASSERT_TRUE(recv_msg(w.fd, &pools)) << "worker " << r;
    const std::string expected = pool_bytes(*s.in_process, r);
    ASSERT_EQ(pools.size(), expected.size()) << "rank " << r;
    EXPECT_TRUE(pools == expected) << "rank " << r << "'s pools differ from the in-process cache's";
    EXPECT_NE(expected, std::string(expected.size(), '\0')) << "nothing was written";
  }
  for (int code : stop_workers(workers)) EXPECT_EQ(code, 0);
}

INSTANTIATE_TEST_SUITE_P(Ranks, SplitProcess,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return "tp" + std::to_string(std::get<0>(info.param)) + "_groups" +
                                  std::to_string(std::get<1>(info.param));
                         });

// A plan with every kind of record, from a recording scheduler of one rank.
StepPlan sample_plan(KvCache& scheduler) {
  EXPECT_OK(scheduler.add_sequence(1, {1, 2, 3, 4, 5, 6}));
  EXPECT_OK(scheduler.reserve(1, 6));
  EXPECT_OK(scheduler.commit(1, {1, 2, 3, 4, 5, 6}));
  EXPECT_OK(scheduler.fork(1, 2));
  EXPECT_OK(scheduler.reserve(2, 1));  // copy-on-write of the shared partial block
  EXPECT_OK(scheduler.offload(1));
  BatchOptions csr;
  csr.build_csr = true;
  EXPECT_OK(scheduler.build_batch({2}, csr));
  return scheduler.take_step_plan();
}

TEST(StepPlan, BytesRoundTripAndEveryDamagedMessageIsRefused) {
  std::unique_ptr<KvCache> scheduler = recording_cache(BackendKind::kNull, 1);
  ASSERT_NE(scheduler, nullptr);
  const StepPlan plan = sample_plan(*scheduler);
  ASSERT_EQ(plan.records.size(), 3u);  // the copy, the offload, the batch
  EXPECT_EQ(plan.records[0].copies.size(), 1u);
  EXPECT_EQ(plan.records[1].moves.size(), 1u);  // sequence 1's own block (block 0 is shared)
  EXPECT_EQ(plan.records[2].kind, StepRecord::Kind::kBatch);
  const std::string bytes = plan.encode();
  StatusOr<StepPlan> back = StepPlan::decode(bytes);
  ASSERT_OK(back);
  ASSERT_EQ(back->records.size(), plan.records.size());
  for (size_t i = 0; i < plan.records.size(); ++i) {
    const StepRecord &a = plan.records[i], &b = back->records[i];
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.moves, b.moves);
    EXPECT_EQ(a.copies, b.copies);
    EXPECT_EQ(a.group, b.group);
    EXPECT_EQ(a.build_csr, b.build_csr);
    EXPECT_EQ(a.batch.slot_mapping, b.batch.slot_mapping);
    EXPECT_EQ(a.batch.block_tables, b.batch.block_tables);
    EXPECT_EQ(a.batch.seq_lens, b.batch.seq_lens);
    EXPECT_EQ(a.batch.indices, b.batch.indices);
  }
  EXPECT_EQ(back->encode(), bytes);
  for (size_t n = 0; n < bytes.size(); ++n) {  // every truncation
    EXPECT_EQ(StepPlan::decode(bytes.substr(0, n)).status().code(), StatusCode::kInvalidArgument)
        << n << " bytes";
  }
  EXPECT_EQ(StepPlan::decode(bytes + "x").status().code(), StatusCode::kInvalidArgument);
  std::string bad = bytes;
  bad[7] = 1;  // the version (2 is this one)
  EXPECT_EQ(StepPlan::decode(bad).status().code(), StatusCode::kInvalidArgument);
  bad = bytes;
  bad[12] = 9;  // the first record's kind
  EXPECT_EQ(StepPlan::decode(bad).status().code(), StatusCode::kInvalidArgument);
  bad = bytes;
  std::memset(&bad[8], 0xff, 4);  // a record count past the end
  EXPECT_EQ(StepPlan::decode(bad).status().code(), StatusCode::kInvalidArgument);
}

// Bytes damaged at random (one to four bytes overwritten): decode() refuses them or gives a plan,
// and a worker refuses that plan or applies it; nothing reads or writes out of bounds (the ASan
// build runs this too) and the worker stays consistent.
TEST(StepPlan, RandomlyDamagedBytesAreRefusedOrAppliedSafely) {
  std::unique_ptr<KvCache> scheduler = recording_cache(BackendKind::kNull, 2);
  ASSERT_NE(scheduler, nullptr);
  const std::string bytes = sample_plan(*scheduler).encode();
  auto worker = KvCache::create(rank_config(model_config(BackendKind::kCpu), 2).value());
  ASSERT_OK(worker);
  std::mt19937 rng(33);
  int decoded = 0, applied = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string bad = bytes;
    for (int n = 1 + static_cast<int>(rng() % 4); n > 0; --n) {
      bad[rng() % bad.size()] = static_cast<char>(rng());
    }
    StatusOr<StepPlan> plan = StepPlan::decode(bad);
    if (!plan.ok()) {
      EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
      continue;
    }
    ++decoded;
    StatusOr<std::vector<DeviceBatch>> r = (*worker)->apply_step_plan(*plan);
    if (r.ok()) {
      ++applied;
    } else {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
    }
    ASSERT_OK((*worker)->check_invariants());
  }
  // Most damage lands in block ids and slots, which decode but do not fit the pools.
  EXPECT_GT(decoded, 0);
  EXPECT_GT(applied, 0);
  EXPECT_LT(applied, decoded);
}

TEST(SplitProcessWorker, APlanOutsideItsPoolsIsRefusedAndChangesNothing) {
  std::unique_ptr<KvCache> scheduler = recording_cache(BackendKind::kNull, 2);
  ASSERT_NE(scheduler, nullptr);
  const StepPlan good = sample_plan(*scheduler);
  auto worker = KvCache::create(rank_config(model_config(BackendKind::kCpu), 2).value());
  ASSERT_OK(worker);
  KvCache& w = **worker;
  zero_pools(w);
  const std::string before = pool_bytes(w, 0);

  const int64_t blocks = w.config().num_device_blocks;
  std::vector<std::pair<const char*, std::function<void(StepPlan&)>>> damage = {
      {"a copy's source past the pool",
       [&](StepPlan& p) { p.records[0].copies[0].src_block = static_cast<int32_t>(blocks); }},
      {"a copy's target -1", [](StepPlan& p) { p.records[0].copies[0].dst_block = -1; }},
      {"a copy of group 1", [](StepPlan& p) { p.records[0].copies[0].group = 1; }},
      {"a move's host block past the host pool",
       [](StepPlan& p) { p.records[1].moves[0].dst_block = 16; }},
      {"a move within one tier",
       [](StepPlan& p) { p.records[1].moves[0].dst_tier = Tier::kDevice; }},
      {"a table's block past the pool",
       [&](StepPlan& p) { p.records[2].batch.block_tables[0] = static_cast<int32_t>(blocks); }},
      {"a slot past the pool",
       [&](StepPlan& p) { p.records[2].batch.slot_mapping[0] = blocks * 4; }},
      {"a row longer than its table",
       [](StepPlan& p) { p.records[2].batch.seq_lens[0] += 4 * p.records[2].batch.max_blocks; }},
      {"a table of the wrong size",
       [](StepPlan& p) { p.records[2].batch.block_tables.pop_back(); }},
      {"a CSR block past the pool",
       [&](StepPlan& p) { p.records[2].batch.indices[0] = static_cast<int32_t>(blocks); }},
      {"an indptr past its indices", [](StepPlan& p) { p.records[2].batch.indptr.back() += 1; }},
      {"a last page longer than a block",
       [](StepPlan& p) { p.records[2].batch.last_page_len[0] = 5; }},
      {"a batch of the same build first", [](StepPlan& p) { p.records[2].same_build = true; }},
      {"a ring table in a group without a window",
       [](StepPlan& p) { p.records[2].batch.ring_table = true; }},
  };
  for (auto& [what, damage_it] : damage) {
    StepPlan bad = good;
    damage_it(bad);
    StatusOr<std::vector<DeviceBatch>> r = w.apply_step_plan(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << what;
    ASSERT_OK(w.synchronize());
    EXPECT_TRUE(pool_bytes(w, 0) == before) << what << " changed the pools";
  }
  // The good plan still applies, and its batch is current.
  StatusOr<std::vector<DeviceBatch>> batches = w.apply_step_plan(good);
  ASSERT_OK(batches);
  ASSERT_EQ(batches->size(), 1u);
  EXPECT_TRUE(w.built_here(batches->front()));
  EXPECT_OK(write_step(w, *batches, 1, 0));
  EXPECT_OK(w.check_invariants());
}

TEST(SplitProcessWorker, AWorkerMakesNoDecisionsAndAPlainCacheRecordsNothing) {
  const CacheConfig model = model_config(BackendKind::kCpu);
  // A cache with sequences of its own does not take plans; a worker does not add sequences.
  auto own = KvCache::create(model);
  ASSERT_OK(own);
  ASSERT_OK((*own)->add_sequence(1, {1, 2, 3}));
  EXPECT_EQ((*own)->apply_step_plan(StepPlan{}).status().code(), StatusCode::kFailedPrecondition);
  auto worker = KvCache::create(rank_config(model, 2).value());
  ASSERT_OK(worker);
  ASSERT_OK((*worker)->apply_step_plan(StepPlan{}));
  EXPECT_EQ((*worker)->add_sequence(1, {1, 2, 3}).status().code(), StatusCode::kFailedPrecondition);
  // Without record_step_plans nothing is recorded.
  EXPECT_OK((*own)->reserve(1, 3));
  EXPECT_OK((*own)->build_batch({1}));
  EXPECT_TRUE((*own)->take_step_plan().empty());
  // A failed call records nothing: a reservation larger than the pool.
  std::unique_ptr<KvCache> scheduler = recording_cache(BackendKind::kNull, 2);
  ASSERT_NE(scheduler, nullptr);
  ASSERT_OK(scheduler->add_sequence(1, {1, 2, 3}));
  EXPECT_EQ(scheduler->reserve(1, 4 * model.num_device_blocks + 1).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_TRUE(scheduler->take_step_plan().empty());
  // Recording with a storage tier is not built.
  testing::NullStorage store;
  KvCacheOptions o;
  o.record_step_plans = true;
  o.storage = &store;
  EXPECT_EQ(KvCache::create(model, o).status().code(), StatusCode::kUnimplemented);
}

TEST(SplitProcessWorker, RankConfigSplitsKvHeadsAndKeepsALatentGroupWhole) {
  const CacheConfig model = model_config(BackendKind::kCpu);
  StatusOr<CacheConfig> half = rank_config(model, 2);
  ASSERT_OK(half);
  EXPECT_EQ(half->num_kv_heads, 2);
  EXPECT_EQ(half->num_device_blocks, model.num_device_blocks);
  EXPECT_EQ(rank_config(model, 3).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rank_config(model, 0).status().code(), StatusCode::kInvalidArgument);
  CacheConfig mixed = model;
  mixed.groups = {KvGroup::latent("mla", {0}, 16, 4), KvGroup{}};
  mixed.groups[1].name = "kv";
  mixed.groups[1].layers = {1};
  mixed.groups[1].num_kv_heads = 4;
  mixed.groups[1].head_dim = 8;
  for (KvGroup& g : mixed.groups) {
    g.num_device_blocks = 8;
    g.num_host_blocks = 0;
  }
  StatusOr<CacheConfig> part = rank_config(mixed, 4);
  ASSERT_OK(part);
  EXPECT_EQ(part->groups[0].num_kv_heads, 1);
  EXPECT_EQ(part->groups[0].head_dim, 16);
  EXPECT_EQ(part->groups[1].num_kv_heads, 1);
}

}  // namespace
}  // namespace pagedkv
