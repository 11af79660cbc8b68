// The input is a Hugging Face folder's model.safetensors.index.json (tests/fuzz/
// hf_folder_fixture.h: a tiny Llama's config.json and two shards, and a folder, a FIFO and a link
// to /dev/zero under shard names). HfFolder must refuse it naming the folder, or accept it only
// when it lists every tensor in the shard that holds it.
#include "hf_folder_fixture.h"

#include "cleave/checkpoint/hf_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave;
  const std::string& dir = fuzz::hf_folder();
  fuzz::write_bytes(dir + "/model.safetensors.index.json",
                    {reinterpret_cast<const char*>(data), size});
  fuzz::accepted([&] { HfFolder folder(dir); }, dir);
  return 0;
}
