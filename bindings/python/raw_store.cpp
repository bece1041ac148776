// The raw store calls of pagedkv._C.StorageTier (FileTier, RedisTier) on caller buffers, for an
// engine that drives a store itself (vLLM's secondary tier, SGLang's HiCache storage): the
// StorageTier interface of pagedkv/storage_tier.hpp. A store serving a cache refuses them.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"

namespace pagedkv::python {
namespace {

// A key: an int (the block hash, namespace 0), a tuple (namespace, block hash), or 16 bytes
// (namespace then block hash, little-endian: a 128-bit digest of an engine's own key).
StorageKey key_of(nb::handle h, size_t i) {
  StorageKey k;
  if (nb::isinstance<nb::bytes>(h)) {
    const auto b = nb::borrow<nb::bytes>(h);
    if (b.size() != 16) {
      throw_invalid("keys[" + std::to_string(i) + "]: a bytes key has 16 bytes, not " +
                    std::to_string(b.size()));
    }
    const auto* p = static_cast<const unsigned char*>(static_cast<const void*>(b.c_str()));
    for (int j = 7; j >= 0; --j) k.ns = (k.ns << 8) | p[j];
    for (int j = 15; j >= 8; --j) k.block_hash = (k.block_hash << 8) | p[j];
    return k;
  }
  if (nb::isinstance<nb::tuple>(h)) {
    const auto t = nb::borrow<nb::tuple>(h);
    if (t.size() == 2 && nb::try_cast(t[0], k.ns) && nb::try_cast(t[1], k.block_hash)) return k;
  } else if (nb::try_cast(h, k.block_hash)) {
    return k;
  }
  throw_invalid("keys[" + std::to_string(i) +
                "]: an int, a tuple (namespace, block_hash) of unsigned 64-bit ints, or 16 bytes");
}

std::vector<StorageKey> keys_of(const nb::sequence& keys) {
  std::vector<StorageKey> out;
  size_t i = 0;
  for (nb::handle h : keys) out.push_back(key_of(h, i++));
  return out;
}

// One block's buffer: an int address, or a C-contiguous buffer object of exactly block_bytes
// (writable for gets), e.g. a numpy row or a memoryview of one chunk.
void* address_of(nb::handle h, size_t i, int64_t block_bytes, bool writable) {
  uintptr_t address = 0;
  if (!nb::isinstance<nb::bool_>(h) && nb::try_cast(h, address)) {
    if (address == 0) throw_invalid("buffers[" + std::to_string(i) + "]: a null address");
    return reinterpret_cast<void*>(address);
  }
  Py_buffer view;
  const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(h.ptr(), &view, flags) != 0) {
    PyErr_Clear();
    throw_invalid("buffers[" + std::to_string(i) + "]: an int address or a C-contiguous" +
                  (writable ? " writable" : "") + " buffer of " + std::to_string(block_bytes) +
                  " bytes");
  }
  void* p = view.buf;
  const Py_ssize_t n = view.len;
  PyBuffer_Release(&view);  // the caller keeps the object (and so its memory) alive
  if (n != block_bytes) {
    throw_invalid("buffers[" + std::to_string(i) + "]: " + std::to_string(n) +
                  " bytes, the layout's blocks have " + std::to_string(block_bytes));
  }
  return p;
}

void check_free(const PyStore& s) {
  if (s.user != nullptr) {
    throw StatusError(failed_precondition(
        "the store serves a cache: its raw calls are for a store no cache uses"));
  }
}

template <typename F>
auto with_store(PyStore& s, F&& f) {
  nb::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(s.raw_mu);
  return f(*s.tier);
}

nb::dict completion_dict(const StorageCompletion& c) {
  nb::dict d;
  d["job"] = c.job;
  d["ok"] = c.ok;
  d["error"] = c.error;
  d["blocks_ok"] = c.blocks_ok;
  return d;
}

// The completions Python takes: their jobs' buffers are no longer needed (GIL held).
nb::list take_completions(PyStore& s, const std::vector<StorageCompletion>& done) {
  nb::list out;
  for (const StorageCompletion& c : done) {
    s.held_buffers.erase(c.job);
    out.append(completion_dict(c));
  }
  return out;
}

// The addresses of `buffers`, and the buffer objects, for the store to hold while a job runs.
template <typename P>
std::vector<P> addresses(const nb::sequence& buffers, int64_t bytes, bool writable,
                         std::vector<nb::object>* held) {
  std::vector<P> p;
  size_t i = 0;
  for (nb::handle b : buffers) {
    p.push_back(address_of(b, i++, bytes, writable));
    held->push_back(nb::borrow(b));
  }
  return p;
}

}  // namespace

void def_raw_store_calls(nb::class_<PyStore>& cls) {
  cls.def(
      "batch_exists",
      [](PyStore& s, const nb::sequence& keys) {
        check_free(s);
        const std::vector<StorageKey> k = keys_of(keys);
        return value_or_throw(with_store(s, [&](StorageTier& t) { return t.batch_exists(k); }));
      },
      nb::arg("keys"),
      "How many of keys, from the first, are stored. A key is an int (block hash, namespace 0), "
      "a tuple (namespace, block hash) or 16 bytes (a 128-bit key: namespace then hash, "
      "little-endian). FailedPreconditionError while a cache uses the store.");
  cls.def(
      "submit_put",
      [](PyStore& s, const nb::sequence& keys, const nb::sequence& buffers) {
        check_free(s);
        const std::vector<StorageKey> k = keys_of(keys);
        const int64_t bytes = s.tier->layout().block_bytes;
        std::vector<const void*> p;
        size_t i = 0;
        for (nb::handle b : buffers) p.push_back(address_of(b, i++, bytes, false));
        return value_or_throw(with_store(s, [&](StorageTier& t) { return t.submit_put(k, p); }));
      },
      nb::arg("keys"), nb::arg("buffers"),
      "Queues writes of keys[i] from buffers[i] (an int address or a buffer of the layout's "
      "block_bytes); the bytes are copied before it returns. Returns the job id. "
      "ResourceExhaustedError (nothing queued) when the write queue is full; "
      "InvalidArgumentError for mismatched lists or a buffer of another size.");
  cls.def(
      "submit_put_borrowed",
      [](PyStore& s, const nb::sequence& keys, const nb::sequence& buffers) {
        check_free(s);
        const std::vector<StorageKey> k = keys_of(keys);
        std::vector<nb::object> held;
        const std::vector<const void*> p =
            addresses<const void*>(buffers, s.tier->layout().block_bytes, false, &held);
        const uint64_t job = value_or_throw(
            with_store(s, [&](StorageTier& t) { return t.submit_put_borrowed(k, p); }));
        s.held_buffers.emplace(job, std::move(held));  // alive until poll() or wait() takes it
        return job;
      },
      nb::arg("keys"), nb::arg("buffers"),
      "Queues writes of keys[i] from buffers[i] without copying them: the store's threads read "
      "the buffers, which must stay unchanged (and int addresses valid) until poll() or wait() "
      "reports the job; buffer objects are kept alive until then. Returns the job id. "
      "ResourceExhaustedError (nothing queued) when the write queue is full; "
      "InvalidArgumentError for mismatched lists or a buffer of another size.");
  cls.def(
      "submit_get",
      [](PyStore& s, const nb::sequence& keys, const nb::sequence& buffers) {
        check_free(s);
        const std::vector<StorageKey> k = keys_of(keys);
        std::vector<nb::object> held;
        const std::vector<void*> p =
            addresses<void*>(buffers, s.tier->layout().block_bytes, true, &held);
        const uint64_t job =
            value_or_throw(with_store(s, [&](StorageTier& t) { return t.submit_get(k, p); }));
        s.held_buffers.emplace(job, std::move(held));  // alive until poll() or wait() takes it
        return job;
      },
      nb::arg("keys"), nb::arg("buffers"),
      "Queues reads of keys[i] into buffers[i] (int addresses, which must stay valid until the "
      "job completes, or writable buffers, which the store keeps alive until poll() or wait() "
      "takes the job). Returns the job id. InvalidArgumentError.");
  cls.def(
      "poll",
      [](PyStore& s) {
        check_free(s);
        return take_completions(s, with_store(s, [](StorageTier& t) { return t.poll(); }));
      },
      "The jobs finished since the last poll: dicts {job, ok, error, blocks_ok} (a failed get's "
      "blocks_ok leading blocks are good).");
  cls.def(
      "wait",
      [](PyStore& s, const std::vector<uint64_t>& jobs, std::optional<double> timeout) {
        check_free(s);
        if (timeout && !(*timeout >= 0)) {
          throw_invalid("timeout: seconds >= 0, or None for no limit");
        }
        // Beyond about 300 years is no limit (and would overflow the milliseconds).
        const int64_t ms =
            timeout && *timeout < 1e13 ? static_cast<int64_t>(*timeout * 1000.0 + 0.5) : -1;
        StatusOr<std::vector<StorageCompletion>> done = [&] {
          // Not under raw_mu: other threads submit and poll while this one waits.
          nb::gil_scoped_release release;
          return s.tier->wait(jobs, ms);
        }();
        return take_completions(s, value_or_throw(std::move(done)));
      },
      nb::arg("jobs"), nb::arg("timeout") = nb::none(),
      "Blocks (without the GIL) until every job of jobs has finished or timeout seconds pass "
      "(None: no limit), and takes their completions: dicts as poll() gives, for those that "
      "finished; a later poll() does not report them, other jobs' completions stay for it. "
      "May be called from another thread while one submits. NotFoundError (nothing taken) for "
      "a job already taken or never submitted.");
  cls.def(
      "exists_each",
      [](PyStore& s, const nb::sequence& keys) {
        check_free(s);
        const std::vector<StorageKey> k = keys_of(keys);
        return value_or_throw(with_store(s, [&](StorageTier& t) { return t.exists_each(k); }));
      },
      nb::arg("keys"),
      "Whether each of keys is stored: a list of bools (batch_exists counts only the leading "
      "ones). An unreachable store answers all False.");
  cls.def(
      "drain",
      [](PyStore& s) {
        check_free(s);
        with_store(s, [](StorageTier& t) {
          t.drain();
          return 0;
        });
      },
      "Waits until every queued job has finished (their results come from the next poll).");
  cls.def(
      "remove",
      [](PyStore& s, const nb::sequence& keys) {
        check_free(s);
        const std::vector<StorageKey> k = keys_of(keys);
        check(with_store(s, [&](StorageTier& t) { return t.remove(k); }));
      },
      nb::arg("keys"),
      "Queues the removal of the stored blocks of keys (missing ones are no error); done by "
      "the next drain().");
}

}  // namespace pagedkv::python
