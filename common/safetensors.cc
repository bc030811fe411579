#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/files.h"
#include "common/status_macros.h"

// The data section is the parameters' bytes as they lie in memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors stores little-endian floats; add byte swapping for "
              "this target");
static_assert(sizeof(float) == 4, "safetensors F32 is IEEE binary32");

namespace fedlearn {
namespace {

constexpr absl::string_view kMetadataKey = "__metadata__";
// The official implementation's bound on the header; a longer one is
// corruption.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A JSON header nests three deep (object, tensor entry, shape array); anything
// much deeper is not a safetensors header, and bounding it bounds the parser's
// recursion.
constexpr int kMaxJsonDepth = 8;

// ---------------------------------------------------------------------------------------
// The JSON subset of a safetensors header: objects, arrays, strings and
// non-negative integers. Strict: no trailing commas, duplicate keys, control
// characters in strings, invalid UTF-8 or unpaired surrogates; other JSON
// values (negative or fractional numbers, true, false, null) are rejected
// because no valid header holds them.

struct JsonValue {
  enum class Kind { kObject, kArray, kString, kInteger };
  Kind kind = Kind::kObject;
  std::string string;
  uint64_t integer = 0;
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>>
      object;  // in the order written
};

const char* KindName(JsonValue::Kind kind) {
  switch (kind) {
    case JsonValue::Kind::kObject:
      return "an object";
    case JsonValue::Kind::kArray:
      return "an array";
    case JsonValue::Kind::kString:
      return "a string";
    case JsonValue::Kind::kInteger:
      return "an integer";
  }
  return "a value";
}

class JsonParser {
 public:
  explicit JsonParser(absl::string_view text) : text_(text) {}

  // One value followed by nothing but whitespace. Errors are INVALID_ARGUMENT
  // with the byte offset in the text.
  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue value;
    FEDLEARN_RETURN_IF_ERROR(ParseValue(0, &value));
    SkipWhitespace();
    if (pos_ != text_.size())
      return Error("unexpected bytes after the JSON object");
    return value;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("byte ", pos_, ": ", what));
  }

  void SkipWhitespace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
            text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  // Consumes `c` (after whitespace) if it is next.
  bool Consume(char c) {
    SkipWhitespace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  absl::Status ParseValue(int depth, JsonValue* out) {
    if (depth > kMaxJsonDepth) return Error("nested too deeply");
    SkipWhitespace();
    if (pos_ == text_.size()) return Error("unexpected end of the header");
    const char c = text_[pos_];
    if (c == '{') {
      out->kind = JsonValue::Kind::kObject;
      return ParseObject(depth, out);
    }
    if (c == '[') {
      out->kind = JsonValue::Kind::kArray;
      return ParseArray(depth, out);
    }
    if (c == '"') {
      out->kind = JsonValue::Kind::kString;
      return ParseString(&out->string);
    }
    if (c >= '0' && c <= '9') {
      out->kind = JsonValue::Kind::kInteger;
      return ParseInteger(&out->integer);
    }
    return Error(
        absl::StrFormat("unexpected '%c': expected an object, array, string or "
                        "non-negative integer",
                        c));
  }

  absl::Status ParseObject(int depth, JsonValue* out) {
    ++pos_;  // '{'
    if (Consume('}')) return absl::OkStatus();
    absl::flat_hash_set<std::string> keys;
    do {
      SkipWhitespace();
      if (pos_ == text_.size() || text_[pos_] != '"')
        return Error("expected a key");
      std::string key;
      FEDLEARN_RETURN_IF_ERROR(ParseString(&key));
      if (!keys.insert(key).second) {
        return Error(absl::StrCat("duplicate key \"", key, "\""));
      }
      if (!Consume(':')) return Error("expected ':'");
      JsonValue value;
      FEDLEARN_RETURN_IF_ERROR(ParseValue(depth + 1, &value));
      out->object.emplace_back(std::move(key), std::move(value));
    } while (Consume(','));
    if (!Consume('}')) return Error("expected ',' or '}'");
    return absl::OkStatus();
  }

  absl::Status ParseArray(int depth, JsonValue* out) {
    ++pos_;  // '['
    if (Consume(']')) return absl::OkStatus();
    do {
      JsonValue value;
      FEDLEARN_RETURN_IF_ERROR(ParseValue(depth + 1, &value));
      out->array.push_back(std::move(value));
    } while (Consume(','));
    if (!Consume(']')) return Error("expected ',' or ']'");
    return absl::OkStatus();
  }

  absl::Status ParseInteger(uint64_t* out) {
    const size_t start = pos_;
    uint64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const uint64_t digit = static_cast<uint64_t>(text_[pos_] - '0');
      if (value > (UINT64_MAX - digit) / 10)
        return Error("integer out of range");
      value = value * 10 + digit;
      ++pos_;
    }
    if (text_[start] == '0' && pos_ - start > 1) return Error("leading zero");
    if (pos_ < text_.size() &&
        (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
      return Error("expected an integer");
    }
    *out = value;
    return absl::OkStatus();
  }

  // Four hex digits of a \u escape.
  absl::Status ParseHex4(uint32_t* out) {
    if (text_.size() - pos_ < 4) return Error("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return Error("bad hex digit in \\u escape");
      }
    }
    *out = v;
    return absl::OkStatus();
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  // Copies one well-formed UTF-8 sequence of two to four bytes starting at
  // pos_.
  absl::Status CopyUtf8Sequence(std::string* out) {
    const auto byte = [this](size_t i) {
      return static_cast<uint8_t>(text_[i]);
    };
    const uint8_t lead = byte(pos_);
    int length;
    uint32_t cp;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
      cp = lead & 0x1F;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      cp = lead & 0x0F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      cp = lead & 0x07;
    } else {
      return Error("invalid UTF-8");
    }
    if (text_.size() - pos_ < static_cast<size_t>(length))
      return Error("invalid UTF-8");
    for (int i = 1; i < length; ++i) {
      const uint8_t b = byte(pos_ + i);
      if ((b & 0xC0) != 0x80) return Error("invalid UTF-8");
      cp = (cp << 6) | (b & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF.
    if ((length == 3 && cp < 0x800) || (length == 4 && cp < 0x10000) ||
        cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return Error("invalid UTF-8");
    }
    out->append(text_.data() + pos_, length);
    pos_ += length;
    return absl::OkStatus();
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // '"'
    for (;;) {
      if (pos_ == text_.size()) return Error("unterminated string");
      const uint8_t c = static_cast<uint8_t>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c < 0x20) return Error("control character in a string");
      if (c >= 0x80) {
        FEDLEARN_RETURN_IF_ERROR(CopyUtf8Sequence(out));
        continue;
      }
      ++pos_;
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        continue;
      }
      if (pos_ == text_.size()) return Error("unterminated string");
      const char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out->push_back(e);
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp = 0;
          FEDLEARN_RETURN_IF_ERROR(ParseHex4(&cp));
          if (cp >= 0xDC00 && cp <= 0xDFFF) return Error("unpaired surrogate");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (text_.size() - pos_ < 2 || text_[pos_] != '\\' ||
                text_[pos_ + 1] != 'u') {
              return Error("unpaired surrogate");
            }
            pos_ += 2;
            uint32_t low = 0;
            FEDLEARN_RETURN_IF_ERROR(ParseHex4(&low));
            if (low < 0xDC00 || low > 0xDFFF)
              return Error("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          return Error(absl::StrFormat("bad escape '\\%c'", e));
      }
    }
  }

  const absl::string_view text_;
  size_t pos_ = 0;
};

// `s` as a JSON string literal. Bytes >= 0x80 pass through: the names and
// metadata are UTF-8 already.
std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const uint8_t c = static_cast<uint8_t>(ch);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(ch);
    } else if (c < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out.push_back(ch);
    }
  }
  out.push_back('"');
  return out;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// ---------------------------------------------------------------------------------------
// File I/O.

// Closes a file descriptor when it goes out of scope.

// Reads exactly `size` bytes at `offset`; DATA_LOSS if the file ends first.
absl::Status ReadAt(int fd, char* data, size_t size, uint64_t offset,
                    const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::pread(fd, data, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
    }
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": truncated: the file ends at byte ", offset));
    }
    data += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

std::string MakeHeader(const ModelSpec& spec,
                       const std::map<std::string, std::string>& metadata) {
  std::string header = absl::StrCat("{", JsonQuote(kMetadataKey), ":{");
  bool first = true;
  for (const auto& [key, value] : metadata) {
    absl::StrAppend(&header, first ? "" : ",", JsonQuote(key), ":",
                    JsonQuote(value));
    first = false;
  }
  header += "}";
  for (const TensorSpec& t : spec.tensors) {
    const int64_t begin = t.offset * 4;
    const int64_t end = begin + t.num_elements * 4;
    absl::StrAppend(&header, ",", JsonQuote(t.name),
                    ":{\"dtype\":\"F32\",\"shape\":[",
                    absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", begin,
                    ",", end, "]}");
  }
  header += "}";
  // Spaces up to a multiple of 8, so the data after the 8-byte prefix is
  // aligned.
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

// Where one tensor's bytes are in the data section.
struct Extent {
  uint64_t begin = 0, end = 0;
  const TensorSpec* tensor = nullptr;
};

// Checks one tensor entry of the header against its spec; returns its extent.
absl::StatusOr<Extent> ParseTensorEntry(const std::string& path,
                                        const TensorSpec& t,
                                        const JsonValue& entry) {
  const auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor ", t.name, ": ", what));
  };
  if (entry.kind != JsonValue::Kind::kObject) {
    return invalid(absl::StrCat("entry is ", KindName(entry.kind),
                                ", expected an object"));
  }
  const JsonValue* dtype = nullptr;
  const JsonValue* shape = nullptr;
  const JsonValue* offsets = nullptr;
  for (const auto& [key, value] : entry.object) {
    if (key == "dtype") {
      dtype = &value;
    } else if (key == "shape") {
      shape = &value;
    } else if (key == "data_offsets") {
      offsets = &value;
    } else {
      return invalid(absl::StrCat("unexpected key \"", key, "\""));
    }
  }
  if (dtype == nullptr || shape == nullptr || offsets == nullptr) {
    return invalid("needs \"dtype\", \"shape\" and \"data_offsets\"");
  }
  if (dtype->kind != JsonValue::Kind::kString)
    return invalid("dtype is not a string");
  if (dtype->string != "F32") {
    return invalid(absl::StrCat("dtype ", dtype->string, ", expected F32"));
  }

  if (shape->kind != JsonValue::Kind::kArray)
    return invalid("shape is not an array");
  std::vector<int64_t> dims;
  for (const JsonValue& d : shape->array) {
    if (d.kind != JsonValue::Kind::kInteger ||
        d.integer > (uint64_t{1} << 62)) {
      return invalid("shape holds something other than a dimension");
    }
    dims.push_back(static_cast<int64_t>(d.integer));
  }
  if (dims != t.shape) {
    return invalid(absl::StrCat("shape ", ShapeString(dims), ", expected ",
                                ShapeString(t.shape)));
  }

  if (offsets->kind != JsonValue::Kind::kArray || offsets->array.size() != 2 ||
      offsets->array[0].kind != JsonValue::Kind::kInteger ||
      offsets->array[1].kind != JsonValue::Kind::kInteger) {
    return invalid("data_offsets is not a pair of integers");
  }
  Extent extent{offsets->array[0].integer, offsets->array[1].integer, &t};
  const uint64_t bytes = static_cast<uint64_t>(t.num_elements) * 4;
  if (extent.end < extent.begin || extent.end - extent.begin != bytes) {
    return invalid(absl::StrCat("data_offsets [", extent.begin, ", ",
                                extent.end, "] do not span its ", bytes,
                                " bytes"));
  }
  return extent;
}

}  // namespace

absl::Status WriteSafetensors(
    const std::string& path, const ModelSpec& spec,
    absl::Span<const float> values,
    const std::map<std::string, std::string>& metadata) {
  if (static_cast<int64_t>(values.size()) != spec.num_parameters) {
    return absl::InvalidArgumentError(
        absl::StrCat("writing ", path, ": model ", spec.name, " has ",
                     spec.num_parameters, " parameters, got ", values.size()));
  }
  const std::string prefix = SafetensorsPrefix(spec, metadata);
  const absl::string_view parts[] = {
      prefix, absl::string_view(reinterpret_cast<const char*>(values.data()),
                                values.size() * sizeof(float))};
  return WriteFileAtomically(path, parts);
}

std::string SafetensorsPrefix(
    const ModelSpec& spec, const std::map<std::string, std::string>& metadata) {
  const std::string header = MakeHeader(spec, metadata);
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) {
    prefix[i] =
        static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  }
  return prefix + header;
}

// An open safetensors file and its parsed header.
struct OpenedFile {
  std::unique_ptr<ScopedFd> fd;
  uint64_t file_size = 0;
  uint64_t header_size = 0;
  JsonValue json;  // an object
};

// Opens `path` and parses its header. NOT_FOUND and other errno-derived codes
// for I/O failures, DATA_LOSS when truncated, INVALID_ARGUMENT for a header
// that is not a JSON object; each naming the file.
absl::StatusOr<OpenedFile> OpenSafetensors(const std::string& path) {
  OpenedFile file;
  file.fd =
      std::make_unique<ScopedFd>(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  const ScopedFd& fd = *file.fd;
  if (fd.get() < 0)
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  file.file_size = file_size;
  if (file_size < 8) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated: ", file_size,
                     " bytes, shorter than the 8-byte header length"));
  }

  unsigned char length[8];
  FEDLEARN_RETURN_IF_ERROR(
      ReadAt(fd.get(), reinterpret_cast<char*>(length), 8, 0, path));
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length[i];
  file.header_size = header_size;
  if (header_size > kMaxHeaderBytes || header_size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length ", header_size, " is not in [2, ",
                     kMaxHeaderBytes, "]: not a safetensors file"));
  }
  if (header_size > file_size - 8) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated: the header is ", header_size,
                     " bytes but only ", file_size - 8, " follow its length"));
  }
  std::string header(header_size, '\0');
  FEDLEARN_RETURN_IF_ERROR(
      ReadAt(fd.get(), header.data(), header_size, 8, path));
  absl::StatusOr<JsonValue> json = JsonParser(header).ParseDocument();
  if (!json.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": bad header: ", json.status().message()));
  }
  if (json->kind != JsonValue::Kind::kObject) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": header is ", KindName(json->kind), ", expected an object"));
  }
  file.json = *std::move(json);
  return file;
}

absl::StatusOr<std::vector<float>> ReadSafetensors(
    const std::string& path, const ModelSpec& spec,
    std::map<std::string, std::string>* metadata) {
  FEDLEARN_ASSIGN_OR_RETURN(OpenedFile file, OpenSafetensors(path));
  const ScopedFd& fd = *file.fd;
  const uint64_t file_size = file.file_size;
  const uint64_t header_size = file.header_size;
  const JsonValue* json = &file.json;
  absl::flat_hash_map<absl::string_view, const TensorSpec*> by_name;
  for (const TensorSpec& t : spec.tensors) by_name[t.name] = &t;
  std::map<std::string, std::string> pairs;
  std::vector<Extent> extents;
  for (const auto& [key, value] : json->object) {
    if (key == kMetadataKey) {
      if (value.kind != JsonValue::Kind::kObject) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": __metadata__ is ", KindName(value.kind)));
      }
      for (const auto& [k, v] : value.object) {
        if (v.kind != JsonValue::Kind::kString) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": __metadata__ value of \"", k, "\" is not a string"));
        }
        pairs[k] = v.string;
      }
      continue;
    }
    const auto it = by_name.find(key);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", key, " is not in model ", spec.name));
    }
    FEDLEARN_ASSIGN_OR_RETURN(Extent extent,
                              ParseTensorEntry(path, *it->second, value));
    extents.push_back(extent);
  }
  if (extents.size() != spec.tensors.size()) {
    for (const TensorSpec& t : spec.tensors) {
      const bool present =
          std::any_of(extents.begin(), extents.end(),
                      [&](const Extent& e) { return e.tensor == &t; });
      if (!present) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": tensor ", t.name, " of model ", spec.name, " is missing"));
      }
    }
  }

  // The tensors must tile the data section exactly, as the official reader
  // requires.
  const uint64_t data_size = file_size - 8 - header_size;
  std::sort(extents.begin(), extents.end(),
            [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
  uint64_t expected_begin = 0;
  for (const Extent& e : extents) {
    if (e.end > data_size) {
      return absl::DataLossError(absl::StrCat(
          path, ": truncated: tensor ", e.tensor->name, " ends at byte ", e.end,
          " of the data, which has ", data_size));
    }
    if (e.begin != expected_begin) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", e.tensor->name, " starts at byte ",
                       e.begin, " of the data, expected ", expected_begin,
                       " (tensors overlap or leave a gap)"));
    }
    expected_begin = e.end;
  }
  if (expected_begin != data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", data_size - expected_begin,
                     " bytes after the last tensor's data"));
  }

  std::vector<float> values(spec.num_parameters);
  const uint64_t data_start = 8 + header_size;
  for (const Extent& e : extents) {
    FEDLEARN_RETURN_IF_ERROR(ReadAt(
        fd.get(), reinterpret_cast<char*>(values.data() + e.tensor->offset),
        e.end - e.begin, data_start + e.begin, path));
  }
  if (metadata != nullptr) *metadata = std::move(pairs);
  return values;
}

absl::StatusOr<SafetensorsModel> ReadSafetensorsModel(const std::string& path) {
  FEDLEARN_ASSIGN_OR_RETURN(OpenedFile file, OpenSafetensors(path));
  // The spec first: every tensor's name and shape, in the order of its data.
  struct Found {
    uint64_t begin;
    TensorDecl decl;
  };
  std::vector<Found> found;
  std::string name = std::filesystem::path(path).stem().string();
  for (const auto& [key, value] : file.json.object) {
    if (key == kMetadataKey) {
      if (value.kind != JsonValue::Kind::kObject) continue;  // checked below
      for (const auto& [k, v] : value.object) {
        if (k == "model" && v.kind == JsonValue::Kind::kString) name = v.string;
      }
      continue;
    }
    const std::string& tensor = key;  // a lambda cannot capture a binding
    const auto invalid = [&path, &tensor](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", tensor, ": ", what));
    };
    if (value.kind != JsonValue::Kind::kObject) {
      return invalid(absl::StrCat("entry is ", KindName(value.kind),
                                  ", expected an object"));
    }
    Found f{0, {key, {}, Init::kZeros}};
    bool has_dtype = false, has_shape = false, has_offsets = false;
    for (const auto& [field, v] : value.object) {
      if (field == "dtype") {
        if (v.kind != JsonValue::Kind::kString) {
          return invalid("dtype is not a string");
        }
        if (v.string != "F32") {
          return invalid(absl::StrCat("dtype ", v.string,
                                      "; a model's tensors must be F32"));
        }
        has_dtype = true;
      } else if (field == "shape") {
        if (v.kind != JsonValue::Kind::kArray) {
          return invalid("shape is not an array");
        }
        for (const JsonValue& d : v.array) {
          if (d.kind != JsonValue::Kind::kInteger ||
              d.integer > (uint64_t{1} << 40)) {
            return invalid("shape holds something other than a dimension");
          }
          f.decl.shape.push_back(static_cast<int64_t>(d.integer));
        }
        has_shape = true;
      } else if (field == "data_offsets") {
        if (v.kind != JsonValue::Kind::kArray || v.array.empty() ||
            v.array[0].kind != JsonValue::Kind::kInteger) {
          return invalid("data_offsets is not a pair of integers");
        }
        f.begin = v.array[0].integer;
        has_offsets = true;
      }
    }
    if (!has_dtype || !has_shape || !has_offsets) {
      return invalid("needs \"dtype\", \"shape\" and \"data_offsets\"");
    }
    found.push_back(std::move(f));
  }
  if (found.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": holds no tensor"));
  }
  std::stable_sort(
      found.begin(), found.end(),
      [](const Found& a, const Found& b) { return a.begin < b.begin; });
  std::vector<TensorDecl> decls;
  for (Found& f : found) decls.push_back(std::move(f.decl));
  absl::StatusOr<ModelSpec> spec = MakeModelSpec(name, std::move(decls));
  if (!spec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", spec.status().message()));
  }
  // Then the values, with every check of a model's file (extents, sizes,
  // truncation).
  SafetensorsModel model;
  FEDLEARN_ASSIGN_OR_RETURN(model.values,
                            ReadSafetensors(path, *spec, &model.metadata));
  model.spec = *std::move(spec);
  return model;
}

}  // namespace fedlearn
