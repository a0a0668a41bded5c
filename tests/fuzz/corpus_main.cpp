// Runs a fuzz target's function over corpus files without libFuzzer (any compiler), checking
// what each file must give:
//   corpus_<target> --refuse DIR... --accept DIR... --any DIR...
// Files under a --refuse directory must be refused, under --accept accepted, under --any either
// (seed corpora). A crash, a finding (abort) or a file taking over 20 s fails the run. Missing
// directories are skipped (a corpus may be empty). Exits 1 if any file failed or none ran.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/fuzz_common.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  enum class Want { Refuse, Accept, Any };
  Want want = Want::Any;
  int passed = 0, failed = 0;
  double slowest_s = 0;
  std::string slowest;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--refuse" || arg == "--accept" || arg == "--any") {
      want = arg == "--refuse" ? Want::Refuse : arg == "--accept" ? Want::Accept : Want::Any;
      continue;
    }
    std::vector<fs::path> files;
    if (!fs::exists(arg)) continue;
    if (fs::is_directory(arg)) {
      for (const auto& e : fs::recursive_directory_iterator(arg))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      files.emplace_back(arg);
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      std::ifstream in(f, std::ios::binary);
      const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const auto t0 = std::chrono::steady_clock::now();
      const dcp::fuzz::Outcome got =
          dcp_fuzz_one(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > slowest_s) slowest_s = s, slowest = f.string();
      const bool ok = s <= 20.0 && (want == Want::Any || (want == Want::Refuse) == (got == dcp::fuzz::Outcome::Refused));
      if (ok) {
        ++passed;
      } else {
        ++failed;
        std::printf("FAILED %s: %s in %.1f s\n", f.c_str(), got == dcp::fuzz::Outcome::Refused ? "refused" : "accepted", s);
      }
    }
  }
  std::printf("slowest input: %s (%.3f s)\n", slowest.c_str(), slowest_s);
  std::printf("corpus files: %d as expected, %d not\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}
