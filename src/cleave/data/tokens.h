// Token shards: the binary files `cleave tokenize` writes and the trainer reads.
// Layout (little-endian): a 32-byte header { char magic[8] = "CLVTOKS\0"; uint32 version = 1;
// uint32 token_width (2 or 4 bytes); uint64 token_count; uint32 vocab_size; uint32 reserved = 0 }
// followed by token_count tokens of token_width bytes each.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cleave {

void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens,
                       uint32_t vocab_size);

// Reads and validates a shard: magic, version, token width, file size against token_count, and
// (when expected_vocab_size != 0) the vocabulary size. Every error names the file and the fault.
class TokenShard {
 public:
  TokenShard(const std::string& path, uint32_t expected_vocab_size);
  uint64_t size() const { return tokens_.size(); }
  uint32_t vocab_size() const { return vocab_size_; }
  const std::vector<uint32_t>& tokens() const { return tokens_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  uint32_t vocab_size_ = 0;
  std::vector<uint32_t> tokens_;
};

}  // namespace cleave
