// The input is a Hugging Face folder's config.json (tests/fuzz/hf_folder_fixture.h: beside a tiny
// Llama's weights in two shards). HfFolder must refuse it naming the folder, or accept it only
// for a model whose every tensor the shards hold with its shape.
#include "hf_folder_fixture.h"

#include "cleave/checkpoint/hf_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave;
  const std::string& dir = fuzz::hf_folder();
  fuzz::write_bytes(dir + "/config.json", {reinterpret_cast<const char*>(data), size});
  fuzz::accepted([&] { HfFolder folder(dir); }, dir);
  return 0;
}
