#include "common/chunk_wire.h"

#include <algorithm>
#include <cassert>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace fedlearn {
namespace {

// Protobuf's wire types (the low three bits of a field's tag).
enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kFixed32 = 5,
};

// The longest varints protobuf reads: a value, and a tag or a length.
constexpr int kMaxVarintBytes = 10;
constexpr int kMaxTagOrSizeBytes = 5;

// Reads forward through bytes held in pieces. Every read fails (false) rather
// than run past the end.
class Cursor {
 public:
  explicit Cursor(absl::Span<const absl::string_view> pieces)
      : pieces_(pieces) {
    SkipEmpty();
  }

  size_t consumed() const { return consumed_; }
  bool at_end() const { return piece_ == pieces_.size(); }

  bool Varint(uint64_t* value, int max_bytes = kMaxVarintBytes) {
    *value = 0;
    for (int i = 0; i < max_bytes && !at_end(); ++i) {
      const auto byte = static_cast<uint8_t>(pieces_[piece_][offset_]);
      Advance(1);
      *value |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  // Appends the next `n` bytes to `out`.
  bool Copy(size_t n, std::string* out) {
    return Take(n, [out](absl::string_view bytes) {
      out->append(bytes.data(), bytes.size());
    });
  }

  // Appends views of the next `n` bytes to `out`.
  bool View(size_t n, std::vector<absl::string_view>* out) {
    return Take(n, [out](absl::string_view bytes) { out->push_back(bytes); });
  }

 private:
  template <typename Sink>
  bool Take(size_t n, Sink sink) {
    while (n > 0) {
      if (at_end()) return false;
      const absl::string_view rest = pieces_[piece_].substr(offset_);
      const size_t step = std::min(n, rest.size());
      sink(rest.substr(0, step));
      Advance(step);
      n -= step;
    }
    return true;
  }

  // Moves `n` bytes on within the current piece (n <= what it has left).
  void Advance(size_t n) {
    offset_ += n;
    consumed_ += n;
    if (offset_ == pieces_[piece_].size()) {
      ++piece_;
      offset_ = 0;
      SkipEmpty();
    }
  }

  void SkipEmpty() {
    while (piece_ < pieces_.size() && pieces_[piece_].empty()) ++piece_;
  }

  absl::Span<const absl::string_view> pieces_;
  size_t piece_ = 0;
  size_t offset_ = 0;
  size_t consumed_ = 0;
};

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// Reads a tag; false unless it names a field (1 to 2^29 - 1).
bool Tag(Cursor& in, uint32_t* field, uint32_t* wire_type) {
  uint64_t tag;
  if (!in.Varint(&tag, kMaxTagOrSizeBytes) || tag > UINT32_MAX) return false;
  *field = static_cast<uint32_t>(tag >> 3);
  *wire_type = static_cast<uint32_t>(tag & 7);
  return *field != 0;
}

// Reads a length as protobuf does: under 2^31.
bool Size(Cursor& in, uint64_t* size) {
  return in.Varint(size, kMaxTagOrSizeBytes) && *size <= INT32_MAX;
}

// Whether `n` more bytes end at or before `end`.
bool Fits(const Cursor& in, size_t end, uint64_t n) {
  return in.consumed() <= end && n <= end - in.consumed();
}

// Reads a TensorChunk's `size` bytes of fields: the payload's as views, every
// other field's bytes copied for protobuf to parse. A field copied keeps its
// bytes as they came but for the varints, which protobuf reads to the same
// values in either form.
bool ReadChunkFields(Cursor& in, size_t size, ChunkInPlace& out,
                     std::string& fields) {
  const size_t end = in.consumed() + size;
  bool has_data = false;
  while (in.consumed() < end) {
    uint32_t field, wire_type;
    if (!Tag(in, &field, &wire_type)) return false;
    if (field == v1::TensorChunk::kDataFieldNumber &&
        wire_type == kLengthDelimited) {
      uint64_t n;
      // Given twice, the last would count: left to protobuf.
      if (has_data || !Size(in, &n) || !Fits(in, end, n)) return false;
      has_data = true;
      if (!in.View(n, &out.data)) return false;
      out.data_bytes = n;
      continue;
    }
    AppendVarint(uint64_t{field} << 3 | wire_type, &fields);
    uint64_t value;
    switch (wire_type) {
      case kVarint:
        if (!in.Varint(&value)) return false;
        AppendVarint(value, &fields);
        break;
      case kFixed64:
        if (!in.Copy(8, &fields)) return false;
        break;
      case kFixed32:
        if (!in.Copy(4, &fields)) return false;
        break;
      case kLengthDelimited:
        if (!Size(in, &value) || !Fits(in, end, value)) return false;
        AppendVarint(value, &fields);
        if (!in.Copy(value, &fields)) return false;
        break;
      default:  // groups and wire types protobuf does not define
        return false;
    }
    if (in.consumed() > end) return false;
  }
  return in.consumed() == end;
}

}  // namespace

bool ReadChunkInPlace(absl::Span<const absl::string_view> message,
                      uint32_t field, ChunkInPlace* out) {
  out->fields.Clear();
  out->data.clear();
  out->data_bytes = 0;
  out->fields_wire_.clear();
  Cursor in(message);
  uint32_t number, wire_type;
  uint64_t size;
  if (!Tag(in, &number, &wire_type) || number != field ||
      wire_type != kLengthDelimited || !Size(in, &size)) {
    return false;
  }
  // The chunk must be all there is: a second one would be merged into it.
  if (!ReadChunkFields(in, size, *out, out->fields_wire_) || !in.at_end()) {
    return false;
  }
  return out->fields.ParseFromString(out->fields_wire_);
}

ChunkAround WriteChunkAround(uint32_t field, const v1::TensorChunk& chunk,
                             size_t payload_bytes) {
  assert(chunk.data().empty() && payload_bytes > 0);
  // Protobuf writes a message's fields in field number order, then the
  // fields it did not know: those before the data go before it, the rest
  // after.
  v1::TensorChunk head = chunk, tail = chunk;
  const google::protobuf::Descriptor* d = chunk.GetDescriptor();
  const google::protobuf::Reflection* r = chunk.GetReflection();
  r->MutableUnknownFields(&head)->Clear();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    r->ClearField(
        f->number() < v1::TensorChunk::kDataFieldNumber ? &tail : &head, f);
  }
  ChunkAround around;
  around.after = tail.SerializeAsString();
  const std::string fields = head.SerializeAsString();
  std::string data_key;
  AppendVarint(
      uint64_t{v1::TensorChunk::kDataFieldNumber} << 3 | kLengthDelimited,
      &data_key);
  AppendVarint(payload_bytes, &data_key);
  AppendVarint(uint64_t{field} << 3 | kLengthDelimited, &around.before);
  AppendVarint(
      fields.size() + data_key.size() + payload_bytes + around.after.size(),
      &around.before);
  around.before += fields;
  around.before += data_key;
  return around;
}

}  // namespace fedlearn
