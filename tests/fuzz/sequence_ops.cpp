// The per-sequence calls of the KvCache fuzz harness (fuzz_harness.hpp): one method per opcode,
// each decoding its argument bytes, making the call, updating the reference model on success
// and handing the status to after().
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "fuzz_harness.hpp"

namespace pagedkv::fuzz {

void Harness::add(const Snapshot& before) {
  const SequenceId id = pick_id();
  const uint8_t shape = in_.u8();
  std::vector<TokenId> prompt;
  // A shared system prompt makes prefix hits likely; the tail makes prompts differ.
  for (int i = 0; i < (shape & 7) * 2; ++i) prompt.push_back(static_cast<TokenId>(i % 5));
  const int tail = (shape >> 3) % 6;
  for (int i = 0; i < tail; ++i) prompt.push_back(pick_token());
  if (shape == 255) prompt.assign(kMaxSeqLen + 3, 1);  // longer than any sequence may be
  SequenceOptions opts;
  const uint8_t o = in_.u8();
  opts.priority = static_cast<int32_t>(o % 4) - 1;
  opts.ns = (o >> 2) % 2;
  opts.retention_priority = (o & 0x80) ? 120 : static_cast<int32_t>(o % 101);
  opts.retention_duration_ns = (o & 0x40) ? 1000 : 0;
  if (tracing()) {
    std::string p;
    for (TokenId t : prompt) p += std::to_string(t);
    note("(%s, prompt[%zu] %s, priority %d, ns %llu, retention %d/%lld)", id_name(id).c_str(),
         prompt.size(), p.c_str(), opts.priority, static_cast<unsigned long long>(opts.ns),
         opts.retention_priority, static_cast<long long>(opts.retention_duration_ns));
  }
  if (store_ != nullptr) {
    const std::string what = what_;
    fetch_from_storage(prompt, opts);
    what_ = what;
  }
  const Snapshot at_add = store_ != nullptr ? snapshot() : before;
  auto r = cache_->add_sequence(id, prompt, opts);
  if (r.ok()) {
    if (*r < 0 || *r > static_cast<int64_t>(prompt.size())) fail("add_sequence: bad hit length");
    if (tracing()) note("%s = %lld cached", what_.c_str(), static_cast<long long>(*r));
    ModelSeq m;
    m.tokens.assign(prompt.begin(), prompt.begin() + *r);
    // Bytes of a prefix hit are only as good as what the cached blocks were written with.
    model_[id] = std::move(m);
  }
  after("add_sequence", r.status(), at_add);
}

void Harness::fetch_from_storage(const std::vector<TokenId>& prompt, const SequenceOptions& opts) {
  const Snapshot before = snapshot();
  note("(prompt[%zu])", prompt.size());
  const StatusOr<int64_t> r = cache_->fetch_from_storage(prompt, opts);
  if (r.ok() && (*r < 0 || *r > static_cast<int64_t>(prompt.size()))) {
    fail(where("fetch_from_storage") + ": " + std::to_string(*r) + " blocks");
  }
  // It may drop cached host blocks for its slots (kept, like a plan's drops, when it fails).
  after("fetch_from_storage", r.status(), before, /*moves_tiers=*/true);
  const Status flushed = own_call("flush_storage", [&] { return cache_->flush_storage(); });
  if (!flushed.ok()) fail(where("flush_storage") + ": " + flushed.to_string());
  if (cache_->storage_in_flight() != 0) fail(where("flush_storage") + ": reads still in flight");
}

void Harness::reserve(const Snapshot& before) {
  const SequenceId id = pick_id();
  const int64_t n = pick_count();
  note("(%s, %lld)", id_name(id).c_str(), static_cast<long long>(n));
  auto r = cache_->reserve(id, n);
  if (r.ok()) {
    if (static_cast<int64_t>(r->size()) != n) fail("reserve: slot count differs from n");
    ModelSeq& m = model_.at(id);
    m.planned.clear();
    for (int64_t i = 0; i < n; ++i) m.planned.push_back(pick_token());
    m.written_layers = 0;
  }
  after("reserve", r.status(), before, /*moves_tiers=*/true);
}

void Harness::write(const Snapshot& step_before) {
  const SequenceId id = pick_id();
  const uint8_t a = in_.u8();
  int32_t layer = a % 4;  // 3 is out of range for every config with fewer layers
  if (a & 0x80) layer = (a & 0x40) ? -1 : INT32_MAX;
  const WriteHow how = pick_write_how();
  const DType dtype = how.dtype;
  const int64_t stride = how.stride;
  const bool null_key = how.null_key, null_value = how.null_value, misaligned = how.misaligned;
  auto mit = model_.find(id);
  if (mit != model_.end() && (dtype == DType::kFloat16 || dtype == DType::kFloat32) &&
      stride >= 0) {
    fill_inputs(mit->second, layer >= 0 && layer < 4 ? layer : 0, dtype,
                stride == 0 ? row_ : stride);
  }
  // fill_inputs' synchronize may have used up an armed fault: count from here.
  Snapshot before = step_before;
  before.injected = faults_->injected();
  const void* k = null_key ? nullptr : static_cast<char*>(in_k_) + (misaligned ? 1 : 0);
  const void* v = null_value ? nullptr : in_v_;
  note("(%s, layer %d, dtype %d, stride %lld%s%s%s)", id_name(id).c_str(), layer,
       static_cast<int>(dtype), static_cast<long long>(stride), null_key ? ", null key" : "",
       null_value ? ", null value" : "", misaligned ? ", misaligned key" : "");
  const Status s = cache_->write_kv(id, layer, k, v, dtype, stride);
  if (s.ok() && mit != model_.end()) {
    ModelSeq& m = mit->second;
    if (stride < 0 || (stride > 0 && stride < row_)) fail("write_kv accepted a bad row_stride");
    if (dtype == DType::kFloat16 || dtype == DType::kFloat32) {
      m.written_layers |= 1u << layer;
    } else {
      trusted_ = false;  // bf16 inputs: the bytes no longer follow the fp16 model
    }
  }
  after("write_kv", s, before);
}

void Harness::commit(const Snapshot& before) {
  const SequenceId id = pick_id();
  const int64_t n = pick_count();
  const uint8_t wrong = in_.u8();
  auto mit = model_.find(id);
  std::vector<TokenId> tokens;
  if (n >= 0 && n <= kMaxSeqLen + 1) {
    for (int64_t i = 0; i < n; ++i) {
      const bool have = mit != model_.end() && i < static_cast<int64_t>(mit->second.planned.size());
      tokens.push_back(have ? mit->second.planned[static_cast<size_t>(i)] : 0);
    }
    if (wrong == 7 && !tokens.empty()) tokens[0] += 1;  // ids that differ from what was written
  }
  note("(%s, %zu tokens%s)", id_name(id).c_str(), tokens.size(),
       wrong == 7 && !tokens.empty() ? ", first one wrong" : "");
  const Status s = cache_->commit(id, tokens);
  if (s.ok() && mit != model_.end()) {
    ModelSeq& m = mit->second;
    const uint32_t all = (1u << config_.num_layers) - 1;
    if (!tokens.empty() && (m.written_layers != all || wrong == 7)) trusted_ = false;
    if (tokens.size() > m.planned.size()) fail("commit accepted more than reserved");
    m.tokens.insert(m.tokens.end(), tokens.begin(), tokens.end());
    m.planned.erase(m.planned.begin(), m.planned.begin() + static_cast<long>(tokens.size()));
  }
  after("commit", s, before);
}

void Harness::rollback(const Snapshot& before) {
  const SequenceId id = pick_id();
  const int64_t len = pick_count();
  note("(%s, %lld)", id_name(id).c_str(), static_cast<long long>(len));
  const Status s = cache_->rollback(id, len);
  if (s.ok()) {
    ModelSeq& m = model_.at(id);
    if (len < 0 || len > static_cast<int64_t>(m.tokens.size()))
      fail("rollback accepted " + std::to_string(len));
    m.tokens.resize(static_cast<size_t>(len));
    m.planned.clear();
    m.written_layers = 0;
  }
  after("rollback", s, before);
}

void Harness::fork(const Snapshot& before) {
  const SequenceId parent = pick_id();
  const SequenceId child = pick_id();
  note("(%s -> %s)", id_name(parent).c_str(), id_name(child).c_str());
  const Status s = cache_->fork(parent, child);
  if (s.ok()) {
    ModelSeq m;
    m.tokens = model_.at(parent).tokens;
    model_[child] = std::move(m);
  }
  after("fork", s, before);
}

void Harness::remove(const Snapshot& before, bool finish) {
  const SequenceId id = pick_id();
  note("(%s)", id_name(id).c_str());
  const Status s = finish ? cache_->finish(id) : cache_->erase(id);
  if (s.ok()) model_.erase(id);
  after(finish ? "finish" : "erase", s, before);
}

void Harness::set_active(const Snapshot& before) {
  const std::vector<SequenceId> ids = pick_ids();
  note("(%s)", ids_string(ids).c_str());
  after("set_active", cache_->set_active(ids), before);
}

void Harness::set_priority(const Snapshot& before) {
  const SequenceId id = pick_id();
  const uint8_t p = in_.u8();
  const int32_t priority = p == 255 ? INT32_MIN : p % 5 - 2;
  now_ns_ += 600;  // let retention deadlines pass now and then
  note("(%s, %d)", id_name(id).c_str(), priority);
  after("set_priority", cache_->set_priority(id, priority), before);
}

void Harness::offload(const Snapshot& before) {
  const SequenceId id = pick_id();
  note("(%s)", id_name(id).c_str());
  after("offload", cache_->offload(id), before, /*moves_tiers=*/true);
}

void Harness::restore(const Snapshot& before) {
  const SequenceId id = pick_id();
  note("(%s)", id_name(id).c_str());
  after("restore", cache_->restore(id), before, /*moves_tiers=*/true);
}

// prefetch(ids): restores, in order, each offloaded sequence whose host blocks fit into the
// free and evictable device blocks (KvCache::prefetch), never offloading or dropping anyone.
void Harness::prefetch(const Snapshot& before) {
  const std::vector<SequenceId> ids = pick_ids();
  note("(%s)", ids_string(ids).c_str());
  const Status s = cache_->prefetch(ids);
  if (s.ok()) {
    const std::string wrong = fuzz::check_prefetch(ids, before, snapshot());
    if (!wrong.empty()) fail(where("prefetch") + ":" + wrong);
  }
  after("prefetch", s, before, /*moves_tiers=*/true);
}

void Harness::build_batch(const Snapshot& before) {
  const std::vector<SequenceId> ids = pick_ids();
  BatchOptions o;
  const uint8_t b = in_.u8();
  o.build_csr = b & 1;
  o.pad_slots_to = (b & 2) ? (b >> 2) % 20 : 0;
  if (b == 255) o.pad_slots_to = -1;
  note("(%s, csr %d, pad %lld)", ids_string(ids).c_str(), static_cast<int>(o.build_csr),
       static_cast<long long>(o.pad_slots_to));
  auto r = cache_->build_batch(ids, o);
  after("build_batch", r.status(), before);
  if (r.ok()) record_batch(ids, o, *r);  // write_batch writes through it
}

// Reserve, write every layer and commit in one opcode, so short inputs reach deep states.
void Harness::extend(const Snapshot& before) {
  const SequenceId id = pick_id();
  const int64_t n = 1 + in_.u8() % 8;
  note("(%s, %lld): reserve", id_name(id).c_str(), static_cast<long long>(n));
  auto r = cache_->reserve(id, n);
  if (!r.ok()) {
    after("extend", r.status(), before, /*moves_tiers=*/true);
    return;
  }
  ModelSeq& m = model_.at(id);
  m.planned.clear();
  for (int64_t i = 0; i < n; ++i) m.planned.push_back(pick_token());
  m.written_layers = 0;
  after("extend", r.status(), before, /*moves_tiers=*/true);
  if (model_.count(id) == 0) return;  // cannot happen: a reserve never drops its own sequence
  for (int32_t l = 0; l < config_.num_layers; ++l) {
    fill_inputs(model_.at(id), l, DType::kFloat16, row_);
    Status s;
    // An injected fault fails the write and changes nothing; it is one-shot: retry once.
    for (int attempt = 0; attempt < 2; ++attempt) {
      const Snapshot b = snapshot();
      note("(%s): write_kv layer %d", id_name(id).c_str(), l);
      s = cache_->write_kv(id, l, in_k_, in_v_, DType::kFloat16, 0);
      if (!after("extend", s, b)) break;
    }
    if (!s.ok()) fail(where("extend") + ": write_kv: " + s.to_string());
    model_.at(id).written_layers |= 1u << l;
  }
  const Snapshot b = snapshot();
  ModelSeq& m2 = model_.at(id);
  const std::vector<TokenId> tokens = m2.planned;
  note("(%s): commit", id_name(id).c_str());
  const Status s = cache_->commit(id, tokens);
  if (s.ok()) {
    m2.tokens.insert(m2.tokens.end(), tokens.begin(), tokens.end());
    m2.planned.clear();
  }
  after("extend", s, b);
}

void Harness::bad_gather(const Snapshot& before) {
  const SequenceId id = pick_id();
  const uint8_t a = in_.u8(), b = in_.u8();
  int32_t layer = a % 4;
  if (a & 0x80) layer = (a & 0x40) ? -1 : INT32_MAX;
  static constexpr int64_t kPos[] = {0, 1, -1, INT64_MAX, INT64_MIN, 3, kMaxSeqLen, 2};
  const int64_t begin = kPos[b % 8];
  const int64_t num = kPos[(b >> 3) % 8];
  const DType dtype = (b & 0x40) ? static_cast<DType>(7) : DType::kFloat32;
  const PackedLayout layout = (b & 0x80) ? static_cast<PackedLayout>(5) : PackedLayout::kHeadMajor;
  void* k = (a & 0x20) ? nullptr : out_k_;
  void* v = (a & 0x10) ? nullptr : out_v_;
  note("(%s, layer %d, begin %lld, num %lld, dtype %d, layout %d%s%s)", id_name(id).c_str(), layer,
       static_cast<long long>(begin), static_cast<long long>(num), static_cast<int>(dtype),
       static_cast<int>(layout), k == nullptr ? ", null key" : "",
       v == nullptr ? ", null value" : "");
  const Status s = cache_->gather_layer(id, layer, k, v, dtype, layout, begin, num);
  after("gather_layer", s, before);
}

}  // namespace pagedkv::fuzz
