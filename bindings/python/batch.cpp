// A step's batch in Python: build_batch's arrays on the device plus host copies, and the
// attention-kernel formats of pagedkv/batch_formats.hpp (CSR into fixed buffers, append
// indices, vLLM block_table / slot_mapping).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "common.hpp"
#include "forwarders.hpp"
#include "pagedkv/batch_formats.hpp"

namespace pagedkv::python {
namespace {

using Ids = std::vector<SequenceId>;

/// Host (numpy) or device (DLPack) arrays of a batch, by name.
struct PyBatchArrays {
  nb::object batch;
  bool on_device = false;
};

const std::vector<std::string> kArrayNames = {"slot_mapping", "block_tables", "seq_lens",
                                              "kv_indptr",    "kv_indices",   "kv_last_page_len"};

// A numpy view of a host copy; 1-D when cols < 0.
template <typename T>
nb::ndarray<nb::numpy> host_array(nb::handle owner, const std::vector<T>& v, size_t rows,
                                  int64_t cols) {
  const size_t shape[2] = {rows, cols < 0 ? 0 : size_t(cols)};
  return nb::ndarray<nb::numpy>(const_cast<T*>(v.data()), cols < 0 ? 1 : 2, shape, owner, nullptr,
                                nb::dtype<T>(), static_cast<int>(nb::device::cpu::value), 0);
}

nb::object batch_array(const PyBatchArrays& a, const std::string& name) {
  PyBatch& b = nb::cast<PyBatch&>(a.batch);
  const BatchMetadata& m = b.host;
  const size_t rows = size_t(m.batch_size), width = size_t(m.max_blocks);
  const bool csr = b.device.indptr != nullptr;
  if (name.rfind("kv_", 0) == 0 && !csr) {
    throw StatusError(failed_precondition(name + ": the batch was built without csr=True"));
  }
  if (!a.on_device) {
    nb::ndarray<nb::numpy> out;
    nb::handle o = a.batch;
    if (name == "slot_mapping") out = host_array(o, m.slot_mapping, m.slot_mapping.size(), -1);
    if (name == "block_tables") out = host_array(o, m.block_tables, rows, int64_t(width));
    if (name == "seq_lens") out = host_array(o, m.seq_lens, rows, -1);
    if (name == "kv_indptr") out = host_array(o, m.indptr, m.indptr.size(), -1);
    if (name == "kv_indices") out = host_array(o, m.indices, m.indices.size(), -1);
    if (name == "kv_last_page_len") out = host_array(o, m.last_page_len, rows, -1);
    if (!out.is_valid()) throw nb::attribute_error(("no batch array named " + name).c_str());
    return nb::cast(out);
  }
  if (!b.current()) {
    throw StatusError(failed_precondition(
        name + ": a later build_batch reused this batch's device arrays (host copies remain)"));
  }
  const int dev = b.device_type;
  auto make = [&](const void* p, nb::dlpack::dtype t, size_t n0, int64_t n1) {
    const size_t shape[2] = {n0, n1 < 0 ? 0 : size_t(n1)};
    return nb::cast(DlArray(const_cast<void*>(p), n1 < 0 ? 1 : 2, shape, a.batch, nullptr, t, dev,
                            b.device_id));
  };
  const auto i32 = nb::dtype<int32_t>();
  if (name == "slot_mapping") {
    return make(b.device.slot_mapping, nb::dtype<int64_t>(), m.slot_mapping.size(), -1);
  }
  if (name == "block_tables") return make(b.device.block_tables, i32, rows, int64_t(width));
  if (name == "seq_lens") return make(b.device.seq_lens, i32, rows, -1);
  if (name == "kv_indptr") return make(b.device.indptr, i32, m.indptr.size(), -1);
  if (name == "kv_indices") return make(b.device.indices, i32, m.indices.size(), -1);
  if (name == "kv_last_page_len") return make(b.device.last_page_len, i32, rows, -1);
  throw nb::attribute_error(("no batch array named " + name).c_str());
}

// The Python object of a batch of the cache `self` (rank 0's device): it keeps the cache alive
// and is current until the cache's next build.
nb::object adopt_batch(nb::handle self, std::unique_ptr<PyBatch> b) {
  PyCache& s = nb::cast<PyCache&>(self);
  b->cache = nb::borrow(self);
  b->owner = &s;
  b->serial_source = &s.batch_serial;
  b->device_type = backend_device_type(*s.kv);
  b->device_id = backend_device_id(*s.kv);
  return nb::cast(b.release(), nb::rv_policy::take_ownership);
}

// Runs a call that builds a batch and copies what the Batch keeps while the cache is locked
// (another thread's build_batch would change it). The serial moves on even when the call fails:
// a failed build_batch leaves no batch current, so earlier device arrays are not to be read.
template <typename Fn>
nb::object building(nb::handle self, const Ids& ids, Fn&& fn) {
  PyCache& s = nb::cast<PyCache&>(self);
  auto b = std::make_unique<PyBatch>();
  check(unlocked(s, [&](KvCache& kv) -> Status {
    b->serial = ++s.batch_serial;
    PAGEDKV_ASSIGN_OR_RETURN(b->device, fn(kv));
    b->built_host = b->device.host;
    b->host = *b->device.host;
    b->device.host = &b->host;
    return ok_status();
  }));
  b->ids = ids;
  return adopt_batch(self, std::move(b));
}

}  // namespace

void register_batch(nb::module_& m, nb::class_<PyCache>& cls) {
  nb::class_<PyBatchArrays>(m, "BatchArrays", "A batch's arrays, by attribute name.")
      .def("__getattr__", &batch_array)
      .def("__dir__", [](const PyBatchArrays&) { return kArrayNames; })
      .def_ro("on_device", &PyBatchArrays::on_device);

  nb::class_<PyBatch>(m, "Batch",
                      "One step's batch metadata: `.device` arrays (valid until the next "
                      "build_batch, ready on the compute stream) and `.host` numpy copies.")
      .def_prop_ro("device",
                   [](nb::handle self) {
                     return PyBatchArrays{nb::borrow(self), true};
                   })
      .def_prop_ro("host",
                   [](nb::handle self) {
                     return PyBatchArrays{nb::borrow(self), false};
                   })
      .def_prop_ro("batch_size", [](const PyBatch& b) { return b.host.batch_size; })
      .def_prop_ro("max_blocks", [](const PyBatch& b) { return b.host.max_blocks; })
      .def_prop_ro(
          "ring_table", [](const PyBatch& b) { return b.host.ring_table; },
          "The block table's rows are rings (build_batch(ring_window_tables=True), a window "
          "group's): block i of a row at column i % max_blocks while it is in the window.")
      .def_prop_ro("ids", [](const PyBatch& b) { return b.ids; })
      .def_prop_ro("is_current", &PyBatch::current)
      .def_prop_ro("has_csr", [](const PyBatch& b) { return b.device.indptr != nullptr; })
      .def_prop_ro(
          "rank", [](const PyBatch& b) { return b.device.rank; },
          "The tensor-parallel rank whose device holds the .device arrays (KvCache.rank_batch).")
      .def_prop_ro(
          "group",
          [](const PyBatch& b) -> std::optional<int32_t> {
            if (b.group < 0) return std::nullopt;
            return b.group;
          },
          "The group of a ModelBatch's batch; None for a KvCache's.")
      .def("__repr__", [](const PyBatch& b) {
        return "Batch(batch_size=" + std::to_string(b.host.batch_size) +
               ", max_blocks=" + std::to_string(b.host.max_blocks) +
               ", slots=" + std::to_string(b.host.slot_mapping.size()) +
               ", csr=" + (b.device.indptr != nullptr ? "True" : "False") +
               ", current=" + (b.current() ? "True" : "False") + ")";
      });

  cls.def(
      "build_batch",
      [](nb::handle self, const Ids& ids, bool csr, int64_t pad_slots_to) {
        const BatchOptions o = batch_options(csr, pad_slots_to);
        return building(self, ids, [&](KvCache& kv) { return kv.build_batch(ids, o); });
      },
      nb::arg("ids"), nb::arg("csr") = false, nb::arg("pad_slots_to") = 0,
      "Builds a step's batch metadata and uploads it on the compute stream; returns a Batch "
      "(.device arrays valid until the next build_batch, .host numpy copies).");
  cls.def(
      "apply_step_plan",
      [](nb::handle self, nb::bytes plan) {
        PyCache& s = nb::cast<PyCache&>(self);
        const StepPlan decoded =
            value_or_throw(StepPlan::decode(std::string_view(plan.c_str(), plan.size())));
        std::vector<std::unique_ptr<PyBatch>> made;
        check(unlocked(s, [&](KvCache& kv) -> Status {
          PAGEDKV_ASSIGN_OR_RETURN(std::vector<DeviceBatch> batches, kv.apply_step_plan(decoded));
          // One serial per build: only the last build's batches stay current.
          for (const StepRecord& r : decoded.records) {
            if (r.kind != StepRecord::Kind::kBatch) continue;
            if (!r.same_build) ++s.batch_serial;
            auto b = std::make_unique<PyBatch>();
            b->serial = s.batch_serial;
            b->device = batches[made.size()];
            b->built_host = b->device.host;
            b->host = r.batch;  // the cache's copy holds only its group's last batch
            b->device.host = &b->host;
            made.push_back(std::move(b));
          }
          return ok_status();
        }));
        nb::list out;
        for (std::unique_ptr<PyBatch>& b : made) out.append(adopt_batch(self, std::move(b)));
        return out;
      },
      nb::arg("plan"),
      "A worker's side of split-process tensor parallelism: carries out another cache's "
      "take_step_plan() bytes on this cache's pools (one rank's part of that cache's model: "
      "CacheConfig.rank_config) and returns a Batch per built batch in it, through which the "
      "worker's model writes and reads (write_kv_batch, its .device arrays). InvalidArgumentError "
      "for damaged bytes or block ids outside the pools (nothing changes), "
      "FailedPreconditionError for a cache with sequences of its own.");
  cls.def(
      "write_kv_batch",
      [](PyCache& s, PyBatch& b, int32_t layer, nb::handle key, nb::handle value,
         std::optional<int32_t> rank_arg) {
        if (b.owner != &s) throw_invalid("batch: built by another cache");
        const int32_t rank = rank_arg.value_or(b.device.rank);
        const std::pair<KvInput, KvInput> in =
            kv_batch_inputs(rank_ref(*s.kv, rank), key, value, b.host.slot_mapping.size(), "");
        const KvInput &k = in.first, &v = in.second;
        write_and_wait(s, k, [&](KvCache& kv) -> Status {
          DeviceBatch on_rank = b.as_built();  // as built (its slots may be the caller's)
          if (rank != on_rank.rank) {
            PAGEDKV_ASSIGN_OR_RETURN(on_rank, kv.rank_batch(on_rank, rank));
          }
          return kv.write_kv_batch(on_rank, layer, k.data, v.data, k.dtype, k.row_stride);
        });
      },
      nb::arg("batch"), nb::arg("layer"), nb::arg("key"), nb::arg("value").none() = nb::none(),
      nb::arg("rank").none() = nb::none(),
      "Writes one layer's K/V of every token of the current batch through its slot mapping in one "
      "launch; key/value [len(slot_mapping), heads, dim] (padding rows skipped); value=None for a "
      "latent (MLA) cache. With tensor parallelism, rank `rank`'s heads (None: the batch's "
      "rank) into its pool, through the batch as uploaded to that rank.");
  cls.def(
      "rank_batch",
      [](nb::handle self, PyBatch& b, int32_t rank) {
        PyCache& s = nb::cast<PyCache&>(self);
        if (b.owner != &s) throw_invalid("batch: built by another cache");
        const GroupRef on = rank_ref(*s.kv, rank);
        auto out = std::make_unique<PyBatch>();
        check(unlocked(s, [&](KvCache& kv) -> Status {
          PAGEDKV_ASSIGN_OR_RETURN(out->device, kv.rank_batch(b.as_built(), rank));
          return ok_status();
        }));
        out->cache = b.cache;
        out->owner = b.owner;
        out->serial_source = b.serial_source;
        out->serial = b.serial;
        out->device_type = backend_device_type(on);
        out->device_id = backend_device_id(on);
        out->built_host = out->device.host;
        out->host = b.host;
        out->device.host = &out->host;
        out->ids = b.ids;
        return nb::cast(out.release(), nb::rv_policy::take_ownership);
      },
      nb::arg("batch"), nb::arg("rank"),
      "With tensor parallelism: the same batch as uploaded to rank `rank` (Batch.rank), whose "
      ".device arrays are on that rank's device and index its pool; current as long as `batch` "
      "is. OutOfRangeError for a rank outside the cache, FailedPreconditionError for a stale "
      "batch.");

  cls.def(
      "write_kv_batch_all_layers",
      [](PyCache& s, PyBatch& b, nb::handle key, nb::handle value) {
        if (b.owner != &s) throw_invalid("batch: built by another cache");
        const std::pair<KvInput, KvInput> in =
            kv_all_layers_inputs(*s.kv, key, value, b.host.slot_mapping.size(), "");
        const KvInput &k = in.first, &v = in.second;
        write_and_wait(s, k, [&](KvCache& kv) {
          return kv.write_kv_batch_all_layers(b.as_built(), k.data, v.data, k.dtype, k.row_stride,
                                              k.layer_stride);
        });
      },
      nb::arg("batch"), nb::arg("key"), nb::arg("value").none() = nb::none(),
      "write_kv_batch of every layer in one launch: key/value [num_layers, len(slot_mapping), "
      "heads, dim] (any layer and row strides; value=None for a latent cache).");

  // ---- attention-kernel formats (pagedkv/batch_formats.hpp) ----
  cls.def(
      "build_batch_into",
      [](nb::handle self, const Ids& ids, nb::handle kv_indptr, nb::handle kv_indices,
         nb::handle kv_last_page_len, nb::handle slot_mapping) {
        PyCache& s = nb::cast<PyCache&>(self);
        const auto i32 = nb::dtype<int32_t>();
        nb::ndarray<> ip = as_index_buffer(*s.kv, kv_indptr, i32, 1, "kv_indptr");
        nb::ndarray<> ix = as_index_buffer(*s.kv, kv_indices, i32, 1, "kv_indices");
        nb::ndarray<> lp = as_index_buffer(*s.kv, kv_last_page_len, i32, 1, "kv_last_page_len");
        if (ip.shape(0) == 0) throw_invalid("kv_indptr: empty");
        CsrBuffers buffers;
        buffers.kv_indptr = static_cast<int32_t*>(ip.data());
        buffers.kv_indices = static_cast<int32_t*>(ix.data());
        buffers.kv_last_page_len = static_cast<int32_t*>(lp.data());
        buffers.max_batch = static_cast<int32_t>(std::min(ip.shape(0) - 1, lp.shape(0)));
        buffers.max_pages = static_cast<int64_t>(ix.shape(0));
        if (!slot_mapping.is_none()) {
          nb::ndarray<> sm =
              as_index_buffer(*s.kv, slot_mapping, nb::dtype<int64_t>(), 1, "slot_mapping");
          buffers.slot_mapping = static_cast<int64_t*>(sm.data());
          buffers.num_slots = static_cast<int64_t>(sm.shape(0));
        }
        const bool host = ip.device_type() == static_cast<int>(nb::device::cpu::value);
        CsrHostCopy copy;
        nb::object batch = building(self, ids, [&](KvCache& kv) -> StatusOr<DeviceBatch> {
          auto r = build_batch_into(kv, ids, buffers, &copy);
          // numpy reads the buffers without stream order: wait for the copies on the CPU.
          if (r.ok() && host) PAGEDKV_RETURN_IF_ERROR(kv.synchronize());
          return r;
        });
        return nb::make_tuple(batch, to_numpy(std::move(copy.kv_indptr)),
                              to_numpy(std::move(copy.kv_last_page_len)));
      },
      nb::arg("ids"), nb::arg("kv_indptr"), nb::arg("kv_indices"), nb::arg("kv_last_page_len"),
      nb::arg("slot_mapping").none() = nb::none(),
      "FlashInfer CUDA-graph mode: builds the batch and copies its CSR arrays (int32) into "
      "caller-owned fixed-address buffers, and its slot mapping (int64, padded with -1) into "
      "`slot_mapping` when given (then write_kv_batch over the batch may be captured); returns "
      "(batch, host kv_indptr, host kv_last_page_len) for plan(). Capacities are checked first.");
  cls.def(
      "append_indices",
      [](PyCache& s, PyBatch& b, nb::handle batch_indices, nb::handle positions) {
        if (b.owner != &s) throw_invalid("batch: built by another cache");
        auto coo = std::make_shared<AppendIndices>(value_or_throw(
            unlocked(s, [&](KvCache& kv) { return append_indices(kv, b.ids, b.device); })));
        if (!batch_indices.is_none() || !positions.is_none()) {
          const auto i32 = nb::dtype<int32_t>();
          nb::ndarray<> bi = as_index_buffer(*s.kv, batch_indices, i32, 1, "batch_indices");
          nb::ndarray<> ps = as_index_buffer(*s.kv, positions, i32, 1, "positions");
          const bool host = bi.device_type() == static_cast<int>(nb::device::cpu::value);
          check(unlocked(s, [&](KvCache& kv) -> Status {
            PAGEDKV_RETURN_IF_ERROR(upload_append_indices(
                kv, coo, static_cast<int32_t*>(bi.data()), static_cast<int32_t*>(ps.data()),
                static_cast<int64_t>(std::min(bi.shape(0), ps.shape(0)))));
            return host ? kv.synchronize() : ok_status();
          }));
        }
        return nb::make_tuple(to_numpy(std::vector<int32_t>(coo->append_indptr)),
                              to_numpy(std::vector<int32_t>(coo->batch_indices)),
                              to_numpy(std::vector<int32_t>(coo->positions)));
      },
      nb::arg("batch"), nb::arg("batch_indices") = nb::none(), nb::arg("positions") = nb::none(),
      "FlashInfer append path of a batch: (append_indptr, batch_indices, positions) int32 numpy as "
      "get_batch_indices_positions defines them; also copied into the device buffers when given.");
  cls.def(
      "build_vllm_batch_into",
      [](nb::handle self, const Ids& ids, nb::handle block_table, nb::handle slot_mapping) {
        PyCache& s = nb::cast<PyCache&>(self);
        nb::ndarray<> bt =
            as_index_buffer(*s.kv, block_table, nb::dtype<int32_t>(), 2, "block_table");
        nb::ndarray<> sm =
            as_index_buffer(*s.kv, slot_mapping, nb::dtype<int64_t>(), 1, "slot_mapping");
        VllmBuffers buffers;
        buffers.block_table = static_cast<int32_t*>(bt.data());
        buffers.max_reqs = static_cast<int32_t>(bt.shape(0));
        buffers.max_blocks = static_cast<int32_t>(bt.shape(1));
        buffers.slot_mapping = static_cast<int64_t*>(sm.data());
        buffers.num_slots = static_cast<int64_t>(sm.shape(0));
        const bool host = bt.device_type() == static_cast<int>(nb::device::cpu::value);
        return building(self, ids, [&](KvCache& kv) -> StatusOr<DeviceBatch> {
          auto r = build_vllm_batch_into(kv, ids, buffers);
          if (r.ok() && host) PAGEDKV_RETURN_IF_ERROR(kv.synchronize());
          return r;
        });
      },
      nb::arg("ids"), nb::arg("block_table"), nb::arg("slot_mapping"),
      "vLLM: builds the batch into a caller-owned int32 block_table [max_reqs, max_blocks] (-1 "
      "past a row's blocks) and an int64 slot_mapping padded with -1 to its length.");
}

}  // namespace pagedkv::python
