#include "scheduler.hpp"

#include <algorithm>
#include <chrono>
#include <queue>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>

namespace pagedkv {
namespace sim {

namespace {

using WallClock = std::chrono::steady_clock;

double micros_since(WallClock::time_point t0) {
  return std::chrono::duration<double, std::micro>(WallClock::now() - t0).count();
}

// A request as it moves through the run.
struct ReqState {
  const Request* r = nullptr;
  int32_t samples_left = 0;  // samples neither finished nor rejected
  bool forked = false;       // samples 1..n-1 exist (or existed)
  bool rejected = false;
};

// A sequence in the cache: one sample of one request.
struct Seq {
  SequenceId id = 0;
  size_t req = 0;
  int32_t sample = 0;
  int32_t priority = 0;
  int64_t target = 0;     // tokens to prefill (prompt, plus output generated before preemption)
  int64_t length = 0;     // committed tokens
  int64_t generated = 0;  // output tokens accepted so far
  int64_t last_step = -1;
  bool decoding() const { return length >= target; }
};

// Arrived and not admitted: a sample to (re)compute from its first token.
struct Waiting {
  int32_t priority = 0;
  double ready_s = 0;
  size_t req = 0;
  int32_t sample = 0;
  int64_t generated = 0;
  bool operator<(const Waiting& o) const {
    return std::tie(o.priority, ready_s, req, sample) <
           std::tie(priority, o.ready_s, o.req, o.sample);
  }
};

class Simulation {
 public:
  Simulation(const std::vector<Request>& requests, Engine& engine, const CacheConfig& cache,
             const SchedulerConfig& config)
      : engine_(engine), cache_(cache), config_(config), bs_(cache.block_size) {
    for (int32_t g = 0; g < cache.num_groups(); ++g) {
      groups_.push_back(cache.group_config(g));
      windowed_ |= groups_.back().sliding_window > 0;
    }
    reqs_.resize(requests.size());
    std::unordered_map<uint64_t, size_t> by_id;
    for (size_t i = 0; i < requests.size(); ++i) {
      reqs_[i].r = &requests[i];
      reqs_[i].samples_left = requests[i].samples;
      by_id[requests[i].id] = i;
      result_.prompt_tokens += static_cast<int64_t>(requests[i].prompt.size());
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      auto dep = requests[i].after != 0 ? by_id.find(requests[i].after) : by_id.end();
      if (dep != by_id.end())
        dependents_[dep->second].push_back(i);
      else
        arrivals_.push({requests[i].arrival_s, i});
    }
    result_.requests = static_cast<int64_t>(requests.size());
  }

  StatusOr<SimResult> run(const ProgressFn& progress) {
    const WallClock::time_point start = WallClock::now();
    while (result_.completed + result_.rejected < result_.requests) {
      const WallClock::time_point t0 = WallClock::now();
      arrive();
      if (running_.empty() && waiting_.empty()) {
        if (arrivals_.empty()) return internal_error("requests wait on requests that never end");
        now_ = std::max(now_, arrivals_.top().first);
        continue;
      }
      StepRecord rec;
      PAGEDKV_RETURN_IF_ERROR(admit());
      PAGEDKV_RETURN_IF_ERROR(step(&rec, t0));
      if (progress) progress(rec, result_);
    }
    result_.wall_s = std::chrono::duration<double>(WallClock::now() - start).count();
    result_.sim_time_s = now_;
    result_.stats = engine_.stats();
    for (size_t g = 0; g < groups_.size() && groups_.size() > 1; ++g) {
      result_.group_stats.push_back(engine_.group_stats(static_cast<int32_t>(g)));
    }
    return std::move(result_);
  }

 private:
  TokenId token_at(const Seq& s, int64_t pos) const {
    const Request& r = *reqs_[s.req].r;
    const int64_t p = static_cast<int64_t>(r.prompt.size());
    return pos < p ? r.prompt[static_cast<size_t>(pos)] : output_token(r.id, s.sample, pos - p);
  }

  void arrive() {
    while (!arrivals_.empty() && arrivals_.top().first <= now_) {
      const auto [t, i] = arrivals_.top();
      arrivals_.pop();
      // Sample 0 prefills the prompt; the other samples are forked from it afterwards.
      waiting_.insert({reqs_[i].r->priority, t, i, 0, 0});
    }
  }

  // Marks one sample of a request done; completes the request (and releases its next turn)
  // when it was the last.
  void sample_done(size_t req, bool rejected) {
    ReqState& q = reqs_[req];
    q.rejected |= rejected;
    if (--q.samples_left > 0) return;
    ++(q.rejected ? result_.rejected : result_.completed);
    auto it = dependents_.find(req);
    if (it == dependents_.end()) return;
    for (size_t d : it->second)
      arrivals_.push({std::max(reqs_[d].r->arrival_s, now_ + reqs_[d].r->think_s), d});
    dependents_.erase(it);
  }

  int64_t blocks_for(int64_t tokens) const { return (tokens + bs_ - 1) / bs_; }

  // Blocks group `g` holds for a sequence of `length` committed tokens reserving `n` more: all
  // of them, or with a window those from the first block the window still needs.
  int64_t need(size_t g, int64_t length, int64_t n) const {
    const int64_t w = groups_[g].sliding_window;
    return blocks_for(length + n) - (w == 0 ? 0 : std::max<int64_t>(0, length - w) / bs_);
  }
  // The most blocks group `g` holds at once for a sequence of `tokens` tokens over its life (a
  // window group: its window plus a step's tokens, prefill chunks included).
  int64_t peak_need(size_t g, int64_t tokens) const {
    const int64_t w = groups_[g].sliding_window;
    if (w == 0) return blocks_for(tokens);
    const int64_t step = std::max<int64_t>(config_.token_budget, config_.spec_tokens + 1);
    return std::min(blocks_for(tokens), blocks_for(w + step) + 1);
  }
  int64_t watermark(size_t g) const {
    return std::max<int64_t>(1, groups_[g].num_device_blocks / 50);
  }

  // Admits waiting samples while the cache can take their prompts: free and evictable device
  // blocks, plus host room for what the cache may offload to make space.
  Status admit() {
    // After a step that had to preempt, admitting more would pin more blocks and preempt again.
    if (preempted_last_step_ && !running_.empty()) return ok_status();
    while (!waiting_.empty() && static_cast<int32_t>(running_.size()) < config_.max_running) {
      const Waiting w = *waiting_.begin();
      const Request& r = *reqs_[w.req].r;
      const int64_t len = static_cast<int64_t>(r.prompt.size()) + w.generated;
      const int64_t spec = r.speculative ? config_.spec_tokens : 0;
      bool never_fits = false;
      for (size_t g = 0; g < groups_.size(); ++g) {
        never_fits |= peak_need(g, static_cast<int64_t>(r.prompt.size()) + r.output_len + spec) >
                      groups_[g].num_device_blocks;
      }
      if (never_fits) {
        waiting_.erase(waiting_.begin());  // can never fit, even alone
        if (w.sample == 0 && r.samples > 1 && !reqs_[w.req].forked) {
          reqs_[w.req].forked = true;
          for (int32_t k = 1; k < r.samples; ++k) sample_done(w.req, true);
        }
        sample_done(w.req, true);
        continue;
      }
      if (!running_.empty()) {
        bool room_left = true;
        for (size_t g = 0; g < groups_.size(); ++g) {
          // Another group's pages the cache's planner finds itself: it offloads, drops or
          // refuses the reserve.
          if (static_cast<int32_t>(g) != engine_.owner_group()) continue;
          const ControlStats st = engine_.group_stats(static_cast<int32_t>(g));
          // Cached host blocks count as room: the cache drops them (least recently used first)
          // when an offload needs their slots.
          const int64_t room = st.device.free_blocks + st.device.cached_blocks +
                               st.host.free_blocks + st.host.cached_blocks;
          room_left &= room >= peak_need(g, len) + watermark(g);
        }
        if (!room_left) break;
      }
      Seq s;
      s.id = next_id_++;
      s.req = w.req;
      s.sample = w.sample;
      s.priority = r.priority;
      s.target = len;
      s.generated = w.generated;
      std::vector<TokenId> prompt(static_cast<size_t>(len));
      for (int64_t p = 0; p < len; ++p) prompt[static_cast<size_t>(p)] = token_at(s, p);
      SequenceOptions options;
      options.priority = r.priority;
      options.ns = r.ns;
      PAGEDKV_RETURN_IF_ERROR(engine_.fetch_from_storage(prompt, options).status());
      PAGEDKV_ASSIGN_OR_RETURN(s.length, engine_.add_sequence(s.id, prompt, options));
      result_.lookup_blocks += len / bs_;
      result_.cached_tokens += s.length;
      ++result_.sequences;
      waiting_.erase(waiting_.begin());
      running_.push_back(s);
    }
    return ok_status();
  }

  // Requeues a sequence for recompute (it keeps the output it had produced).
  void requeue(const Seq& s) { waiting_.insert({s.priority, now_, s.req, s.sample, s.generated}); }

  Seq* find(SequenceId id) {
    for (Seq& s : running_)
      if (s.id == id) return &s;
    return nullptr;
  }

  void remove(SequenceId id) {
    running_.erase(
        std::remove_if(running_.begin(), running_.end(), [id](const Seq& s) { return s.id == id; }),
        running_.end());
  }

  // Requeues the sequences the cache dropped (not offloaded) to make room, for recompute.
  void absorb_drops() {
    for (SequenceId id : engine_.drain_evicted()) {
      if (const Seq* s = find(id)) {
        ++result_.dropped;
        requeue(*s);
        remove(id);
      }
    }
  }

  struct Item {
    SequenceId id;
    int64_t n;
  };

  Status step(StepRecord* rec, WallClock::time_point t0) {
    const int64_t preemptions_before = result_.preemptions;
    // Pick the batch: higher priority first, then first come first served (as vLLM's running
    // queue), while the batch's blocks fit in the device pool. Sequences left out stay inactive,
    // so the cache may offload them when the batch needs room; round-robin instead would move
    // every sequence between the tiers on every step.
    std::vector<Seq*> order;
    for (Seq& s : running_) order.push_back(&s);
    std::sort(order.begin(), order.end(), [](const Seq* a, const Seq* b) {
      return std::tie(b->priority, a->id) < std::tie(a->priority, b->id);
    });
    std::vector<Item> batch;
    int64_t budget = config_.token_budget;
    std::vector<int64_t> room;  // per group
    for (size_t g = 0; g < groups_.size(); ++g)
      room.push_back(groups_[g].num_device_blocks - watermark(g));
    for (Seq* s : order) {
      if (static_cast<int32_t>(batch.size()) >= config_.max_batch || budget == 0) break;
      const Request& r = *reqs_[s->req].r;
      int64_t n = 0;
      if (!s->decoding()) {
        n = std::min(s->target - s->length, budget);
      } else {
        n = r.speculative ? std::min<int64_t>(config_.spec_tokens + 1, r.output_len - s->generated)
                          : 1;
        if (n > budget) continue;
      }
      // Blocks it needs, counting shared blocks once per sharer: an upper bound.
      bool fits = true;
      for (size_t g = 0; g < groups_.size(); ++g) fits &= need(g, s->length, n) <= room[g];
      if (!batch.empty() && !fits) continue;
      for (size_t g = 0; g < groups_.size(); ++g) room[g] -= need(g, s->length, n);
      budget -= n;
      batch.push_back({s->id, n});
    }
    std::vector<SequenceId> ids;
    for (const Item& it : batch) ids.push_back(it.id);
    PAGEDKV_RETURN_IF_ERROR(engine_.set_active(ids));

    // Reserve. On kResourceExhausted, preempt (erase, recompute later) the lowest-priority,
    // latest-admitted sequence, preferring ones outside the batch: an admitted sequence whose
    // blocks are all shared prefix blocks cannot be offloaded, and erasing it is what releases
    // them. Inside the batch the victim may be the sequence being reserved.
    for (size_t i = 0; i < batch.size();) {
      const Status s = engine_.reserve(batch[i].id, batch[i].n);
      // Sequences the cache dropped for this reserve are gone now: they must not be chosen as
      // victims below (erasing one would be kNotFound).
      absorb_drops();
      if (s.ok()) {
        ++i;
        continue;
      }
      if (s.code() != StatusCode::kResourceExhausted) return s;
      auto later = [](const Seq& a, const Seq& b) {  // a is the better victim
        return std::tie(a.priority, b.id) < std::tie(b.priority, a.id);
      };
      const Seq* outside = nullptr;
      for (const Seq& q : running_) {
        const bool in_batch = std::find(ids.begin(), ids.end(), q.id) != ids.end();
        if (!in_batch && (outside == nullptr || later(q, *outside))) outside = &q;
      }
      if (outside != nullptr) {
        const Seq v = *outside;
        PAGEDKV_RETURN_IF_ERROR(engine_.erase(v.id));
        ++result_.preemptions;
        requeue(v);
        remove(v.id);
        continue;
      }
      size_t victim = 0;
      for (size_t k = 1; k < batch.size(); ++k)
        if (later(*find(batch[k].id), *find(batch[victim].id))) victim = k;
      const Seq v = *find(batch[victim].id);
      PAGEDKV_RETURN_IF_ERROR(engine_.erase(v.id));
      ++result_.preemptions;
      requeue(v);
      remove(v.id);
      batch.erase(batch.begin() + static_cast<std::ptrdiff_t>(victim));
      ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(victim));
      PAGEDKV_RETURN_IF_ERROR(engine_.set_active(ids));
      if (victim < i) --i;
    }
    if (!ids.empty()) PAGEDKV_RETURN_IF_ERROR(engine_.build_batch(ids));

    // The data phase, bracketed by synchronize so its wall time covers the kernels and any
    // transfer still running.
    const WallClock::time_point d0 = WallClock::now();
    for (const Item& it : batch) PAGEDKV_RETURN_IF_ERROR(engine_.write(it.id));
    PAGEDKV_RETURN_IF_ERROR(engine_.synchronize());
    rec->data_us = micros_since(d0);

    int64_t tokens = 0;
    for (const Item& it : batch) {
      Seq* s = find(it.id);
      if (s == nullptr) return internal_error("batch member " + std::to_string(it.id) + " lost");
      PAGEDKV_RETURN_IF_ERROR(advance(s, it.n, rec));
      tokens += it.n;
    }
    // Forks and finishes happen after the batch loop, since they change running_.
    for (size_t i = 0; i < running_.size();) {
      Seq& s = running_[i];
      const Request& r = *reqs_[s.req].r;
      if (s.sample == 0 && s.decoding() && r.samples > 1 && !reqs_[s.req].forked) {
        reqs_[s.req].forked = true;
        const Seq parent = s;  // running_ grows below, which moves `s`
        for (int32_t k = 1; k < r.samples; ++k) {
          Seq c = parent;
          c.id = next_id_++;
          c.sample = k;
          PAGEDKV_RETURN_IF_ERROR(engine_.fork(parent.id, c.id));
          ++result_.forks;
          ++result_.sequences;
          running_.push_back(c);
        }
      }
      Seq& t = running_[i];
      if (t.decoding() && t.generated >= r.output_len) {
        PAGEDKV_RETURN_IF_ERROR(engine_.finish(t.id));
        const size_t req = t.req;
        running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
        sample_done(req, false);
        continue;
      }
      ++i;
    }
    if (config_.check_invariants) PAGEDKV_RETURN_IF_ERROR(engine_.check_invariants());
    preempted_last_step_ = result_.preemptions != preemptions_before;

    now_ += (config_.step_ms + config_.token_ms * static_cast<double>(tokens)) / 1000.0;
    const ControlStats st = engine_.stats();
    rec->step = result_.steps++;
    rec->sim_time_s = now_;
    rec->batch = static_cast<int32_t>(batch.size());
    rec->running = static_cast<int32_t>(running_.size());
    rec->waiting = static_cast<int32_t>(waiting_.size());
    rec->device_used = st.device.used_blocks;
    rec->device_cached = st.device.cached_blocks;
    rec->device_free = st.device.free_blocks;
    rec->host_used = st.host.used_blocks;
    rec->host_cached = st.host.cached_blocks;
    rec->hit_rate = st.prefix_query_tokens > 0 ? static_cast<double>(st.prefix_hit_tokens) /
                                                     static_cast<double>(st.prefix_query_tokens)
                                               : 0.0;
    rec->offloaded_blocks = st.blocks_offloaded;
    rec->restored_blocks = st.blocks_restored;
    rec->evicted_blocks = st.blocks_evicted;
    rec->preemptions = result_.preemptions;
    rec->stats = st;
    rec->plan_us = std::max(0.0, micros_since(t0) - rec->data_us);
    result_.timeline.push_back(*rec);
    return ok_status();
  }

  // Commits the n tokens a sequence computed this step; a speculative decode commits its draft
  // tokens and rolls the rejected ones back.
  Status advance(Seq* s, int64_t n, StepRecord* rec) {
    const Request& r = *reqs_[s->req].r;
    s->last_step = result_.steps;
    std::vector<TokenId> tokens(static_cast<size_t>(n));
    if (!s->decoding()) {
      for (int64_t k = 0; k < n; ++k) tokens[static_cast<size_t>(k)] = token_at(*s, s->length + k);
      PAGEDKV_RETURN_IF_ERROR(engine_.commit(s->id, tokens));
      s->length += n;
      result_.prefill_tokens += n;
      rec->prefill_tokens += n;
      return ok_status();
    }
    // Accepted drafts: each accepted in turn with probability spec_accept; the verified step
    // always yields one token, so `keep` is accepted + 1 (at most n).
    int64_t keep = n;
    if (n > 1) {
      Rng rng(mix64(r.id * 131 + static_cast<uint64_t>(s->sample) * 7919 +
                    static_cast<uint64_t>(s->generated)));
      keep = 1;
      while (keep < n && rng.uniform() < config_.spec_accept) ++keep;
    }
    const int64_t p = static_cast<int64_t>(r.prompt.size());
    for (int64_t k = 0; k < n; ++k) {
      const int64_t pos = s->length + k;
      // Rejected drafts are tokens the target model would not have produced.
      tokens[static_cast<size_t>(k)] =
          k < keep ? token_at(*s, pos) : output_token(r.id, s->sample + 4096, pos - p);
    }
    if (windowed_ && keep < n) {
      // A window group releases the blocks that fall out of its window at commit, so rolling
      // the drafts back after committing them could need a released block. Instead only the
      // accepted tokens are committed and the rollback to that length drops the rest of the
      // reservation (the rejected drafts never enter the prefix index).
      tokens.resize(static_cast<size_t>(keep));
    }
    PAGEDKV_RETURN_IF_ERROR(engine_.commit(s->id, tokens));
    if (keep < n) {
      PAGEDKV_RETURN_IF_ERROR(engine_.rollback(s->id, s->length + keep));
      ++result_.rollbacks;
      result_.rejected_tokens += n - keep;
    }
    if (n > 1) result_.draft_tokens += n - 1;
    s->length += keep;
    s->generated += keep;
    result_.output_tokens += keep;
    rec->decode_tokens += n;
    return ok_status();
  }

  Engine& engine_;
  const CacheConfig& cache_;
  const SchedulerConfig& config_;
  const int64_t bs_;
  std::vector<CacheConfig> groups_;  // group_config of each KV group (the config without groups)
  bool windowed_ = false;            // some group has a sliding window
  std::vector<ReqState> reqs_;
  std::unordered_map<size_t, std::vector<size_t>> dependents_;
  using Arrival = std::pair<double, size_t>;
  std::priority_queue<Arrival, std::vector<Arrival>, std::greater<Arrival>> arrivals_;
  std::set<Waiting> waiting_;
  std::vector<Seq> running_;
  SequenceId next_id_ = 1;
  double now_ = 0;
  bool preempted_last_step_ = false;
  SimResult result_;
};

}  // namespace

Status SchedulerConfig::validate() const {
  if (token_budget < 1) return invalid_argument("token-budget: must be >= 1");
  if (max_batch < 1) return invalid_argument("max-batch: must be >= 1");
  if (max_running < 1) return invalid_argument("max-running: must be >= 1");
  if (spec_tokens < 1 || spec_tokens > 64) return invalid_argument("spec-tokens: not in [1,64]");
  if (!(spec_accept >= 0 && spec_accept <= 1)) return invalid_argument("spec-accept: not in [0,1]");
  if (!(step_ms >= 0) || !(token_ms >= 0))
    return invalid_argument("step-ms/token-ms: must be >= 0");
  if (step_ms == 0 && token_ms == 0)
    return invalid_argument("step-ms/token-ms: one must be > 0 so that simulated time advances");
  return ok_status();
}

StatusOr<SimResult> run_simulation(const std::vector<Request>& requests, Engine& engine,
                                   const CacheConfig& cache, const SchedulerConfig& config,
                                   const ProgressFn& progress) {
  PAGEDKV_RETURN_IF_ERROR(config.validate());
  if (config.token_budget < config.spec_tokens + 1)
    return invalid_argument("token-budget: must be > spec-tokens");
  Simulation sim(requests, engine, cache, config);
  return sim.run(progress);
}

}  // namespace sim
}  // namespace pagedkv
