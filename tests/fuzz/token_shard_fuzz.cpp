// The input is a token shard. TokenShard must refuse it (naming the file) or hold exactly the
// tokens the file has, every id below the shard's vocabulary size. A folder, a FIFO or a device is
// refused by name.
#include <string>

#include "cleave/data/tokens.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave;
  fuzz::refuses_once(fuzz::special_files(), [](const std::string& p) { TokenShard(p, 0); });
  const std::string path = fuzz::scratch() + "/input.bin";
  fuzz::write_bytes(path, {reinterpret_cast<const char*>(data), size});
  fuzz::accepted(
      [&] {
        const TokenShard shard(path, 0);
        if (shard.size() > size / 2)
          fuzz::finding(std::to_string(shard.size()) + " tokens accepted from " +
                        std::to_string(size) + " bytes");
        for (uint32_t id : shard.tokens())
          if (id >= shard.vocab_size())
            fuzz::finding("token id " + std::to_string(id) + " accepted with vocab size " +
                          std::to_string(shard.vocab_size()));
        // The trainer names the vocabulary it expects: any other is refused.
        const uint32_t other = shard.vocab_size() == 1 ? 2 : shard.vocab_size() - 1;
        if (fuzz::accepted([&] { TokenShard(path, other); }, path))
          fuzz::finding("vocab size " + std::to_string(shard.vocab_size()) + " accepted as " +
                        std::to_string(other));
      },
      path);
  return 0;
}
