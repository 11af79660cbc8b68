#include "cleave/serve/prefix_cache.h"

namespace cleave::serve {

size_t PrefixCache::Hash::operator()(const std::vector<int32_t>& v) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the ids
  for (int32_t t : v) h = (h ^ uint32_t(t)) * 1099511628211ull;
  return size_t(h);
}

void PrefixCache::touch(Entry& e) { lru_.splice(lru_.end(), lru_, e.used); }

std::vector<PrefixCache::Entry*> PrefixCache::walk(const std::vector<int32_t>& tokens,
                                                   int64_t limit) {
  std::vector<Entry*> found;
  const int64_t br = pool_.block_rows();
  std::vector<int32_t> key;
  for (int64_t end = br; end <= limit && end <= int64_t(tokens.size()); end += br) {
    key.assign(tokens.begin(), tokens.begin() + end);
    const auto it = entries_.find(key);
    if (it == entries_.end()) break;
    found.push_back(&it->second);
  }
  return found;
}

std::vector<int32_t> PrefixCache::match(const std::vector<int32_t>& tokens, int64_t limit) {
  std::vector<int32_t> out;
  for (Entry* e : walk(tokens, limit)) {
    pool_.retain(e->block);
    touch(*e);
    out.push_back(e->block);
  }
  return out;
}

int64_t PrefixCache::matched(const std::vector<int32_t>& tokens, int64_t limit) {
  return int64_t(walk(tokens, limit).size());
}

void PrefixCache::insert(const std::vector<int32_t>& tokens, const SequenceCache& seq) {
  const int64_t br = pool_.block_rows();
  for (int64_t i = 0; (i + 1) * br <= seq.length && i < int64_t(seq.blocks.size()); ++i) {
    std::vector<int32_t> key(tokens.begin(), tokens.begin() + (i + 1) * br);
    auto [it, fresh] = entries_.try_emplace(std::move(key), Entry{seq.blocks[size_t(i)], {}});
    if (!fresh) {  // the same prefix computed again (two requests at once): the first copy stays
      touch(it->second);
      continue;
    }
    pool_.retain(it->second.block);
    it->second.used = lru_.insert(lru_.end(), &it->first);
  }
}

bool PrefixCache::evict_one() {
  for (auto key = lru_.begin(); key != lru_.end(); ++key) {
    const auto it = entries_.find(**key);
    if (pool_.refs(it->second.block) > 1) continue;  // a running sequence holds it too
    pool_.release(it->second.block);
    lru_.erase(key);
    entries_.erase(it);
    return true;
  }
  return false;
}

}  // namespace cleave::serve
