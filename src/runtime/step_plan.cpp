// StepPlan's bytes: "PKVSTEP" and a version byte, the record count (u32), then each record: its
// kind (u8); a transfers record: the moves (u32 count; each src tier u8, src block i32, dst
// tier u8, dst block i32, group i32) and the copies (u32 count; each src i32, dst i32, group
// i32); a batch record: group i32, build_csr u8, same_build u8, batch_size i32, max_blocks i32,
// ring_table u8, then slot_mapping (u64 count, i64 each), block_tables, seq_lens, indptr, indices,
// last_page_len (u64 count, i32 each).
#include "pagedkv/step_plan.hpp"

#include <cstring>
#include <type_traits>

namespace pagedkv {
namespace {

constexpr char kMagic[8] = {'P', 'K', 'V', 'S', 'T', 'E', 'P', 2};

class Writer {
 public:
  explicit Writer(std::string* out) : out_(*out) {}
  template <typename T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out_.append(b, sizeof(T));
  }
  template <typename T>
  void put_array(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    if (!v.empty()) out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }

 private:
  std::string& out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  size_t offset() const { return pos_; }
  size_t left() const { return in_.size() - pos_; }
  template <typename T>
  Status get(T* v, const char* what) {
    if (left() < sizeof(T)) return truncated(what);
    std::memcpy(v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return ok_status();
  }
  template <typename T>
  Status get_array(std::vector<T>* v, const char* what) {
    uint64_t n = 0;
    PAGEDKV_RETURN_IF_ERROR(get(&n, what));
    if (n > left() / sizeof(T)) return truncated(what);  // checked before allocating
    v->resize(static_cast<size_t>(n));
    if (n > 0) std::memcpy(v->data(), in_.data() + pos_, static_cast<size_t>(n) * sizeof(T));
    pos_ += static_cast<size_t>(n) * sizeof(T);
    return ok_status();
  }
  // A count of items of at least `item_bytes` each, no more than the bytes left can hold.
  Status get_count(uint32_t* n, size_t item_bytes, const char* what) {
    PAGEDKV_RETURN_IF_ERROR(get(n, what));
    if (*n > left() / item_bytes) return truncated(what);
    return ok_status();
  }
  Status truncated(const char* what) const {
    return invalid_argument("step plan: " + std::string(what) + " runs past the end (byte " +
                            std::to_string(pos_) + " of " + std::to_string(in_.size()) + ")");
  }

 private:
  std::string_view in_;
  size_t pos_ = 0;
};

Status get_tier(Reader& r, Tier* tier) {
  uint8_t t = 0;
  PAGEDKV_RETURN_IF_ERROR(r.get(&t, "a move's tier"));
  if (t != static_cast<uint8_t>(Tier::kDevice) && t != static_cast<uint8_t>(Tier::kHost)) {
    return invalid_argument("step plan: a move names tier " + std::to_string(t) +
                            " (device 0 or host 1)");
  }
  *tier = static_cast<Tier>(t);
  return ok_status();
}

Status get_bool(Reader& r, bool* b, const char* what) {
  uint8_t v = 0;
  PAGEDKV_RETURN_IF_ERROR(r.get(&v, what));
  if (v > 1) {
    return invalid_argument("step plan: " + std::string(what) + " is " + std::to_string(v) +
                            " (0 or 1)");
  }
  *b = v == 1;
  return ok_status();
}

constexpr size_t kMoveBytes = 1 + 4 + 1 + 4 + 4;
constexpr size_t kCopyBytes = 4 + 4 + 4;

Status decode_transfers(Reader& r, StepRecord* rec) {
  uint32_t n = 0;
  PAGEDKV_RETURN_IF_ERROR(r.get_count(&n, kMoveBytes, "the moves"));
  rec->moves.resize(n);
  for (BlockMove& m : rec->moves) {
    PAGEDKV_RETURN_IF_ERROR(get_tier(r, &m.src_tier));
    PAGEDKV_RETURN_IF_ERROR(r.get(&m.src_block, "a move"));
    PAGEDKV_RETURN_IF_ERROR(get_tier(r, &m.dst_tier));
    PAGEDKV_RETURN_IF_ERROR(r.get(&m.dst_block, "a move"));
    PAGEDKV_RETURN_IF_ERROR(r.get(&m.group, "a move"));
  }
  PAGEDKV_RETURN_IF_ERROR(r.get_count(&n, kCopyBytes, "the copies"));
  rec->copies.resize(n);
  for (BlockCopy& c : rec->copies) {
    PAGEDKV_RETURN_IF_ERROR(r.get(&c.src_block, "a copy"));
    PAGEDKV_RETURN_IF_ERROR(r.get(&c.dst_block, "a copy"));
    PAGEDKV_RETURN_IF_ERROR(r.get(&c.group, "a copy"));
  }
  return ok_status();
}

Status decode_batch(Reader& r, StepRecord* rec) {
  BatchMetadata& m = rec->batch;
  PAGEDKV_RETURN_IF_ERROR(r.get(&rec->group, "a batch's group"));
  PAGEDKV_RETURN_IF_ERROR(get_bool(r, &rec->build_csr, "a batch's build_csr"));
  PAGEDKV_RETURN_IF_ERROR(get_bool(r, &rec->same_build, "a batch's same_build"));
  PAGEDKV_RETURN_IF_ERROR(r.get(&m.batch_size, "a batch's size"));
  PAGEDKV_RETURN_IF_ERROR(r.get(&m.max_blocks, "a batch's max_blocks"));
  PAGEDKV_RETURN_IF_ERROR(get_bool(r, &m.ring_table, "a batch's ring_table"));
  PAGEDKV_RETURN_IF_ERROR(r.get_array(&m.slot_mapping, "a batch's slot_mapping"));
  PAGEDKV_RETURN_IF_ERROR(r.get_array(&m.block_tables, "a batch's block_tables"));
  PAGEDKV_RETURN_IF_ERROR(r.get_array(&m.seq_lens, "a batch's seq_lens"));
  PAGEDKV_RETURN_IF_ERROR(r.get_array(&m.indptr, "a batch's indptr"));
  PAGEDKV_RETURN_IF_ERROR(r.get_array(&m.indices, "a batch's indices"));
  PAGEDKV_RETURN_IF_ERROR(r.get_array(&m.last_page_len, "a batch's last_page_len"));
  return ok_status();
}

}  // namespace

std::string StepPlan::encode() const {
  std::string out(kMagic, sizeof(kMagic));
  Writer w(&out);
  w.put<uint32_t>(static_cast<uint32_t>(records.size()));
  for (const StepRecord& rec : records) {
    w.put<uint8_t>(static_cast<uint8_t>(rec.kind));
    if (rec.kind == StepRecord::Kind::kTransfers) {
      w.put<uint32_t>(static_cast<uint32_t>(rec.moves.size()));
      for (const BlockMove& m : rec.moves) {
        w.put<uint8_t>(static_cast<uint8_t>(m.src_tier));
        w.put(m.src_block);
        w.put<uint8_t>(static_cast<uint8_t>(m.dst_tier));
        w.put(m.dst_block);
        w.put(m.group);
      }
      w.put<uint32_t>(static_cast<uint32_t>(rec.copies.size()));
      for (const BlockCopy& c : rec.copies) {
        w.put(c.src_block);
        w.put(c.dst_block);
        w.put(c.group);
      }
      continue;
    }
    const BatchMetadata& m = rec.batch;
    w.put(rec.group);
    w.put<uint8_t>(rec.build_csr ? 1 : 0);
    w.put<uint8_t>(rec.same_build ? 1 : 0);
    w.put(m.batch_size);
    w.put(m.max_blocks);
    w.put<uint8_t>(m.ring_table ? 1 : 0);
    w.put_array(m.slot_mapping);
    w.put_array(m.block_tables);
    w.put_array(m.seq_lens);
    w.put_array(m.indptr);
    w.put_array(m.indices);
    w.put_array(m.last_page_len);
  }
  return out;
}

StatusOr<StepPlan> StepPlan::decode(std::string_view bytes) {
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return invalid_argument("step plan: no step plan header (\"PKVSTEP\", version 2)");
  }
  Reader r(bytes.substr(sizeof(kMagic)));
  StepPlan plan;
  uint32_t n = 0;
  PAGEDKV_RETURN_IF_ERROR(r.get_count(&n, 1, "the record count"));
  plan.records.resize(n);
  for (StepRecord& rec : plan.records) {
    uint8_t kind = 0;
    PAGEDKV_RETURN_IF_ERROR(r.get(&kind, "a record's kind"));
    rec.kind = static_cast<StepRecord::Kind>(kind);
    if (rec.kind == StepRecord::Kind::kTransfers) {
      PAGEDKV_RETURN_IF_ERROR(decode_transfers(r, &rec));
    } else if (rec.kind == StepRecord::Kind::kBatch) {
      PAGEDKV_RETURN_IF_ERROR(decode_batch(r, &rec));
    } else {
      return invalid_argument("step plan: unknown record kind " + std::to_string(kind));
    }
  }
  if (r.left() != 0) {
    return invalid_argument("step plan: " + std::to_string(r.left()) +
                            " bytes after the last record");
  }
  return plan;
}

}  // namespace pagedkv
