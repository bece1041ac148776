// The calls KvCache and ModelKvCache bind alike: each takes the wrapper's lock without the GIL
// (unlocked), forwards to the C++ cache of the same name and maps its result. Written once here
// for both wrappers (PyCache, PyModelCache), with each class's docstring where the two differ.
#pragma once

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.hpp"

namespace pagedkv::python {

template <typename T>
struct IsStatusOr : std::false_type {};
template <typename T>
struct IsStatusOr<StatusOr<T>> : std::true_type {};

/// Runs `fn` on the wrapper's cache through unlocked() and maps what it returns: a Status
/// raises (StatusError) or gives nothing, a StatusOr raises or gives its value, anything else is
/// given back as is.
template <typename Wrapper, typename Fn>
auto unlocked_result(Wrapper& self, Fn&& fn) {
  auto r = unlocked(self, std::forward<Fn>(fn));
  using R = decltype(r);
  if constexpr (std::is_same_v<R, Status>) {
    check(r);
  } else if constexpr (IsStatusOr<R>::value) {
    return value_or_throw(std::move(r));
  } else {
    return r;
  }
}

/// The docstring of a call for `Wrapper`: KvCache's (PyCache) or ModelKvCache's (PyModelCache),
/// where they say different things (one cache's sequence, or one in every group).
template <typename Wrapper>
constexpr const char* doc(const char* kv_cache, const char* model_cache) {
  static_assert(std::is_same_v<Wrapper, PyCache> || std::is_same_v<Wrapper, PyModelCache>);
  return std::is_same_v<Wrapper, PyCache> ? kv_cache : model_cache;
}

/// add_sequence(id, prompt, priority=0, ns=0, retention_priority, retention_duration_ns=0).
template <typename Wrapper>
void def_add_sequence(nb::class_<Wrapper>& cls) {
  cls.def(
      "add_sequence",
      [](Wrapper& s, SequenceId id, const std::vector<TokenId>& prompt, int32_t priority,
         NamespaceId ns, int32_t retention_priority, int64_t retention_duration_ns) {
        SequenceOptions o;
        o.priority = priority;
        o.ns = ns;
        o.retention_priority = retention_priority;
        o.retention_duration_ns = retention_duration_ns;
        return unlocked_result(s, [&](auto& c) { return c.add_sequence(id, prompt, o); });
      },
      nb::arg("id"), nb::arg("prompt"), nb::arg("priority") = 0, nb::arg("ns") = 0,
      nb::arg("retention_priority") = kDefaultRetentionPriority,
      nb::arg("retention_duration_ns") = 0,
      doc<Wrapper>("Adds a sequence; returns how many prompt tokens are already cached (full "
                   "blocks of a known prefix). AlreadyExistsError, InvalidArgumentError.",
                   "Adds a sequence to every group; returns the prompt tokens every group can "
                   "supply from its prefix cache. AlreadyExistsError, InvalidArgumentError."));
}

/// commit, commit_batch, rollback, fork, finish, erase, set_active, set_priority.
template <typename Wrapper>
void def_lifecycle_calls(nb::class_<Wrapper>& cls) {
  using Ids = std::vector<SequenceId>;
  using Tokens = std::vector<TokenId>;
  cls.def(
      "commit",
      [](Wrapper& s, SequenceId id, const Tokens& tokens) {
        unlocked_result(s, [&](auto& c) { return c.commit(id, tokens); });
      },
      nb::arg("id"), nb::arg("tokens"),
      doc<Wrapper>(
          "Commits the token ids of the first len(tokens) reserved slots; full blocks enter the "
          "prefix index. FailedPreconditionError when nothing is reserved.",
          "Commits in every group (checked in full first). FailedPreconditionError when nothing is "
          "reserved or a group offloaded the sequence after its reserve (restore it first)."));
  cls.def(
      "commit_batch",
      [](Wrapper& s, const Ids& ids, const Tokens& tokens, int64_t n_each) {
        unlocked_result(s, [&](auto& c) { return c.commit_batch(ids, tokens, n_each); });
      },
      nb::arg("ids"), nb::arg("tokens"), nb::arg("n_each") = 1,
      doc<Wrapper>("Commits n_each tokens for each of ids: tokens holds them sequence after "
                   "sequence. Everything is checked first.",
                   "Commits n_each tokens for each of ids in every group; tokens holds them "
                   "sequence after sequence."));
  cls.def(
      "rollback",
      [](Wrapper& s, SequenceId id, int64_t length) {
        unlocked_result(s, [&](auto& c) { return c.rollback(id, length); });
      },
      nb::arg("id"), nb::arg("length"),
      doc<Wrapper>("Shortens a sequence to `length` committed tokens (speculative decoding).",
                   "Shortens the sequence in every group. FailedPreconditionError, nothing "
                   "changed, when a window group no longer holds what the shorter length needs."));
  cls.def(
      "fork",
      [](Wrapper& s, SequenceId parent, SequenceId child) {
        unlocked_result(s, [&](auto& c) { return c.fork(parent, child); });
      },
      nb::arg("parent"), nb::arg("child"),
      doc<Wrapper>(
          "Creates `child` sharing every block of `parent` (parallel sampling, beam search).",
          "Forks the sequence in every group."));
  cls.def(
      "finish",
      [](Wrapper& s, SequenceId id) { unlocked_result(s, [&](auto& c) { return c.finish(id); }); },
      nb::arg("id"),
      doc<Wrapper>("Removes a sequence; its full blocks stay cached for later prompts.",
                   "Removes the sequence; its full blocks stay cached for later prompts."));
  cls.def(
      "erase",
      [](Wrapper& s, SequenceId id) { unlocked_result(s, [&](auto& c) { return c.erase(id); }); },
      nb::arg("id"),
      doc<Wrapper>("Removes a sequence and the blocks only it held.",
                   "Removes the sequence and the blocks only it held."));
  cls.def(
      "set_active",
      [](Wrapper& s, const Ids& ids) {
        unlocked_result(s, [&](auto& c) { return c.set_active(ids); });
      },
      nb::arg("ids"),
      doc<Wrapper>("Replaces the active set (never evicted or offloaded).",
                   "Replaces the active set (never evicted or offloaded) in every group."));
  cls.def(
      "set_priority",
      [](Wrapper& s, SequenceId id, int32_t priority) {
        unlocked_result(s, [&](auto& c) { return c.set_priority(id, priority); });
      },
      nb::arg("id"), nb::arg("priority"),
      doc<Wrapper>("Sets a sequence's scheduling priority (lower is offloaded or dropped first).",
                   "Sets the sequence's scheduling priority."));
}

/// offload, restore, prefetch, residency, drain_evicted_sequences.
template <typename Wrapper>
void def_tier_calls(nb::class_<Wrapper>& cls) {
  cls.def(
      "offload",
      [](Wrapper& s, SequenceId id) { unlocked_result(s, [&](auto& c) { return c.offload(id); }); },
      nb::arg("id"),
      doc<Wrapper>("Queues the offload of an inactive sequence to the host tier (copy stream).",
                   "Offloads the sequence in every group (a window group moves its window only); "
                   "on an error the groups that went ahead restore it."));
  cls.def(
      "restore",
      [](Wrapper& s, SequenceId id) { unlocked_result(s, [&](auto& c) { return c.restore(id); }); },
      nb::arg("id"),
      doc<Wrapper>(
          "Queues the restore of an offloaded sequence; later compute-stream work waits for it.",
          "Restores the sequence in every group where it is offloaded."));
  cls.def(
      "prefetch",
      [](Wrapper& s, const std::vector<SequenceId>& ids) {
        unlocked_result(s, [&](auto& c) { return c.prefetch(ids); });
      },
      nb::arg("ids"),
      doc<Wrapper>("Queues the restore of those of ids that are offloaded while free device blocks "
                   "suffice; never offloads others.",
                   "KvCache.prefetch in every group."));
  cls.def(
      "residency",
      [](Wrapper& s, SequenceId id) {
        return unlocked_result(s, [&](auto& c) { return c.residency(id); });
      },
      nb::arg("id"),
      doc<Wrapper>("SequenceResidency.DEVICE, IN_FLIGHT or HOST. NotFoundError.",
                   "The least ready residency over the groups. NotFoundError."));
  cls.def(
      "drain_evicted_sequences",
      [](Wrapper& s) {
        return unlocked_result(s, [](auto& c) { return c.drain_evicted_sequences(); });
      },
      doc<Wrapper>("Sequences dropped (not offloaded) to make room since the last call.",
                   "Sequences some group dropped to make room since the last call (gone from every "
                   "group)."));
}

/// synchronize().
template <typename Wrapper>
void def_synchronize(nb::class_<Wrapper>& cls) {
  cls.def(
      "synchronize",
      [](Wrapper& s) { unlocked_result(s, [](auto& c) { return c.synchronize(); }); },
      doc<Wrapper>("Blocks until the cache's queued work (kernels and transfers) is done.",
                   "Blocks until the model's queued work (kernels and transfers) is done."));
}

/// fetch_from_storage(prompt, ns=0).
template <typename Wrapper>
void def_fetch_from_storage(nb::class_<Wrapper>& cls) {
  cls.def(
      "fetch_from_storage",
      [](Wrapper& s, const std::vector<TokenId>& prompt, NamespaceId ns) {
        SequenceOptions o;
        o.ns = ns;
        return unlocked_result(s, [&](auto& c) { return c.fetch_from_storage(prompt, o); });
      },
      nb::arg("prompt"), nb::arg("ns") = 0,
      doc<Wrapper>(
          "Starts bringing the blocks the storage tier holds after the prompt's cached prefix into "
          "free host slots; returns how many blocks are on their way (0 without a storage tier). "
          "Never waits: they become prefix hits once landed (poll_storage, flush_storage). "
          "OutOfRangeError for a prompt past max_sequence_length.",
          "Starts bringing back from the groups' stores what a prefix hit of the prompt needs: the "
          "full-attention groups the blocks after their cached prefix, then the window groups the "
          "blocks their window lacks at the hit the full groups reach (all or none). Returns the "
          "blocks on their way over all groups; never waits."));
}

/// poll_storage, storage_in_flight, flush_storage.
template <typename Wrapper>
void def_storage_progress(nb::class_<Wrapper>& cls) {
  cls.def(
      "poll_storage",
      [](Wrapper& s) { unlocked_result(s, [](auto& c) { return c.poll_storage(); }); },
      doc<Wrapper>("Lands finished storage reads (now prefix hits) and hands staged write-backs to "
                   "the store. Never waits; add_sequence, reserve and reserve_batch do it too.",
                   "KvCache.poll_storage in every group."));
  cls.def(
      "storage_in_flight",
      [](Wrapper& s) { return unlocked_result(s, [](auto& c) { return c.storage_in_flight(); }); },
      doc<Wrapper>("Blocks fetched from storage that have not landed yet.",
                   "Blocks fetched from storage that have not landed yet, over all groups."));
  cls.def(
      "flush_storage",
      [](Wrapper& s) { unlocked_result(s, [](auto& c) { return c.flush_storage(); }); },
      doc<Wrapper>("Waits (without the GIL) until every staged write-back and storage read has "
                   "finished and landed.",
                   "KvCache.flush_storage in every group (waits without the GIL)."));
}

/// contains, length, pending.
template <typename Wrapper>
void def_sequence_queries(nb::class_<Wrapper>& cls) {
  cls.def(
      "contains",
      [](Wrapper& s, SequenceId id) {
        return unlocked_result(s, [&](auto& c) { return c.contains(id); });
      },
      nb::arg("id"), "Whether the sequence exists (offloaded ones included).");
  cls.def(
      "length",
      [](Wrapper& s, SequenceId id) {
        return unlocked_result(s, [&](auto& c) { return c.length(id); });
      },
      nb::arg("id"),
      doc<Wrapper>("Committed token count. NotFoundError.",
                   "Committed token count (the same in every group). NotFoundError."));
  cls.def(
      "pending",
      [](Wrapper& s, SequenceId id) {
        return unlocked_result(s, [&](auto& c) { return c.pending(id); });
      },
      nb::arg("id"), "Reserved, uncommitted token count. NotFoundError.");
}

/// check_invariants().
template <typename Wrapper>
void def_check_invariants(nb::class_<Wrapper>& cls) {
  cls.def(
      "check_invariants",
      [](Wrapper& s) { unlocked_result(s, [](auto& c) { return c.check_invariants(); }); },
      doc<Wrapper>(
          "Recounts every reference and state; InternalError names the first broken invariant.",
          "Every group's invariants, and every sequence in every group with the same length and "
          "reservation; InternalError names the first broken one."));
}

/// drain_events().
template <typename Wrapper>
void def_drain_events(nb::class_<Wrapper>& cls) {
  cls.def(
      "drain_events",
      [](Wrapper& s) { return unlocked_result(s, [](auto& c) { return c.drain_events(); }); },
      doc<Wrapper>(
          "Control events since the last drain, as ControlEvent objects (block events carry their "
          "tier).",
          "Every group's control events since the last drain, each with its group index in .group. "
          "Order: the EVENTS_DROPPED event of every group whose event ring overflowed, in group "
          "order; then group 0's other events oldest first, then group 1's, and so on."));
}

// ---- the K/V data calls' common parts ----

/// Runs `write(cache)` (a write_kv or write_kv_batch from inputs `k`, `v`) under the lock; for
/// host (numpy) inputs, which may be freed when the call returns, waits for the copy to read
/// them.
template <typename Wrapper, typename Write>
void write_and_wait(Wrapper& s, const KvInput& k, Write&& write) {
  unlocked_result(s, [&](auto& c) -> Status {
    PAGEDKV_RETURN_IF_ERROR(write(c));
    return k.host_memory ? c.synchronize() : ok_status();
  });
}

/// The cache's write_kv and gather_layer on rank `rank` (a ModelKvCache has one rank: 0).
inline Status write_kv_on(KvCache& c, SequenceId id, int32_t layer, const KvInput& k,
                          const KvInput& v, int32_t rank) {
  return c.write_kv(id, layer, k.data, v.data, k.dtype, k.row_stride, rank);
}
inline Status write_kv_on(ModelKvCache& c, SequenceId id, int32_t layer, const KvInput& k,
                          const KvInput& v, int32_t /*rank*/) {
  return c.write_kv(id, layer, k.data, v.data, k.dtype, k.row_stride);
}
inline Status gather_layer_on(KvCache& c, SequenceId id, int32_t layer, const GatherOutput& out,
                              int64_t begin, int64_t n, int32_t rank) {
  return c.gather_layer(id, layer, out.key, out.value, out.dtype, out.layout, begin, n, rank);
}
inline Status gather_layer_on(ModelKvCache& c, SequenceId id, int32_t layer,
                              const GatherOutput& out, int64_t begin, int64_t n, int32_t /*rank*/) {
  return c.gather_layer(id, layer, out.key, out.value, out.dtype, out.layout, begin, n);
}

/// write_kv of the tokens reserved for `id` into layer `layer` (a model layer for a
/// ModelKvCache), on rank `rank` of a tensor-parallel cache. kInvalidArgument unless `k` has a
/// row per reserved token.
template <typename Wrapper>
void write_reserved_kv(Wrapper& s, SequenceId id, int32_t layer, const KvInput& k, const KvInput& v,
                       int32_t rank = 0) {
  write_and_wait(s, k, [&](auto& c) -> Status {
    PAGEDKV_ASSIGN_OR_RETURN(int64_t pending, c.pending(id));
    if (pending != k.rows) {
      return invalid_argument("key: " + std::to_string(k.rows) + " tokens, but sequence " +
                              std::to_string(id) + " has " + std::to_string(pending) + " reserved");
    }
    return write_kv_on(c, id, layer, k, v, rank);
  });
}

/// gather_layer of positions [begin, begin + num_tokens) (num_tokens < 0: to the end) of a
/// layer whose pool is `kv`'s (the wrapper's cache, or the layer's group), into new arrays owned
/// by `self`, from rank `rank` of a tensor-parallel cache (`kv` that rank's); waits for the copy.
template <typename Wrapper>
std::pair<DlArray, std::optional<DlArray>> gather_to_arrays(
    nb::handle self, const GroupRef& kv, SequenceId id, int32_t layer, const std::string& layout,
    std::optional<DType> dtype, int64_t begin, int64_t num_tokens, int32_t rank = 0) {
  Wrapper& s = nb::cast<Wrapper&>(self);
  int64_t n = num_tokens;
  if (n < 0) {
    n = unlocked_result(s, [&](auto& c) { return c.length(id); }) - begin;
    if (n < 0) throw StatusError(out_of_range("begin: past the committed tokens"));
  }
  GatherOutput out = gather_output(self, kv, layout, dtype, n);
  unlocked_result(s, [&](auto& c) -> Status {
    PAGEDKV_RETURN_IF_ERROR(gather_layer_on(c, id, layer, out, begin, n, rank));
    return c.synchronize();
  });
  return gather_result(kv, std::move(out));
}

}  // namespace pagedkv::python
