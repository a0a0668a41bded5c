// json_reader.h — strict, typed access to parsed JSON with errors of the form
// "<source>: <json path>: <what> (expected ..., got ...)". Private to the io code.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

namespace dcp::detail {

using Json = nlohmann::json;

// Parses `text`; a syntax error becomes InvalidInput "<source>: malformed JSON: <parser
// message with line and column>".
Json parse_json_text(const std::string& text, const std::string& source);

// "string 'abc'", "number 2.5", "boolean true", "null", "array", "object": what a value is,
// for "got ..." in messages (long strings are cut).
std::string describe(const Json& j);

// Appends a member name / an index to a JSON path: "sequences" + 2 -> "sequences[2]".
std::string member(const std::string& path, const std::string& name);
std::string element(const std::string& path, size_t index);

// Reads values of one source; every failure throws InvalidInput naming source and path.
class JsonReader {
 public:
  explicit JsonReader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const;

  void require_object(const Json& j, const std::string& path) const;
  void require_array(const Json& j, const std::string& path) const;
  // Every key of object `j` must be one of `allowed`.
  void check_keys(const Json& j, const std::string& path, std::initializer_list<const char*> allowed) const;

  int64_t get_int(const Json& j, const std::string& path) const;       // integer literal only
  int get_int32(const Json& j, const std::string& path) const;         // and fits in int
  double get_number(const Json& j, const std::string& path) const;     // any finite number
  std::string get_string(const Json& j, const std::string& path) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

}  // namespace dcp::detail
