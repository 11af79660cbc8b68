// Automatic prefix caching (vLLM's): the whole blocks of finished and preempted sequences stay in
// the pool, held by this cache, for the next request that begins with the same tokens; it shares
// them (model/kv_pool.h's reference counts) instead of computing them again. An entry's key is the
// whole token prefix up to the end of its block, compared in full, so two prefixes never meet by
// a hash collision. Blocks only the cache holds are given back, least recently used first, when
// the pool needs them.
#pragma once
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "cleave/model/kv_pool.h"

namespace cleave::serve {

class PrefixCache {
 public:
  explicit PrefixCache(KvPool& pool) : pool_(pool) {}
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The cached blocks of the longest prefix of tokens[0, limit) made of whole blocks, each retained
  // once more for the caller (who releases them with its sequence).
  std::vector<int32_t> match(const std::vector<int32_t>& tokens, int64_t limit);
  // How many blocks match would give, taking none.
  int64_t matched(const std::vector<int32_t>& tokens, int64_t limit);
  // Keeps the whole blocks of seq, whose blocks hold tokens[0, seq.length), for later requests.
  void insert(const std::vector<int32_t>& tokens, const SequenceCache& seq);
  // Gives back the least recently used block that only the cache holds; false when there is none.
  bool evict_one();
  int64_t blocks() const { return int64_t(entries_.size()); }

 private:
  struct Hash {
    size_t operator()(const std::vector<int32_t>& v) const;
  };
  struct Entry {
    int32_t block;
    std::list<const std::vector<int32_t>*>::iterator used;  // its place in lru_
  };
  void touch(Entry& e);
  // The entries of the longest prefix of tokens[0, limit) made of whole cached blocks, in order.
  std::vector<Entry*> walk(const std::vector<int32_t>& tokens, int64_t limit);
  KvPool& pool_;
  std::unordered_map<std::vector<int32_t>, Entry, Hash> entries_;
  std::list<const std::vector<int32_t>*> lru_;  // keys of entries_, least recently used first
};

}  // namespace cleave::serve
