#include "batch/json_reader.h"

#include <climits>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "dcp/error.h"

namespace dcp::detail {

namespace {

// Follows the parser's events to know the JSON path of the object being read, and records the
// first key that appears twice in one object (the parser itself would keep the last silently).
class DuplicateKeys {
 public:
  bool on_event(Json::parse_event_t event, const Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start: stack_.push_back({true, {}, {}, 0}); break;
      case Json::parse_event_t::array_start: stack_.push_back({false, {}, {}, 0}); break;
      case Json::parse_event_t::key: {
        Frame& f = stack_.back();
        f.key = parsed.get<std::string>();
        if (!f.keys.insert(f.key).second && first_.empty())
          first_ = "duplicate key '" + f.key + "' in " + (stack_.size() == 1 ? std::string("the top-level object") : path());
        break;
      }
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        stack_.pop_back();
        next_element();
        break;
      case Json::parse_event_t::value: next_element(); break;
    }
    return true;
  }
  const std::string& first() const { return first_; }

 private:
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string key;  // object: the member being read
    size_t index;     // array: the element being read
  };
  void next_element() {
    if (!stack_.empty() && !stack_.back().object) ++stack_.back().index;
  }
  // Path of the innermost object: the members and elements that lead to it.
  std::string path() const {
    std::string p;
    for (size_t i = 0; i + 1 < stack_.size(); ++i)
      p = stack_[i].object ? member(p, stack_[i].key) : element(p, stack_[i].index);
    return p;
  }
  std::vector<Frame> stack_;
  std::string first_;
};

}  // namespace

Json parse_json_text(const std::string& text, const std::string& source) {
  DuplicateKeys dups;
  Json root;
  try {
    root = Json::parse(text, [&dups](int, Json::parse_event_t event, Json& parsed) { return dups.on_event(event, parsed); });
  } catch (const Json::exception& e) {
    // nlohmann prefixes "[json.exception.parse_error.101] "; the rest names line and column
    // (syntax errors) or the literal (numbers beyond double range).
    std::string msg = e.what();
    const size_t close = msg.find("] ");
    if (msg.rfind("[json.exception", 0) == 0 && close != std::string::npos) msg = msg.substr(close + 2);
    raise(ErrorKind::InvalidInput, source + ": malformed JSON: " + msg);
  }
  if (!dups.first().empty()) raise(ErrorKind::InvalidInput, source + ": " + dups.first() + " (each key may appear once)");
  return root;
}

std::string describe(const Json& j) {
  switch (j.type()) {
    case Json::value_t::string: {
      std::string s = j.get<std::string>();
      if (s.size() > 40) s = s.substr(0, 40) + "...";
      return "string '" + s + "'";
    }
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float: return "number " + j.dump();
    case Json::value_t::boolean: return std::string("boolean ") + (j.get<bool>() ? "true" : "false");
    case Json::value_t::null: return "null";
    case Json::value_t::array: return "array";
    case Json::value_t::object: return "object";
    default: return j.type_name();
  }
}

std::string member(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + "." + name;
}

std::string element(const std::string& path, size_t index) {
  return path + "[" + std::to_string(index) + "]";
}

void JsonReader::fail(const std::string& path, const std::string& what) const {
  raise(ErrorKind::InvalidInput, source_ + ": " + (path.empty() ? std::string() : path + ": ") + what);
}

void JsonReader::require_object(const Json& j, const std::string& path) const {
  if (!j.is_object()) fail(path, "expected an object, got " + describe(j));
}

void JsonReader::require_array(const Json& j, const std::string& path) const {
  if (!j.is_array()) fail(path, "expected an array, got " + describe(j));
}

void JsonReader::check_keys(const Json& j, const std::string& path,
                            std::initializer_list<const char*> allowed) const {
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* a : allowed) known = known || it.key() == a;
    if (known) continue;
    std::string list;
    for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
    fail(path, "unknown key '" + it.key() + "' (expected one of " + list + ")");
  }
}

int64_t JsonReader::get_int(const Json& j, const std::string& path) const {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) fail(path, "integer out of range, got " + j.dump());
    return static_cast<int64_t>(v);
  }
  if (j.is_number_integer()) return j.get<int64_t>();
  fail(path, "expected an integer, got " + describe(j));
}

int JsonReader::get_int32(const Json& j, const std::string& path) const {
  const int64_t v = get_int(j, path);
  if (v < INT_MIN || v > INT_MAX) fail(path, "integer out of range, got " + std::to_string(v));
  return static_cast<int>(v);
}

double JsonReader::get_number(const Json& j, const std::string& path) const {
  if (!j.is_number()) fail(path, "expected a number, got " + describe(j));
  const double v = j.get<double>();
  if (!std::isfinite(v)) fail(path, "expected a finite number, got " + j.dump());
  return v;
}

std::string JsonReader::get_string(const Json& j, const std::string& path) const {
  if (!j.is_string()) fail(path, "expected a string, got " + describe(j));
  return j.get<std::string>();
}

}  // namespace dcp::detail
