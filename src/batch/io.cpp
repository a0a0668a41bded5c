// Batch JSON and dataset JSONL (docs/formats.md), and plain file access.
#include "dcp/io.h"

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "batch/json_reader.h"
#include "dcp/error.h"

namespace dcp {

using detail::element;
using detail::Json;
using detail::JsonReader;
using detail::member;

namespace {

constexpr const char* kMaskKinds = "full, causal, lambda, causal_blockwise, chunked, shared_question, ranges";

// Reads an optional integer member: absent keeps `fallback`.
int64_t optional_int(const JsonReader& r, const Json& obj, const std::string& path, const char* key,
                     int64_t fallback) {
  auto it = obj.find(key);
  return it == obj.end() ? fallback : r.get_int(*it, member(path, key));
}

void require_at_least(const JsonReader& r, int64_t v, int64_t min, const std::string& path) {
  if (v < min) r.fail(path, "must be >= " + std::to_string(min) + ", got " + std::to_string(v));
}

std::vector<std::vector<Range>> parse_rows(const JsonReader& r, const Json& rows, const std::string& path,
                                           int64_t length) {
  r.require_array(rows, path);
  if (static_cast<int64_t>(rows.size()) != length) {
    r.fail(path, "expected one row per token (" + std::to_string(length) + "), got " +
                     std::to_string(rows.size()) + " rows");
  }
  std::vector<std::vector<Range>> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string row_path = element(path, i);
    r.require_array(rows[i], row_path);
    int64_t prev_end = 0;
    for (size_t k = 0; k < rows[i].size(); ++k) {
      const std::string range_path = element(row_path, k);
      const Json& pair = rows[i][k];
      if (!pair.is_array() || pair.size() != 2) {
        r.fail(range_path, "expected a range [begin, end], got " + (pair.is_array() ? pair.dump() : detail::describe(pair)));
      }
      const Range range{r.get_int(pair[0], element(range_path, 0)), r.get_int(pair[1], element(range_path, 1))};
      // Built by appending: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string&&.
      std::string shown = "[";
      shown.append(std::to_string(range.begin)).append(", ").append(std::to_string(range.end)).append("]");
      if (range.begin < 0 || range.end > length || range.begin >= range.end) {
        r.fail(range_path, "range " + shown + " is empty or outside the sequence (expected 0 <= begin < end <= " +
                               std::to_string(length) + ")");
      }
      if (k > 0 && range.begin < prev_end) {
        r.fail(range_path, "range " + shown + " begins before the previous range ends at " +
                               std::to_string(prev_end) + " (expected sorted, disjoint ranges)");
      }
      prev_end = range.end;
      out[i].push_back(range);
    }
  }
  return out;
}

Mask parse_shared_question(const JsonReader& r, const Json& m, const std::string& path, int64_t length) {
  auto q_it = m.find("question");
  auto a_it = m.find("answers");
  if (q_it == m.end() && a_it == m.end()) {
    if (length < 5) {
      r.fail(path, "a shared_question mask with default parts needs at least 5 tokens, got length " +
                       std::to_string(length) + " (give question and answers explicitly)");
    }
    return Mask::shared_question_for(length);
  }
  Mask mask;
  mask.kind = MaskKind::SharedQuestion;
  int64_t answers_total = 0;
  if (a_it != m.end()) {
    const std::string a_path = member(path, "answers");
    r.require_array(*a_it, a_path);
    if (a_it->empty()) r.fail(a_path, "expected at least one answer, got an empty array");
    for (size_t k = 0; k < a_it->size(); ++k) {
      const int64_t a = r.get_int((*a_it)[k], element(a_path, k));
      require_at_least(r, a, 1, element(a_path, k));
      if (a > length) r.fail(element(a_path, k), "answer of " + std::to_string(a) + " tokens exceeds the sequence length " + std::to_string(length));
      mask.answers.push_back(a);
      answers_total += a;
    }
  }
  if (q_it != m.end()) {
    mask.question = r.get_int(*q_it, member(path, "question"));
    require_at_least(r, mask.question, 0, member(path, "question"));
    if (mask.question > length) {
      r.fail(member(path, "question"), "question of " + std::to_string(mask.question) +
                                           " tokens exceeds the sequence length " + std::to_string(length));
    }
  } else {
    mask.question = length - answers_total;  // answers given: the question is the rest
  }
  if (a_it == m.end()) {
    // Question given: the rest split into 4 answers, the first ones one token longer.
    const int64_t rest = length - mask.question;
    if (rest < 4) {
      r.fail(member(path, "question"), "question of " + std::to_string(mask.question) + " tokens leaves " +
                                           std::to_string(rest) + " tokens, too few for the default 4 answers");
    }
    for (int64_t k = 0; k < 4; ++k) mask.answers.push_back(rest / 4 + (k < rest % 4 ? 1 : 0));
    answers_total = rest;
  }
  const int64_t total = mask.question + answers_total;
  if (total != length) {
    r.fail(path, "question " + std::to_string(mask.question) + " + answers " + std::to_string(answers_total) +
                     " = " + std::to_string(total) + (total > length ? " exceeds" : " does not cover") +
                     " the sequence length " + std::to_string(length) +
                     " (expected question + sum(answers) == length)");
  }
  return mask;
}

Mask parse_mask(const JsonReader& r, const Json& m, const std::string& path, int64_t length) {
  r.require_object(m, path);
  auto kind_it = m.find("kind");
  if (kind_it == m.end()) r.fail(member(path, "kind"), std::string("missing (expected one of ") + kMaskKinds + ")");
  const std::string kind = r.get_string(*kind_it, member(path, "kind"));
  if (kind == "full" || kind == "causal") {
    r.check_keys(m, path, {"kind"});
    return kind == "full" ? Mask::full() : Mask::causal();
  }
  if (kind == "lambda") {
    r.check_keys(m, path, {"kind", "sink", "window"});
    Mask mask = Mask::lambda();
    mask.sink = optional_int(r, m, path, "sink", mask.sink);
    mask.window = optional_int(r, m, path, "window", mask.window);
    require_at_least(r, mask.sink, 0, member(path, "sink"));
    require_at_least(r, mask.window, 1, member(path, "window"));
    return mask;
  }
  if (kind == "causal_blockwise") {
    r.check_keys(m, path, {"kind", "block", "local", "sink"});
    Mask mask = Mask::causal_blockwise();
    mask.block = optional_int(r, m, path, "block", mask.block);
    mask.local_blocks = optional_int(r, m, path, "local", mask.local_blocks);
    mask.sink_blocks = optional_int(r, m, path, "sink", mask.sink_blocks);
    require_at_least(r, mask.block, 1, member(path, "block"));
    require_at_least(r, mask.local_blocks, 0, member(path, "local"));
    require_at_least(r, mask.sink_blocks, 0, member(path, "sink"));
    return mask;
  }
  if (kind == "chunked") {
    r.check_keys(m, path, {"kind", "chunk"});
    Mask mask = Mask::chunked();
    mask.block = optional_int(r, m, path, "chunk", mask.block);
    require_at_least(r, mask.block, 1, member(path, "chunk"));
    return mask;
  }
  if (kind == "shared_question") {
    r.check_keys(m, path, {"kind", "question", "answers"});
    return parse_shared_question(r, m, path, length);
  }
  if (kind == "ranges") {
    r.check_keys(m, path, {"kind", "rows"});
    auto rows_it = m.find("rows");
    if (rows_it == m.end()) r.fail(member(path, "rows"), "missing (a ranges mask lists the allowed keys of every row)");
    return Mask::ranges(parse_rows(r, *rows_it, member(path, "rows"), length));
  }
  r.fail(member(path, "kind"), "unknown mask kind '" + kind + "' (expected one of " + kMaskKinds + ")");
}

AttentionShape parse_heads(const JsonReader& r, const Json& root, AttentionShape shape) {
  if (auto it = root.find("heads"); it != root.end()) {
    r.require_object(*it, "heads");
    r.check_keys(*it, "heads", {"q", "kv", "dim"});
    if (auto q = it->find("q"); q != it->end()) shape.q_heads = r.get_int32(*q, "heads.q");
    if (auto kv = it->find("kv"); kv != it->end()) shape.kv_heads = r.get_int32(*kv, "heads.kv");
    if (auto d = it->find("dim"); d != it->end()) shape.head_dim = r.get_int32(*d, "heads.dim");
  }
  if (auto it = root.find("dtype"); it != root.end()) {
    const std::string name = r.get_string(*it, "dtype");
    try {
      shape.dtype = parse_dtype(name, "dtype");
    } catch (const Error& e) {
      r.fail("", e.what());
    }
  }
  return shape;
}

Batch batch_from_json(const JsonReader& r, const Json& root) {
  r.require_object(root, "");
  r.check_keys(root, "", {"heads", "dtype", "sequences"});
  Batch batch;
  batch.shape = parse_heads(r, root, batch.shape);
  auto seqs = root.find("sequences");
  if (seqs == root.end()) r.fail("sequences", "missing (expected an array of sequences)");
  r.require_array(*seqs, "sequences");
  if (seqs->empty()) r.fail("sequences", "must hold at least one sequence, got none");
  batch.sequences.reserve(seqs->size());
  for (size_t i = 0; i < seqs->size(); ++i) {
    const std::string path = element("sequences", i);
    const Json& s = (*seqs)[i];
    r.require_object(s, path);
    r.check_keys(s, path, {"id", "length", "mask"});
    Sequence seq;
    if (auto id = s.find("id"); id != s.end()) seq.id = r.get_string(*id, member(path, "id"));
    auto len = s.find("length");
    if (len == s.end()) r.fail(member(path, "length"), "missing (expected the sequence length in tokens)");
    seq.length = r.get_int(*len, member(path, "length"));
    if (seq.length <= 0) r.fail(member(path, "length"), "must be > 0, got " + std::to_string(seq.length));
    if (seq.length > kMaxBatchTokens) {
      r.fail(member(path, "length"), "must be <= " + std::to_string(kMaxBatchTokens) + ", got " + std::to_string(seq.length));
    }
    if (auto m = s.find("mask"); m != s.end()) seq.mask = parse_mask(r, *m, member(path, "mask"), seq.length);
    batch.sequences.push_back(std::move(seq));
  }
  try {
    batch.validate();
  } catch (const Error& e) {
    raise(e.kind(), r.source() + ": " + e.what());
  }
  return batch;
}

nlohmann::ordered_json mask_to_json(const Mask& m) {
  nlohmann::ordered_json j;
  j["kind"] = to_string(m.kind);
  switch (m.kind) {
    case MaskKind::Full:
    case MaskKind::Causal: break;
    case MaskKind::Lambda:
      j["sink"] = m.sink;
      j["window"] = m.window;
      break;
    case MaskKind::CausalBlockwise:
      j["block"] = m.block;
      j["local"] = m.local_blocks;
      j["sink"] = m.sink_blocks;
      break;
    case MaskKind::Chunked: j["chunk"] = m.block; break;
    case MaskKind::SharedQuestion:
      j["question"] = m.question;
      j["answers"] = m.answers;
      break;
    case MaskKind::Ranges: {
      auto rows = nlohmann::ordered_json::array();
      if (m.rows) {
        for (const auto& row : *m.rows) {
          auto jr = nlohmann::ordered_json::array();
          for (const Range& range : row) jr.push_back({range.begin, range.end});
          rows.push_back(std::move(jr));
        }
      }
      j["rows"] = std::move(rows);
      break;
    }
  }
  return j;
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) out << text;
  if (out) out.flush();
  if (!out) raise(ErrorKind::System, path + ": cannot write file (" + std::strerror(errno) + ")");
}

}  // namespace

Batch parse_batch(const std::string& json_text, const std::string& source) {
  const JsonReader reader(source);
  return batch_from_json(reader, detail::parse_json_text(json_text, source));
}

Batch load_batch(const std::string& path) { return parse_batch(read_text_file(path), path); }

std::vector<Batch> load_dataset(const std::string& path) { return parse_dataset(read_text_file(path), path); }

std::vector<Batch> parse_dataset(const std::string& text, const std::string& path) {
  std::vector<Batch> batches;
  std::istringstream lines(text);
  std::string line;
  for (int64_t line_no = 1; std::getline(lines, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines separate nothing
    batches.push_back(parse_batch(line, path + ":line " + std::to_string(line_no)));
  }
  if (batches.empty()) raise(ErrorKind::InvalidInput, path + ": no batches (expected one JSON batch per line)");
  return batches;
}

std::vector<int64_t> load_lengths(const std::string& path) { return parse_lengths(read_text_file(path), path); }

std::vector<int64_t> parse_lengths(const std::string& text, const std::string& source) {
  std::vector<int64_t> lengths;
  std::istringstream lines(text);
  std::string line;
  for (int64_t line_no = 1; std::getline(lines, line); ++line_no) {
    const size_t begin = line.find_first_not_of(" \t\r");
    if (begin == std::string::npos || line[begin] == '#') continue;
    const size_t end = line.find_last_not_of(" \t\r") + 1;
    const std::string word = line.substr(begin, end - begin);
    int64_t value = 0;
    const auto [ptr, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
    const std::string where = source + ":line " + std::to_string(line_no) + ": ";
    if (ec == std::errc::result_out_of_range)
      raise(ErrorKind::InvalidInput, where + "length '" + word + "' is out of range");
    if (ec != std::errc{} || ptr != word.data() + word.size())
      raise(ErrorKind::InvalidInput, where + "expected one document length (an integer) per line, got '" + word + "'");
    if (value < 1) raise(ErrorKind::InvalidInput, where + "a document length must be >= 1, got " + word);
    lengths.push_back(value);
  }
  if (lengths.empty())
    raise(ErrorKind::InvalidInput, source + ": no document lengths (expected one integer >= 1 per line)");
  return lengths;
}

std::string batch_to_json(const Batch& batch, bool pretty) {
  nlohmann::ordered_json heads;
  heads["q"] = batch.shape.q_heads;
  heads["kv"] = batch.shape.kv_heads;
  heads["dim"] = batch.shape.head_dim;
  std::vector<nlohmann::ordered_json> seqs;
  seqs.reserve(batch.sequences.size());
  for (const Sequence& s : batch.sequences) {
    nlohmann::ordered_json js;
    if (!s.id.empty()) js["id"] = s.id;
    js["length"] = s.length;
    js["mask"] = mask_to_json(s.mask);
    seqs.push_back(std::move(js));
  }
  if (!pretty) {
    nlohmann::ordered_json root;
    root["heads"] = std::move(heads);
    root["dtype"] = to_string(batch.shape.dtype);
    root["sequences"] = std::move(seqs);
    return root.dump();
  }
  // One sequence per line: readable for batches of hundreds of sequences, diffable, and a
  // ranges mask stays on its sequence's line instead of one number per line.
  std::string out = "{\n  \"heads\": " + heads.dump() + ",\n  \"dtype\": \"" + to_string(batch.shape.dtype) +
                    "\",\n  \"sequences\": [";
  for (size_t i = 0; i < seqs.size(); ++i) out += (i ? ",\n    " : "\n    ") + seqs[i].dump();
  out += seqs.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

void save_batch(const Batch& batch, const std::string& path) { write_text_file(path, batch_to_json(batch, true)); }

void save_dataset(const std::vector<Batch>& batches, const std::string& path) {
  std::string text;
  for (const Batch& b : batches) text += batch_to_json(b, false) + "\n";
  write_text_file(path, text);
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    raise(ErrorKind::InvalidInput, path + ": cannot read file (it is a directory)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) raise(ErrorKind::InvalidInput, path + ": cannot read file (" + std::strerror(errno) + ")");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) raise(ErrorKind::InvalidInput, path + ": error while reading file");
  return text.str();
}

}  // namespace dcp
