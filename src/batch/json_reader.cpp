#include "batch/json_reader.h"

#include <climits>
#include <cmath>
#include <string>

#include "dcp/error.h"

namespace dcp::detail {

Json parse_json_text(const std::string& text, const std::string& source) {
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    // nlohmann prefixes "[json.exception.parse_error.101] "; the rest names line and column.
    std::string msg = e.what();
    const size_t close = msg.find("] ");
    if (msg.rfind("[json.exception", 0) == 0 && close != std::string::npos) msg = msg.substr(close + 2);
    raise(ErrorKind::InvalidInput, source + ": malformed JSON: " + msg);
  }
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
