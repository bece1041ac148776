// The batched calls of the KvCache fuzz harness (fuzz_harness.hpp): reserve_batch, a decode step
// (reserve_batch, build_batch, write_kv_batch per layer or for all layers, commit_batch), writes
// through the last built batch (stale or current, with fuzzed arguments), commit_batch with
// fuzzed ids, counts and tokens, and drain_events.
//
// A DeviceBatch goes stale with any successful call that KvCache counts as changing a batch
// (reserve, commit, rollback, tier move, fork, finish, erase, add_sequence, build_batch);
// write_kv_batch through it must then be kFailedPrecondition and change nothing. Through the
// current batch it must not be, and it writes the model's K/V of each row's (position, token).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "fuzz_harness.hpp"
#include "pagedkv/dtype.hpp"
#include "runtime/kv_model.hpp"

namespace pagedkv::fuzz {

namespace {

// Calls that move no block and no reservation: KvCache keeps a batch current across them.
bool keeps_batch(const char* name) {
  static constexpr const char* kKeep[] = {
      "write_kv",     "write_kv_batch", "write_kv_batch_all_layers", "set_active",   "set_priority",
      "gather_layer", "drain_events",   "fetch_from_storage",        "flush_storage"};
  for (const char* k : kKeep)
    if (std::strcmp(name, k) == 0) return true;
  return false;
}

bool model_dtype(DType t) { return t == DType::kFloat16 || t == DType::kFloat32; }

// Written into padding rows, which write_kv_batch must skip: no model value is negative.
constexpr float kPadding = -3.0f;

}  // namespace

void Harness::touch_batch(const char* name, const Status& st) {
  if (!batch_.built || keeps_batch(name)) return;
  if (st.ok()) {
    batch_.stale = true;
  } else {
    batch_.maybe_stale = true;
  }
}

// 208-211 reserve_batch, 212-215 decode step, 216-218 write_kv_batch through the last batch,
// 219 drain_events, 220-223 commit_batch.
void Harness::batch_op(uint8_t byte, const Snapshot& before) {
  const int op = byte - kBatchOp;
  switch (op / 4) {
    case 0:
      return reserve_batch(before);
    case 1:
      return decode_step(before);
    case 2:
      return op == 11 ? drain_events(before) : write_batch(before);
    default:
      return commit_batch(before);
  }
}

std::vector<SequenceId> Harness::pick_batch_ids() {
  const uint8_t n = in_.u8() % 5;
  std::vector<SequenceId> ids;
  for (int i = 0; i < n; ++i) ids.push_back(pick_id());
  return ids;
}

void Harness::check_batch_slots(const std::vector<SequenceId>& ids, int64_t n_each,
                                const std::vector<int64_t>& slots) {
  if (static_cast<int64_t>(slots.size()) != static_cast<int64_t>(ids.size()) * n_each) {
    fail(where("reserve_batch") + ": " + std::to_string(slots.size()) + " slots");
  }
  const int64_t bs = config_.block_size;
  std::set<int64_t> seen;
  for (size_t i = 0; i < ids.size(); ++i) {
    // Never takes a member: each is still there, on the device, its new slots in its blocks.
    const auto blocks = cache_->block_locations(ids[i]);
    if (!blocks.ok()) fail(where("reserve_batch") + ": took its member " + id_name(ids[i]));
    const int64_t len = cache_->length(ids[i]).value();
    for (int64_t j = 0; j < n_each; ++j) {
      const int64_t pos = len + j;
      const size_t b = static_cast<size_t>(pos / bs);
      const int64_t got = slots[i * static_cast<size_t>(n_each) + static_cast<size_t>(j)];
      if (b >= blocks->size() || (*blocks)[b].tier != Tier::kDevice ||
          got != (*blocks)[b].block * bs + pos % bs) {
        std::string table;
        for (const BlockLocation& l : *blocks)
          table += (l.tier == Tier::kDevice ? " d" : " h") + std::to_string(l.block);
        fail(where("reserve_batch") + ": member " + id_name(ids[i]) + " position " +
             std::to_string(pos) + " got slot " + std::to_string(got) + ", its blocks [" + table +
             " ]");
      }
      if (!seen.insert(got).second) {
        fail(where("reserve_batch") + ": slot " + std::to_string(got) + " given twice");
      }
    }
  }
}

void Harness::reserve_batch(const Snapshot& before) {
  const std::vector<SequenceId> ids = pick_batch_ids();
  const int64_t n = pick_count();
  note("(%s, %lld each)", ids_string(ids).c_str(), static_cast<long long>(n));
  auto r = cache_->reserve_batch(ids, n);
  if (r.ok()) {
    std::set<SequenceId> distinct;
    for (SequenceId id : ids) {
      auto mit = model_.find(id);
      if (!distinct.insert(id).second || mit == model_.end() || n < 0 ||
          n > kMaxSeqLen - static_cast<int64_t>(mit->second.tokens.size())) {
        fail(where("reserve_batch") + ": accepted member " + id_name(id));
      }
    }
    check_batch_slots(ids, n, *r);
    for (SequenceId id : ids) {
      ModelSeq& m = model_.at(id);
      m.planned.clear();
      for (int64_t i = 0; i < n; ++i) m.planned.push_back(pick_token());
      m.written_layers = 0;
    }
  }
  after("reserve_batch", r.status(), before, /*moves_tiers=*/true);
}

void Harness::record_batch(const std::vector<SequenceId>& ids, const BatchOptions& options,
                           const DeviceBatch& batch) {
  BatchRecord rec;
  rec.built = true;
  rec.batch = batch;
  rec.ids = ids;
  const BatchMetadata& md = *batch.host;
  const int64_t bs = config_.block_size;
  const size_t width = static_cast<size_t>(md.max_blocks);
  auto wrong = [&](const std::string& what) {
    fail(where("build_batch") + " " + ids_string(ids) + ": metadata: " + what);
  };
  if (md.batch_size != static_cast<int32_t>(ids.size()) ||
      md.block_tables.size() != ids.size() * width || md.seq_lens.size() != ids.size()) {
    wrong("batch size " + std::to_string(md.batch_size));
  }
  if ((batch.indptr != nullptr) != options.build_csr) wrong("CSR arrays without build_csr");
  if (options.build_csr && md.indptr.size() != ids.size() + 1) wrong("indptr size");
  for (size_t r = 0; r < ids.size(); ++r) {
    const ModelSeq& m = model_.at(ids[r]);
    const std::vector<BlockLocation> blocks = cache_->block_locations(ids[r]).value();
    const int64_t len = static_cast<int64_t>(m.tokens.size());
    const int64_t pend = static_cast<int64_t>(m.planned.size());
    const std::string row = "row " + std::to_string(r) + " (" + id_name(ids[r]) + ")";
    if (md.seq_lens[r] != len + pend) wrong(row + " seq_len " + std::to_string(md.seq_lens[r]));
    if (blocks.size() > width) wrong(row + ": " + std::to_string(blocks.size()) + " blocks");
    for (size_t i = 0; i < width; ++i) {
      const int32_t want = i < blocks.size() ? blocks[i].block : -1;
      if (i < blocks.size() && blocks[i].tier != Tier::kDevice) wrong(row + " is offloaded");
      if (md.block_tables[r * width + i] != want) {
        wrong(row + " block " + std::to_string(i) + ": " +
              std::to_string(md.block_tables[r * width + i]) + ", sequence has " +
              std::to_string(want));
      }
    }
    if (options.build_csr) {
      const int32_t from = md.indptr[r];
      if (md.indptr[r + 1] - from != static_cast<int32_t>(blocks.size())) wrong(row + " indptr");
      for (size_t i = 0; i < blocks.size(); ++i)
        if (md.indices[static_cast<size_t>(from) + i] != blocks[i].block) wrong(row + " indices");
      const int64_t total = len + pend;
      if (md.last_page_len[r] != (total == 0 ? 0 : (total - 1) % bs + 1)) {
        wrong(row + " last_page_len");
      }
    }
    for (int64_t j = 0; j < pend; ++j) {
      const int64_t pos = len + j;
      const int64_t want = blocks[static_cast<size_t>(pos / bs)].block * bs + pos % bs;
      if (rec.rows.size() >= md.slot_mapping.size() || md.slot_mapping[rec.rows.size()] != want) {
        wrong(row + " position " + std::to_string(pos) + ": not slot " + std::to_string(want));
      }
      rec.rows.emplace_back(ids[r], j);
    }
  }
  const size_t padded =
      std::max(rec.rows.size(), static_cast<size_t>(std::max<int64_t>(options.pad_slots_to, 0)));
  if (md.slot_mapping.size() != padded) {
    wrong(std::to_string(md.slot_mapping.size()) + " slots, not " + std::to_string(padded));
  }
  for (size_t i = rec.rows.size(); i < md.slot_mapping.size(); ++i)
    if (md.slot_mapping[i] != -1) wrong("padding slot " + std::to_string(i) + " is not -1");
  rec.padded_rows = static_cast<int64_t>(md.slot_mapping.size());
  rec.slots = md.slot_mapping;
  batch_ = std::move(rec);
}

bool Harness::fill_batch_inputs(const BatchRecord& rec, int32_t first_layer, int32_t num_layers,
                                const WriteHow& how, int64_t layer_stride) {
  // Kernels read inputs asynchronously: earlier ones must be done before we overwrite them.
  sync();
  if (batch_k_ == nullptr) {  // the call gets real pointers even when nothing is filled
    batch_bytes_ = 4096;
    batch_k_ = alloc(batch_bytes_);
    batch_v_ = alloc(batch_bytes_);
  }
  if (!model_dtype(how.dtype) || how.stride < 0) return false;
  const int64_t rows = rec.padded_rows;
  const int64_t stride = how.stride == 0 ? row_ : how.stride;
  const int64_t ls = layer_stride == 0 ? rows * stride : layer_stride;
  if (ls < 0 || ls > (int64_t{1} << 22)) return false;  // write_kv_batch_all_layers must refuse
  const int64_t elems = (num_layers - 1) * ls + rows * stride + row_;
  const size_t bytes = static_cast<size_t>(elems) * 4 + 64;
  if (bytes > batch_bytes_) {
    // The old buffers stay allocated until the input ends: no kernel can still be reading them
    // (synchronized above), but freeing would need the same care; they are small.
    batch_bytes_ = std::max(bytes, 2 * batch_bytes_);
    batch_k_ = alloc(batch_bytes_);
    batch_v_ = alloc(batch_bytes_);
  }
  for (int32_t l = 0; l < num_layers; ++l) {
    const int32_t layer = first_layer + l;
    for (int part = 0; part < 2; ++part) {
      void* dst = part == 0 ? batch_k_ : batch_v_;
      // Each member's rows as the single-sequence write would hand them over (model_rows).
      std::map<SequenceId, std::vector<uint16_t>> member_rows;
      for (int64_t r = 0; r < rows; ++r) {
        const uint16_t* src = nullptr;
        if (r < static_cast<int64_t>(rec.rows.size())) {
          const auto [id, j] = rec.rows[static_cast<size_t>(r)];
          auto mit = model_.find(id);
          // A stale batch's member may be gone or have another reservation: it is refused.
          if (mit != model_.end() && j < static_cast<int64_t>(mit->second.planned.size())) {
            auto it = member_rows.find(id);
            if (it == member_rows.end()) {
              const ModelSeq& m = mit->second;
              it = member_rows
                       .emplace(id, testing::model_rows(config_, layer, part, m.planned,
                                                        static_cast<int64_t>(m.tokens.size())))
                       .first;
            }
            src = it->second.data() + j * row_;
          }
        }
        for (int64_t e = 0; e < row_; ++e) {
          store_from_float(dst, how.dtype, l * ls + r * stride + e,
                           src != nullptr ? half_bits_to_float(src[e]) : kPadding);
        }
      }
    }
  }
  return true;
}

void Harness::check_batch_answer(const char* name, const BatchRecord& rec, const Status& st) {
  if (!rec.built || rec.stale) {
    if (st.code() != StatusCode::kFailedPrecondition) {
      fail(where(name) + ": a stale batch was answered " + st.to_string());
    }
  } else if (!rec.maybe_stale && st.code() == StatusCode::kFailedPrecondition) {
    fail(where(name) + ": refused the current batch: " + st.to_string());
  }
  // Accepted: it wrote batch.host->slot_mapping.size() rows through the batch's device slots,
  // which must be what build_batch described (a later failed build_batch must not change it).
  if (st.ok() && rec.batch.host->slot_mapping != rec.slots) {
    fail(where(name) + ": accepted a batch whose host metadata changed since build_batch (" +
         std::to_string(rec.slots.size()) + " slots then, " +
         std::to_string(rec.batch.host->slot_mapping.size()) + " now)");
  }
}

void Harness::note_batch_written(const BatchRecord& rec, uint32_t layers, DType dtype) {
  if (rec.rows.empty()) return;
  if (!model_dtype(dtype)) {
    trusted_ = false;  // bf16 inputs: the bytes no longer follow the fp16 model
    return;
  }
  for (const auto& [id, j] : rec.rows) model_.at(id).written_layers |= layers;
}

Status Harness::write_batch_rows(const char* name, const BatchRecord& rec, int32_t layer) {
  const bool all = layer < 0;
  const WriteHow how;  // fp16, packed
  Status s;
  // An injected fault fails the write and changes nothing; it is one-shot: retry once.
  for (int attempt = 0; attempt < 2; ++attempt) {
    fill_batch_inputs(rec, all ? 0 : layer, all ? config_.num_layers : 1, how, 0);
    const Snapshot b = snapshot();  // after fill_batch_inputs' synchronize
    note("(decode step, %lld rows%s, layer %d)", static_cast<long long>(rec.padded_rows),
         rec.stale ? ", stale" : "", layer);
    s = all ? cache_->write_kv_batch_all_layers(rec.batch, batch_k_, batch_v_, how.dtype)
            : cache_->write_kv_batch(rec.batch, layer, batch_k_, batch_v_, how.dtype);
    check_batch_answer(name, rec, s);
    if (s.ok()) {
      note_batch_written(rec, all ? (1u << config_.num_layers) - 1 : 1u << layer, how.dtype);
    }
    if (!after(name, s, b)) break;
  }
  return s;
}

void Harness::decode_step(const Snapshot& step_before) {
  std::vector<SequenceId> ids;  // distinct: reserve_batch's duplicates are its own opcode's
  for (SequenceId id : pick_batch_ids())
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  const uint8_t h = in_.u8();
  const int64_t n = 1 + (h & 1);  // one token each, or two (speculative decoding)
  const bool all_layers = (h & 2) != 0;
  const bool stale_first = (h & 4) != 0;  // write through a stale batch first
  const bool stale_by_commit = (h & 0x40) != 0;
  BatchOptions o;
  o.build_csr = (h & 8) != 0;
  const int64_t rows = static_cast<int64_t>(ids.size()) * n;
  static constexpr int64_t kPad[] = {0, 1, 4, -1};  // more rows than slots; -1: pad to 1
  const int64_t pad = kPad[(h >> 4) % 4];
  o.pad_slots_to = pad < 0 ? 1 : pad == 0 ? 0 : rows + pad;
  const char* how = all_layers ? "all layers" : "per layer";
  note("(%s, %lld each, %s%s): reserve_batch", ids_string(ids).c_str(), static_cast<long long>(n),
       how, stale_first ? (stale_by_commit ? ", stale by commit" : ", stale by build") : "");
  auto r = cache_->reserve_batch(ids, n);
  if (r.ok()) {
    check_batch_slots(ids, n, *r);
    for (SequenceId id : ids) {
      ModelSeq& m = model_.at(id);
      m.planned.clear();
      for (int64_t i = 0; i < n; ++i) m.planned.push_back(pick_token());
      m.written_layers = 0;
    }
  }
  after("reserve_batch", r.status(), step_before, /*moves_tiers=*/true);
  if (!r.ok()) return;
  for (SequenceId id : ids)
    if (model_.count(id) == 0) fail(where("reserve_batch") + ": dropped member " + id_name(id));

  auto build = [&]() -> bool {
    const Snapshot b = snapshot();
    note("(decode step %s, csr %d, pad %lld)", ids_string(ids).c_str(),
         static_cast<int>(o.build_csr), static_cast<long long>(o.pad_slots_to));
    auto batch = cache_->build_batch(ids, o);
    // Every member is reserved on the device: only an injected fault in the upload can fail
    // it; the step then ends, reserved.
    if (!after("build_batch", batch.status(), b) && !batch.ok()) {
      fail(where("build_batch") + ": of a decode step: " + batch.status().to_string());
    }
    if (!batch.ok()) return false;
    record_batch(ids, o, *batch);
    return true;
  };
  if (!build()) return;
  if (stale_first) {
    BatchRecord old = batch_;
    if (stale_by_commit) {
      // Commits nothing, yet counts as a commit: the batch is stale.
      const Snapshot b = snapshot();
      note("(decode step %s, 0 tokens, 0 each)", ids_string(ids).c_str());
      const Status s = cache_->commit_batch(ids, {}, 0);
      after("commit_batch", s, b);
      if (!s.ok()) fail(where("commit_batch") + ": of 0 each: " + s.to_string());
    } else if (!build()) {
      return;
    }
    old.stale = true;
    const Status s = write_batch_rows(all_layers ? "write_kv_batch_all_layers" : "write_kv_batch",
                                      old, all_layers ? -1 : 0);
    if (s.ok()) fail(where("write_kv_batch") + ": wrote through a stale batch");
    if (stale_by_commit && !build()) return;
  }
  for (int32_t l = all_layers ? -1 : 0; l < (all_layers ? 0 : config_.num_layers); ++l) {
    const Status s =
        write_batch_rows(all_layers ? "write_kv_batch_all_layers" : "write_kv_batch", batch_, l);
    if (!s.ok()) fail(where("write_kv_batch") + ": of a decode step: " + s.to_string());
  }
  std::vector<TokenId> tokens;
  for (SequenceId id : ids) {
    const std::vector<TokenId>& p = model_.at(id).planned;
    tokens.insert(tokens.end(), p.begin(), p.begin() + n);
  }
  const Snapshot b = snapshot();
  note("(decode step %s, %lld each)", ids_string(ids).c_str(), static_cast<long long>(n));
  const Status s = cache_->commit_batch(ids, tokens, n);
  if (s.ok()) note_committed(ids, tokens, n, /*wrong_token=*/false);
  after("commit_batch", s, b);
  if (!s.ok()) fail(where("commit_batch") + ": of a decode step: " + s.to_string());
}

void Harness::write_batch(const Snapshot& step_before) {
  const uint8_t a = in_.u8();
  int32_t layer = a % 4;  // 3 is out of range for every config
  if (a & 0x80) layer = (a & 0x40) ? -1 : INT32_MAX;
  const WriteHow how = pick_write_how();
  const uint8_t c = in_.u8();
  const bool all = (c & 1) != 0;
  const BatchRecord& rec = batch_;
  const int64_t rows = rec.padded_rows;
  const int64_t stride = how.stride == 0 ? row_ : how.stride;
  // 0 (packed layers), packed, a gap, one short (overlaps unless stride > row), the tightest
  // that does not overlap, negative, huge.
  const int64_t layer_strides[] = {
      0,  rows * stride, rows * stride + 5, rows * stride - 1, (rows - 1) * stride + row_,
      -1, INT64_MAX,     INT64_MIN};
  const int64_t ls = all ? layer_strides[(c >> 1) % 8] : 0;
  const bool filled = fill_batch_inputs(rec, all ? 0 : (layer >= 0 && layer < 4 ? layer : 0),
                                        all ? config_.num_layers : 1, how, ls);
  // fill_batch_inputs' synchronize may have used up an armed fault: count from here.
  Snapshot before = step_before;
  before.injected = faults_->injected();
  const void* k = how.null_key ? nullptr : static_cast<char*>(batch_k_) + (how.misaligned ? 1 : 0);
  const void* v = how.null_value ? nullptr : batch_v_;
  const char* name = all ? "write_kv_batch_all_layers" : "write_kv_batch";
  note("(%s%s, %lld rows, layer %d, dtype %d, stride %lld, layer stride %lld%s%s%s)",
       rec.built ? ids_string(rec.ids).c_str() : "never built",
       rec.stale         ? " stale"
       : rec.maybe_stale ? " maybe stale"
                         : "",
       static_cast<long long>(rows), layer, static_cast<int>(how.dtype),
       static_cast<long long>(how.stride), static_cast<long long>(ls),
       how.null_key ? ", null key" : "", how.null_value ? ", null value" : "",
       how.misaligned ? ", misaligned key" : "");
  const Status s =
      all ? cache_->write_kv_batch_all_layers(rec.batch, k, v, how.dtype, how.stride, ls)
          : cache_->write_kv_batch(rec.batch, layer, k, v, how.dtype, how.stride);
  check_batch_answer(name, rec, s);
  if (s.ok() && rows > 0) {
    if (how.stride < 0 || (how.stride > 0 && how.stride < row_)) {
      fail(where(name) + ": accepted a bad row_stride");
    }
    if (!all && (layer < 0 || layer >= config_.num_layers)) fail(where(name) + ": accepted layer");
    if (model_dtype(how.dtype) && !filled) fail(where(name) + ": accepted the layer stride");
    note_batch_written(rec, all ? (1u << config_.num_layers) - 1 : 1u << layer, how.dtype);
  }
  after(name, s, before);
}

void Harness::note_committed(const std::vector<SequenceId>& ids, const std::vector<TokenId>& tokens,
                             int64_t n_each, bool wrong_token) {
  const uint32_t all = (1u << config_.num_layers) - 1;
  for (size_t i = 0; i < ids.size(); ++i) {
    ModelSeq& m = model_.at(ids[i]);
    if (n_each > static_cast<int64_t>(m.planned.size())) fail("commit_batch accepted more");
    // Ids that differ from what was written, or layers that were never written.
    if (n_each > 0 && (m.written_layers != all || wrong_token)) trusted_ = false;
    const auto first = tokens.begin() + static_cast<std::ptrdiff_t>(i) * n_each;
    m.tokens.insert(m.tokens.end(), first, first + n_each);
    m.planned.erase(m.planned.begin(), m.planned.begin() + n_each);
  }
}

void Harness::commit_batch(const Snapshot& step_before) {
  const std::vector<SequenceId> ids = pick_batch_ids();
  const int64_t n = pick_count();
  const uint8_t how = in_.u8() % 4;  // 1: first token wrong, 2: one token short, 3: one over
  std::vector<TokenId> tokens;
  if (n >= 0 && n <= kMaxSeqLen + 1) {
    for (SequenceId id : ids) {
      auto mit = model_.find(id);
      for (int64_t j = 0; j < n; ++j) {
        const bool have =
            mit != model_.end() && j < static_cast<int64_t>(mit->second.planned.size());
        tokens.push_back(have ? mit->second.planned[static_cast<size_t>(j)] : 0);
      }
    }
    if (how == 1 && !tokens.empty()) tokens[0] += 1;
    if (how == 2 && !tokens.empty()) tokens.pop_back();
    if (how == 3) tokens.push_back(0);
  }
  // Why it must be refused ("" if it must not be), as KvCache checks before committing anything.
  std::string refuse;
  const bool sized =
      n >= 0 &&
      (ids.empty() ? tokens.empty()
                   : n <= kMaxSeqLen + 1 && tokens.size() == ids.size() * static_cast<size_t>(n));
  if (n < 0) refuse = "n_each < 0";
  if (refuse.empty() && !sized) refuse = std::to_string(tokens.size()) + " tokens";
  std::set<SequenceId> distinct;
  for (SequenceId id : ids) {
    if (!refuse.empty()) break;
    auto mit = model_.find(id);
    if (!distinct.insert(id).second) {
      refuse = "a duplicate " + id_name(id);
    } else if (mit == model_.end()) {
      refuse = "unknown " + id_name(id);
    } else if (n > static_cast<int64_t>(mit->second.planned.size())) {
      refuse = "unreserved " + id_name(id);
    }
  }
  for (SequenceId id : ids) {
    if (refuse.empty() && offloaded(id)) refuse = "offloaded " + id_name(id);
  }
  // offloaded()'s residency query may have used up an armed fault: count from here.
  Snapshot before = step_before;
  before.injected = faults_->injected();
  note("(%s, %lld each, %zu tokens%s)", ids_string(ids).c_str(), static_cast<long long>(n),
       tokens.size(), how == 1 && !tokens.empty() ? ", first one wrong" : "");
  const Status s = cache_->commit_batch(ids, tokens, n);
  if (s.ok()) {
    if (!refuse.empty()) fail(where("commit_batch") + ": accepted " + refuse);
    note_committed(ids, tokens, n, how == 1);
  } else if (refuse.empty()) {
    fail(where("commit_batch") + ": refused a valid commit: " + s.to_string());
  }
  after("commit_batch", s, before);
}

// Drains the control events: the ring holds at most event_capacity; when it dropped some since
// the last drain, the drain begins with one kEventsDropped marker counting them, and there is
// no marker anywhere else.
void Harness::drain_events(const Snapshot& before) {
  note("(capacity %zu)", event_capacity_);
  const std::vector<ControlEvent> events = cache_->drain_events();
  const int64_t total = cache_->stats().events_dropped;
  const int64_t dropped = total - events_dropped_drained_;
  events_dropped_drained_ = total;
  size_t first = 0;
  if (dropped > 0) {
    if (events.empty() || events[0].kind != EventKind::kEventsDropped ||
        events[0].dropped_events != dropped) {
      fail(where("drain_events") + ": " + std::to_string(dropped) +
           " events were dropped, but the drain does not begin with that marker");
    }
    first = 1;
  }
  for (size_t i = first; i < events.size(); ++i) {
    const ControlEvent& e = events[i];
    if (e.kind == EventKind::kEventsDropped) {
      fail(where("drain_events") + ": a kEventsDropped marker at " + std::to_string(i));
    }
    if (e.kind == EventKind::kSequenceEvicted &&
        std::find(evicted_since_drain_.begin(), evicted_since_drain_.end(), e.sequence) ==
            evicted_since_drain_.end()) {
      fail(where("drain_events") + ": sequence " + id_name(e.sequence) +
           " evicted, but drain_evicted_sequences did not say so");
    }
  }
  if (events.size() - first > event_capacity_) {
    fail(where("drain_events") + ": " + std::to_string(events.size() - first) + " events held");
  }
  evicted_since_drain_.clear();
  if (tracing())
    note("(capacity %zu) = %zu events, %lld dropped", event_capacity_, events.size(),
         static_cast<long long>(dropped));
  after("drain_events", ok_status(), before);
}

}  // namespace pagedkv::fuzz
