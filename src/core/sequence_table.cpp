#include "core/sequence_table.hpp"

#include <cassert>

namespace pagedkv {
namespace core {

Sequence* SequenceTable::create(SequenceId id) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  Sequence* raw = s.get();
  const bool inserted = map_.emplace(id, std::move(s)).second;
  assert(inserted);
  (void)inserted;
  return raw;
}

void SequenceTable::destroy(SequenceId id) {
  auto it = map_.find(id);
  assert(it != map_.end() && !it->second->is_victim);
  map_.erase(it);
  ++generation_;
}

void SequenceTable::set_victim(Sequence* s, const VictimKey& key) {
  if (s->is_victim) {
    if (s->victim_key == key) return;
    victims_.erase(s->victim_key);
  }
  s->victim_key = key;
  s->is_victim = true;
  victims_.insert(key);
}

void SequenceTable::clear_victim(Sequence* s) {
  if (!s->is_victim) return;
  victims_.erase(s->victim_key);
  s->is_victim = false;
}

}  // namespace core
}  // namespace pagedkv
