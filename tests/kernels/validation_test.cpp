// Bad arguments are rejected on the host before any launch, with a named error, and leave the
// pool bytes unchanged.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>

#include "kernel_test_util.hpp"
#include "support/status_matchers.hpp"

namespace pagedkv::testing {
namespace {

template <typename Tag>
class ValidationTest : public BackendTest<Tag> {
 protected:
  void SetUp() override {
    BackendTest<Tag>::SetUp();
    if (this->IsSkipped() || this->HasFatalFailure()) return;
    Backend& be = this->backend();
    s_.layers = 2;
    s_.heads = 2;
    s_.head_dim = 64;
    s_.block_size = 8;
    s_.num_blocks = 4;
    pool0_ = random_bytes(size_t(s_.pool_elems()) * 2, 1);
    pool_buf_ = std::make_unique<DeviceBuffer>(be, pool0_.size());
    pool_buf_->upload(pool0_);
    in_ = std::make_unique<DeviceBuffer>(be, 4096);
    meta_ = std::make_unique<DeviceBuffer>(be, 256);
    pool_ = PoolRef{pool_buf_->data(), DType::kFloat16, s_.layout(), s_.num_blocks};
  }

  /// The call fails with `code`, its message contains `needle`, and the pool is unchanged.
  void expect_rejected(const Status& st, StatusCode code, const std::string& needle) {
    EXPECT_EQ(st.code(), code) << st.to_string();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
    EXPECT_TRUE(bytes_equal(pool0_, pool_buf_->download<uint8_t>()));
  }

  WriteKvArgs good_write() const {
    WriteKvArgs a;
    a.key = in_->data();
    a.value = in_->data();
    a.num_tokens = 4;
    a.slot_mapping = static_cast<const int64_t*>(meta_->data());
    return a;
  }
  PackedLayerArgs good_packed() const {
    PackedLayerArgs a;
    a.key = in_->data();
    a.value = in_->data();
    a.block_table = static_cast<const int32_t*>(meta_->data());
    a.block_table_len = 2;
    a.num_tokens = 10;
    return a;
  }

  Shape s_;
  std::vector<uint8_t> pool0_;
  std::unique_ptr<DeviceBuffer> pool_buf_, in_, meta_;
  PoolRef pool_;
};
TYPED_TEST_SUITE(ValidationTest, AllBackends, BackendName);

TYPED_TEST(ValidationTest, WriteKvRejectsBadArgumentsByName) {
  Backend& be = this->backend();
  auto a = this->good_write();
  a.key = nullptr;
  this->expect_rejected(write_kv(be, this->pool_, a), StatusCode::kInvalidArgument, "key: null");
  a = this->good_write();
  a.slot_mapping = nullptr;
  this->expect_rejected(write_kv(be, this->pool_, a), StatusCode::kInvalidArgument, "slot_mapping");
  a = this->good_write();
  a.layer = 2;
  this->expect_rejected(write_kv(be, this->pool_, a), StatusCode::kOutOfRange, "layer");
  a = this->good_write();
  a.row_stride = 64;
  this->expect_rejected(write_kv(be, this->pool_, a), StatusCode::kInvalidArgument, "row_stride");
  a = this->good_write();
  a.key = static_cast<const char*>(a.key) + 1;
  this->expect_rejected(write_kv(be, this->pool_, a), StatusCode::kInvalidArgument,
                        "key: pointer not aligned");
  a = this->good_write();
  a.scales.granularity = ScaleGranularity::kPerLayer;
  this->expect_rejected(write_kv(be, this->pool_, a), StatusCode::kInvalidArgument, "scales");
  a = this->good_write();
  a.input_dtype = DType::kFloat8E4M3;
  this->expect_rejected(write_kv(be, this->pool_, a), StatusCode::kInvalidArgument, "input_dtype");
  a = this->good_write();
  a.num_tokens = -1;
  this->expect_rejected(write_kv(be, this->pool_, a), StatusCode::kInvalidArgument, "num_tokens");
  PoolRef bad = this->pool_;
  bad.data = nullptr;
  this->expect_rejected(write_kv(be, bad, this->good_write()), StatusCode::kInvalidArgument,
                        "pool.data");
  bad = this->pool_;
  bad.layout.head_dim = 0;
  this->expect_rejected(write_kv(be, bad, this->good_write()), StatusCode::kInvalidArgument,
                        "pool.layout");
  bad = this->pool_;
  bad.num_blocks = 0;
  this->expect_rejected(write_kv(be, bad, this->good_write()), StatusCode::kInvalidArgument,
                        "pool.num_blocks");
  WriteKvAllLayersArgs all;
  all.key = all.value = this->in_->data();
  all.num_tokens = 4;
  all.slot_mapping = static_cast<const int64_t*>(this->meta_->data());
  all.layer_stride = 10;
  this->expect_rejected(write_kv_all_layers(be, this->pool_, all), StatusCode::kInvalidArgument,
                        "layer_stride");
}

TYPED_TEST(ValidationTest, GatherImportScatterRejectBadArgumentsByName) {
  Backend& be = this->backend();
  auto a = this->good_packed();
  a.num_tokens = 17;  // two blocks of 8 hold 16 positions
  this->expect_rejected(import_layer(be, this->pool_, a), StatusCode::kOutOfRange,
                        "position_begin + num_tokens");
  a = this->good_packed();
  a.block_table = nullptr;
  this->expect_rejected(import_layer(be, this->pool_, a), StatusCode::kInvalidArgument,
                        "block_table");
  a = this->good_packed();
  a.layer = -1;
  this->expect_rejected(gather_layer(be, this->pool_, a), StatusCode::kOutOfRange, "layer");
  a = this->good_packed();
  a.packed_dtype = DType::kFloat8E4M3;
  this->expect_rejected(import_layer(be, this->pool_, a), StatusCode::kInvalidArgument,
                        "packed_dtype");
  PackedBatchArgs b;
  b.key = b.value = this->in_->data();
  b.block_tables = static_cast<const int32_t*>(this->meta_->data());
  b.indptr = nullptr;
  b.batch_size = 2;
  b.total_tokens = 5;
  b.max_blocks_per_seq = 2;
  this->expect_rejected(import_layer_batch(be, this->pool_, b), StatusCode::kInvalidArgument,
                        "indptr");
  b.indptr = static_cast<const int32_t*>(this->meta_->data());
  b.total_tokens = int64_t{1} << 33;
  this->expect_rejected(import_layer_batch(be, this->pool_, b), StatusCode::kOutOfRange,
                        "total_tokens");
  ScatterHeadRangeArgs sc;
  sc.key = sc.value = this->in_->data();
  sc.block_table = static_cast<const int32_t*>(this->meta_->data());
  sc.block_table_len = 2;
  sc.num_tokens = 4;
  sc.head_begin = 1;
  sc.num_heads = 2;  // heads [1, 3) of 2
  this->expect_rejected(scatter_head_range(be, this->pool_, sc), StatusCode::kOutOfRange,
                        "head_begin + num_heads");
  CopyBlocksArgs cb;
  cb.pairs = nullptr;
  cb.num_pairs = 1;
  this->expect_rejected(copy_blocks(be, this->pool_, cb), StatusCode::kInvalidArgument, "pairs");
  cb.pairs = static_cast<const char*>(this->meta_->data()) + 4;
  cb.index_type = IndexType::kInt64;
  this->expect_rejected(copy_blocks(be, this->pool_, cb), StatusCode::kInvalidArgument,
                        "pairs: pointer not aligned");
}

// Strides and counts whose last element cannot be addressed: each op computes the largest
// offset it would form without overflowing and rejects the call by the argument's name.
TYPED_TEST(ValidationTest, ExtentsPastSixtyFourBitOffsetsAreRejectedByName) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  Backend& be = this->backend();
  auto w = this->good_write();
  w.row_stride = kMax;
  this->expect_rejected(write_kv(be, this->pool_, w), StatusCode::kInvalidArgument, "row_stride");
  w.row_stride = kMax / 4;  // the element offset fits, its byte offset does not
  this->expect_rejected(write_kv(be, this->pool_, w), StatusCode::kInvalidArgument, "row_stride");
  // A one-token write never steps by row_stride: any stride is fine.
  this->meta_->upload(std::vector<int64_t>(32, 3));  // slot 3
  w.num_tokens = 1;
  EXPECT_OK(write_kv(be, this->pool_, w));
  ASSERT_OK(be.synchronize_stream(Stream{}));
  this->pool_buf_->upload(this->pool0_);
  w = this->good_write();
  w.num_tokens = kMax / 4;  // the slot mapping's last entry is past 64-bit byte offsets
  this->expect_rejected(write_kv(be, this->pool_, w), StatusCode::kInvalidArgument, "num_tokens");
  // A tensor that would run past the end of the address space.
  w = this->good_write();
  w.key = reinterpret_cast<const void*>((~uintptr_t{0} - 511) & ~uintptr_t{15});
  this->expect_rejected(write_kv(be, this->pool_, w), StatusCode::kInvalidArgument,
                        "past the end of the address space");

  WriteKvAllLayersArgs all;
  all.key = all.value = this->in_->data();
  all.num_tokens = 4;
  all.slot_mapping = static_cast<const int64_t*>(this->meta_->data());
  all.layer_stride = kMax;
  this->expect_rejected(write_kv_all_layers(be, this->pool_, all), StatusCode::kInvalidArgument,
                        "layer_stride");
  all.layer_stride = 0;
  all.row_stride = kMax;
  this->expect_rejected(write_kv_all_layers(be, this->pool_, all), StatusCode::kInvalidArgument,
                        "row_stride");
  // fp8 (one byte per element): two rows fit, the default layer stride of 2 * 2^62 does not.
  PoolRef fp8 = this->pool_;
  fp8.dtype = DType::kFloat8E4M3;
  all.input_dtype = DType::kFloat8E4M3;
  all.num_tokens = 2;
  all.row_stride = int64_t{1} << 62;
  this->expect_rejected(write_kv_all_layers(be, fp8, all), StatusCode::kInvalidArgument,
                        "layer_stride: the default");

  // A pool view whose layout is huge (one block of 2^42 bytes) over the real buffer: the packed
  // side of one sequence can then hold more elements than int64 offsets reach.
  PoolRef huge = this->pool_;
  huge.layout.num_layers = 1;
  huge.layout.num_kv_heads = 1;
  huge.layout.head_dim = 1 << 20;
  huge.layout.block_size = 1 << 20;
  huge.num_blocks = 1;
  auto pk = this->good_packed();
  pk.block_table_len = std::numeric_limits<int32_t>::max();
  pk.num_tokens = int64_t{1} << 50;
  this->expect_rejected(import_layer(be, huge, pk), StatusCode::kInvalidArgument, "num_tokens");
  pk.packed_layout = PackedLayout::kTokenMajor;
  this->expect_rejected(gather_layer(be, huge, pk), StatusCode::kInvalidArgument, "num_tokens");
  ScatterHeadRangeArgs sc;
  sc.key = sc.value = this->in_->data();
  sc.block_table = static_cast<const int32_t*>(this->meta_->data());
  sc.block_table_len = std::numeric_limits<int32_t>::max();
  sc.num_heads = 1;
  sc.num_tokens = int64_t{1} << 50;
  this->expect_rejected(scatter_head_range(be, huge, sc), StatusCode::kInvalidArgument,
                        "num_tokens");
  PackedBatchArgs b;
  b.key = b.value = this->in_->data();
  b.block_tables = static_cast<const int32_t*>(this->meta_->data());
  b.indptr = static_cast<const int32_t*>(this->meta_->data());
  b.batch_size = 1;
  b.max_blocks_per_seq = 2;
  b.total_tokens = std::numeric_limits<int32_t>::max();
  huge.layout.num_kv_heads = 1 << 13;
  huge.layout.block_size = 1;
  this->expect_rejected(gather_layer_batch(be, huge, b), StatusCode::kInvalidArgument,
                        "total_tokens");
  b.total_tokens = 4;
  b.batch_size = std::numeric_limits<int32_t>::max();
  b.max_blocks_per_seq = std::numeric_limits<int32_t>::max();
  this->expect_rejected(import_layer_batch(be, this->pool_, b), StatusCode::kInvalidArgument,
                        "max_blocks_per_seq");

  // The pool's own size: a layout whose block overflows, and too many blocks.
  PoolRef bad = this->pool_;
  bad.layout.head_dim = 1 << 30;
  bad.layout.block_size = 1 << 30;
  this->expect_rejected(write_kv(be, bad, this->good_write()), StatusCode::kInvalidArgument,
                        "pool.layout");
  bad = this->pool_;
  bad.num_blocks = kMax / 1024;
  this->expect_rejected(copy_blocks(be, bad, CopyBlocksArgs{}), StatusCode::kInvalidArgument,
                        "pool.num_blocks");
  CopyBlocksArgs cb;
  cb.pairs = this->meta_->data();
  cb.num_pairs = kMax / 2;
  this->expect_rejected(copy_blocks(be, this->pool_, cb), StatusCode::kInvalidArgument,
                        "num_pairs");
}

}  // namespace
}  // namespace pagedkv::testing
