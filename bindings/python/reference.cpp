// C++ references the Python tests and benchmark compare against in the same process: the decode
// attention kernel of examples/paged_decode_attention, and the step calls timed from C++.
#include <nanobind/stl/vector.h>

#include <chrono>

#include "common.hpp"
#include "kernels/decode_attention.hpp"

namespace pagedkv::python {
void register_reference(nb::module_& m, nb::class_<PyCache>& cls) {
  cls.def(
      "_decode_attention",
      [](nb::handle self, nb::handle batch, nb::handle q, int32_t layer, float sm_scale) {
        PyCache& s = nb::cast<PyCache&>(self);
        PyBatch& b = nb::cast<PyBatch&>(batch);
        if (b.owner != &s || !b.current()) throw_invalid("batch: not this cache's current batch");
        const DeviceBatch* device = &b.device;
        nb::ndarray<> qa = as_array(q, "q");
        check_device(*s.kv, qa, "q");
        const CacheConfig& c = s.kv->config();
        if (qa.ndim() != 3 || qa.shape(0) != size_t(device->host->batch_size) ||
            qa.shape(2) != size_t(c.head_dim) || qa.shape(1) % size_t(c.num_kv_heads) != 0 ||
            qa.stride(2) != 1 || qa.stride(1) != c.head_dim ||
            qa.stride(0) != int64_t(qa.shape(1)) * c.head_dim) {
          throw_invalid("q: C-contiguous [batch, q_heads (a multiple of kv heads), head_dim]");
        }
        const size_t elems = qa.shape(0) * qa.shape(1) * qa.shape(2);
        void* out = nullptr;
        nb::object mem = allocate_device(self, elems * sizeof(float), &out);
        kernels::DecodeAttentionBody body;
        body.q = qa.data();
        body.q_dtype = from_dlpack(qa.dtype(), "q");
        body.out = static_cast<float*>(out);
        body.num_q_heads = static_cast<int32_t>(qa.shape(1));
        body.layer = layer;
        body.sm_scale = sm_scale;
        check(unlocked(s, [&](KvCache& kv) -> Status {
          body.view = kv.device_view(*device);
          const KernelLaunch launch{KernelId::kDecodeAttention, &body, sizeof(body),
                                    int64_t(qa.shape(0)) * int64_t(qa.shape(1))};
          PAGEDKV_RETURN_IF_ERROR(kv.backend().launch(launch, kv.compute_stream()));
          return kv.synchronize();
        }));
        const size_t shape[3] = {qa.shape(0), qa.shape(1), qa.shape(2)};
        return DlArray(out, 3, shape, mem, nullptr, nb::dtype<float>(), backend_device_type(*s.kv),
                       backend_device_id(*s.kv));
      },
      nb::arg("batch"), nb::arg("q"), nb::arg("layer"), nb::arg("sm_scale"),
      "The C++ reference decode attention (kernels/decode_attention.hpp, the kernel of "
      "examples/paged_decode_attention) over a built batch; float32 [batch, q_heads, dim].");
  cls.def(
      "_bench_step_cpp",
      [](PyCache& s, const std::vector<SequenceId>& ids, int64_t steps) {
        // The same calls as a Python step (reserve_batch, build_batch, commit_batch), from C++.
        const std::vector<TokenId> tokens(ids.size(), 1);
        ++s.batch_serial;  // its build_batch calls retire the device arrays of Python batches
        return unlocked(s, [&](KvCache& kv) -> double {
          const auto t0 = std::chrono::steady_clock::now();
          for (int64_t i = 0; i < steps; ++i) {
            check(kv.reserve_batch(ids, 1).status());
            check(kv.build_batch(ids).status());
            check(kv.commit_batch(ids, tokens, 1));
          }
          return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        });
      },
      nb::arg("ids"), nb::arg("steps"),
      "Seconds for `steps` C++ steps of reserve_batch + build_batch + commit_batch.");
}

}  // namespace pagedkv::python
