// Fuzz target: the dataset JSONL reader (one batch per line, errors name the line).
#include <string>

#include "dcp/io.h"
#include "fuzz/fuzz_common.h"

using namespace dcp;

fuzz::Outcome dcp_fuzz_one(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  return fuzz::guarded([&] {
    const std::vector<Batch> batches = parse_dataset(text, "fuzz.jsonl");
    fuzz::require(!batches.empty(), "empty dataset accepted");
    std::string again;
    for (const Batch& b : batches) again += batch_to_json(b, false) + "\n";
    fuzz::require(parse_dataset(again, "round trip").size() == batches.size(), "dataset changed by a round trip");
  });
}
