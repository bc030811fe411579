#include "common/safetensors.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/model_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/files.h"

namespace fedlearn {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Each test writes its files into a directory of its own.
class SafetensorsTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_.Path(name); }

  testing::ScopedTempDir dir_;
};

ModelSpec Lookup(const std::string& name) {
  absl::StatusOr<ModelSpec> spec = LookupModel(name);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *std::move(spec) : ModelSpec{};
}

// "w" [2, 3] then "b" [2]: 8 floats, 32 bytes of data.
ModelSpec TinySpec() {
  absl::StatusOr<ModelSpec> spec = MakeModelSpec(
      "tiny",
      {{"w", {2, 3}, Init::kGlorotUniform, 3, 2}, {"b", {2}, Init::kZeros}});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// Random values with the awkward ones mixed in: signed zero, infinities, a NaN
// with a payload, subnormals. The round trip must keep every bit.
std::vector<float> AwkwardValues(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  const uint32_t specials[] = {0x80000000u, 0x7F800000u, 0xFF800000u,
                               0x7FC01234u, 0x00000001u, 0x807FFFFFu,
                               0x7F7FFFFFu};
  for (size_t i = 0; i < std::size(specials) && i < v.size(); ++i) {
    std::memcpy(&v[i * v.size() / std::size(specials)], &specials[i], 4);
  }
  return v;
}

using testing::ReadBytes;
using testing::WriteBytes;

std::string LittleEndian64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A safetensors file from its parts, as another writer might lay it out.
std::string FileBytes(const std::string& header, const std::string& data) {
  return LittleEndian64(header.size()) + header + data;
}

std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(float));
}

// The header and data sections of a file this module wrote.
struct Parts {
  std::string header, data;
};
Parts Split(const std::string& bytes) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  return {bytes.substr(8, n), bytes.substr(8 + n)};
}

void ExpectBitExact(const std::vector<float>& got,
                    const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)),
            0);
}

TEST_F(SafetensorsTest, RoundTripIsBitExact) {
  for (const std::string model : {"mlp_2nn", "mnist_cnn"}) {
    SCOPED_TRACE(model);
    const ModelSpec spec = Lookup(model);
    const std::vector<float> values = AwkwardValues(spec.num_parameters, 1);
    const std::map<std::string, std::string> metadata = {
        {"model", model},
        {"round", "12"},
        {"quoted \"key\"\\", "line\nbreak\ttab \x01 caf\xc3\xa9 \xe2\x82\xac"}};
    const std::string path = Path(model + ".safetensors");
    ASSERT_TRUE(WriteSafetensors(path, spec, values, metadata).ok());
    std::map<std::string, std::string> read_metadata;
    absl::StatusOr<std::vector<float>> read =
        ReadSafetensors(path, spec, &read_metadata);
    ASSERT_TRUE(read.ok()) << read.status();
    ExpectBitExact(*read, values);
    EXPECT_EQ(read_metadata, metadata);
    // Without the metadata out-parameter too.
    read = ReadSafetensors(path, spec);
    ASSERT_TRUE(read.ok()) << read.status();
    ExpectBitExact(*read, values);
  }
}

TEST_F(SafetensorsTest, LayoutIsTheSafetensorsFormat) {
  const ModelSpec spec = Lookup("mnist_cnn");
  const std::vector<float> values = AwkwardValues(spec.num_parameters, 2);
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, spec, values, {{"round", "3"}}).ok());
  const std::string bytes = ReadBytes(path);
  const Parts parts = Split(bytes);
  // The header is padded with spaces so the data starts 8-byte aligned.
  EXPECT_EQ(parts.header.size() % 8, 0u);
  EXPECT_EQ(parts.header.front(), '{');
  EXPECT_EQ(bytes.size(), 8 + parts.header.size() + 4 * values.size());
  // The data section is the flat vector as it is, in spec order.
  EXPECT_EQ(parts.data, FloatBytes(values));
  EXPECT_THAT(
      parts.header,
      AllOf(
          HasSubstr("\"__metadata__\":{\"round\":\"3\"}"),
          HasSubstr("\"conv1.weight\":{\"dtype\":\"F32\",\"shape\":[32,1,3,3],"
                    "\"data_offsets\":[0,1152]}"),
          HasSubstr("\"fc2.bias\":{\"dtype\":\"F32\",\"shape\":[10],"
                    "\"data_offsets\":[4799488,4799528]}")));
  // 1199882 floats: the last tensor ends where the data does.
  EXPECT_EQ(4 * 1199882, 4799528);
}

TEST_F(SafetensorsTest, OverwritesAtomicallyAndLeavesNoTemporaryFiles) {
  const ModelSpec spec = Lookup("mlp_2nn");
  const std::string path = Path("model.safetensors");
  const std::vector<float> first = AwkwardValues(spec.num_parameters, 3);
  const std::vector<float> second = AwkwardValues(spec.num_parameters, 4);
  ASSERT_TRUE(WriteSafetensors(path, spec, first).ok());
  ASSERT_TRUE(WriteSafetensors(path, spec, second).ok());
  absl::StatusOr<std::vector<float>> read = ReadSafetensors(path, spec);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectBitExact(*read, second);
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(names, ::testing::ElementsAre("model.safetensors"));
}

TEST_F(SafetensorsTest, EmptyMetadata) {
  const ModelSpec spec = TinySpec();
  const std::string path = Path("tiny.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, spec, AwkwardValues(8, 5)).ok());
  std::map<std::string, std::string> metadata = {{"stale", "entry"}};
  ASSERT_TRUE(ReadSafetensors(path, spec, &metadata).ok());
  EXPECT_THAT(metadata, IsEmpty());
}

TEST_F(SafetensorsTest, WriteErrors) {
  const ModelSpec spec = TinySpec();
  absl::Status status =
      WriteSafetensors(Path("a.safetensors"), spec, std::vector<float>(7));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("a.safetensors"), HasSubstr("got 7")));

  status = WriteSafetensors(Path("no/such/dir/a.safetensors"), spec,
                            std::vector<float>(8));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("no/such/dir"));
  EXPECT_FALSE(std::filesystem::exists(Path("a.safetensors")));
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  const absl::StatusOr<std::vector<float>> read =
      ReadSafetensors(Path("absent.safetensors"), TinySpec());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.status().message(), HasSubstr("absent.safetensors"));
}

TEST_F(SafetensorsTest, TruncationIsDataLoss) {
  const ModelSpec spec = Lookup("mlp_2nn");
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(
      WriteSafetensors(path, spec, AwkwardValues(spec.num_parameters, 6)).ok());
  const std::string bytes = ReadBytes(path);
  const size_t header_end = 8 + Split(bytes).header.size();
  for (size_t size :
       {size_t{0}, size_t{5}, size_t{8}, size_t{9}, header_end / 2,
        header_end - 1, header_end, header_end + 3, bytes.size() / 2,
        bytes.size() - 4, bytes.size() - 1}) {
    SCOPED_TRACE(size);
    const std::string cut = Path("cut.safetensors");
    WriteBytes(cut, bytes.substr(0, size));
    const absl::StatusOr<std::vector<float>> read = ReadSafetensors(cut, spec);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss)
        << read.status();
    EXPECT_THAT(read.status().message(),
                AllOf(HasSubstr(cut), HasSubstr("truncated")));
  }
}

TEST_F(SafetensorsTest, BadHeaderLengthIsInvalidArgument) {
  const ModelSpec spec = TinySpec();
  const std::string path = Path("tiny.safetensors");
  // Values whose bytes are not JSON whitespace.
  const std::vector<float> values = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(WriteSafetensors(path, spec, values).ok());
  const Parts parts = Split(ReadBytes(path));
  const uint64_t n = parts.header.size();
  const std::string body = parts.header + parts.data;
  for (uint64_t length : {uint64_t{0}, uint64_t{1}, n - 9, n + 8, n + 16,
                          uint64_t{1} << 40, ~uint64_t{0}}) {
    SCOPED_TRACE(length);
    WriteBytes(path, LittleEndian64(length) + body);
    const absl::StatusOr<std::vector<float>> read = ReadSafetensors(path, spec);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument)
        << read.status();
    EXPECT_THAT(read.status().message(), HasSubstr(path));
  }
}

// Writes a tiny file whose header is `header` (spec "tiny": w [2, 3], b [2])
// and whose data is eight floats, and reads it back.
class TinyHeaderTest : public SafetensorsTest {
 protected:
  absl::StatusOr<std::vector<float>> ReadWithHeader(const std::string& header,
                                                    size_t data_bytes = 32) {
    const std::string path = Path("tiny.safetensors");
    std::string data = FloatBytes({1, 2, 3, 4, 5, 6, 7, 8});
    data.resize(data_bytes, '\x11');
    WriteBytes(path, FileBytes(header, data));
    return ReadSafetensors(path, TinySpec());
  }
};

constexpr char kGoodW[] =
    R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";
constexpr char kGoodB[] =
    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[24,32]})";

TEST_F(TinyHeaderTest, AcceptsOtherWritersLayouts) {
  // No metadata, no padding.
  absl::StatusOr<std::vector<float>> read =
      ReadWithHeader(absl::StrCat("{", kGoodW, ",", kGoodB, "}"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, std::vector<float>({1, 2, 3, 4, 5, 6, 7, 8}));

  // Tensors listed and stored in another order (b's data first), keys within an
  // entry reordered, whitespace and escapes ("\u0077" is "w"), metadata last.
  read = ReadWithHeader(
      "{\n  \"b\": {\"data_offsets\": [0, 8], \"dtype\": \"F32\", \"shape\": "
      "[2]},\n"
      "  \"\\u0077\" : {\"shape\" : [ 2 , 3 ], \"dtype\":\"F32\", "
      "\"data_offsets\":[8,32]},"
      "\t\"__metadata__\": {\"format\": \"pt\", \"note\": "
      "\"\\u00e9\\ud83d\\ude00\"}\r\n}"
      "        ");
  ASSERT_TRUE(read.ok()) << read.status();
  // The file's first two floats are b; then w.
  EXPECT_EQ(*read, std::vector<float>({3, 4, 5, 6, 7, 8, 1, 2}));
}

TEST_F(TinyHeaderTest, MismatchesAreInvalidArgumentNamingTheTensor) {
  struct Case {
    const char* what;
    std::string header;
    const char* tensor;  // the name the message must give, or "" for none
  };
  const std::string w = kGoodW, b = kGoodB;
  const std::vector<Case> cases = {
      {"wrong dtype",
       "{" + absl::StrReplaceAll(w, {{"F32", "F16"}}) + "," + b + "}", "w"},
      {"wrong dtype F64",
       "{" + w + "," + absl::StrReplaceAll(b, {{"F32", "F64"}}) + "}", "b"},
      {"wrong shape",
       "{" + absl::StrReplaceAll(w, {{"[2,3]", "[3,2]"}}) + "," + b + "}", "w"},
      {"wrong rank",
       "{" + absl::StrReplaceAll(w, {{"[2,3]", "[6]"}}) + "," + b + "}", "w"},
      {"missing tensor", "{" + w + "}", "b"},
      {"extra tensor",
       "{" + w + "," + b +
           R"(,"c":{"dtype":"F32","shape":[0],"data_offsets":[32,32]}})",
       "c"},
      {"offsets do not span the tensor",
       "{" + absl::StrReplaceAll(w, {{"[0,24]", "[0,20]"}}) + "," + b + "}",
       "w"},
      {"offsets reversed",
       "{" + absl::StrReplaceAll(w, {{"[0,24]", "[24,0]"}}) + "," + b + "}",
       "w"},
      {"overlapping tensors",
       "{" + w + "," + absl::StrReplaceAll(b, {{"[24,32]", "[16,24]"}}) + "}",
       ""},
      {"gap between tensors",
       "{" + absl::StrReplaceAll(w, {{"[0,24]", "[4,28]"}}) + "," +
           absl::StrReplaceAll(b, {{"[24,32]", "[28,36]"}}) + "}",
       ""},
      {"missing key",
       "{" + absl::StrReplaceAll(w, {{R"("dtype":"F32",)", ""}}) + "," + b +
           "}",
       "w"},
      {"unknown key",
       "{" +
           absl::StrReplaceAll(w,
                               {{R"("dtype")", R"("strides":[1],"dtype")"}}) +
           "," + b + "}",
       "w"},
      {"negative dimension",
       "{" + absl::StrReplaceAll(w, {{"[2,3]", "[-2,3]"}}) + "," + b + "}", ""},
      {"fractional offset",
       "{" + absl::StrReplaceAll(w, {{"[0,24]", "[0,24.0]"}}) + "," + b + "}",
       ""},
      {"entry not an object", R"({"w":[0,24],)" + b + "}", "w"},
      {"header not an object", "[1,2]", ""},
      {"trailing comma", "{" + w + "," + b + ",}", ""},
      {"duplicate key", "{" + w + "," + b + "," + w + "}", ""},
      {"unterminated", "{" + w + "," + b, ""},
      {"garbage after the object", "{" + w + "," + b + "}x", ""},
      {"metadata value not a string",
       R"({"__metadata__":{"round":3},)" + w + "," + b + "}", ""},
      {"metadata not an object", R"({"__metadata__":"x",)" + w + "," + b + "}",
       ""},
      {"control character in a string",
       "{" + w + "," + b + R"(,"__metadata__":{"a":"x)" +
           std::string(1, '\x01') + "\"}}",
       ""},
      {"invalid UTF-8",
       "{" + w + "," + b + ",\"__metadata__\":{\"a\":\"\xff\"}}", ""},
      {"overlong UTF-8",
       "{" + w + "," + b + ",\"__metadata__\":{\"a\":\"\xc0\xaf\"}}", ""},
      {"unpaired surrogate",
       "{" + w + "," + b + R"(,"__metadata__":{"a":"\ud800"}})", ""},
      {"true is not a header value",
       "{" + w + "," + b + R"(,"__metadata__":true})", ""},
      {"deep nesting", std::string(100, '[') + std::string(100, ']'), ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const absl::StatusOr<std::vector<float>> read = ReadWithHeader(c.header);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument)
        << read.status();
    EXPECT_THAT(read.status().message(), HasSubstr("tiny.safetensors"));
    if (*c.tensor != '\0') {
      EXPECT_THAT(read.status().message(),
                  HasSubstr(absl::StrCat("tensor ", c.tensor)));
    }
  }
}

TEST_F(TinyHeaderTest, BytesAfterTheLastTensorAreInvalidArgument) {
  const absl::StatusOr<std::vector<float>> read =
      ReadWithHeader(absl::StrCat("{", kGoodW, ",", kGoodB, "}"), 36);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument)
      << read.status();
  EXPECT_THAT(read.status().message(),
              HasSubstr("4 bytes after the last tensor"));
}

TEST_F(TinyHeaderTest, OffsetsPastTheEndAreDataLoss) {
  const absl::StatusOr<std::vector<float>> read =
      ReadWithHeader(absl::StrCat("{", kGoodW, ",", kGoodB, "}"), 28);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_THAT(read.status().message(), HasSubstr("tensor b"));
}

TEST_F(SafetensorsTest, AnotherModelsFileIsInvalidArgument) {
  const ModelSpec cnn = Lookup("mnist_cnn");
  const std::string path = Path("cnn.safetensors");
  ASSERT_TRUE(
      WriteSafetensors(path, cnn, AwkwardValues(cnn.num_parameters, 7)).ok());
  const absl::StatusOr<std::vector<float>> read =
      ReadSafetensors(path, Lookup("mlp_2nn"));
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument)
      << read.status();
}

// ---------------------------------------------------------------------------------------
// Interoperability: Python with only json and numpy reads what we write.

constexpr char kPythonReader[] = R"(import json, sys
import numpy as np
path, out = sys.argv[1], sys.argv[2]
with open(path, 'rb') as f:
    blob = f.read()
n = int.from_bytes(blob[:8], 'little')
header = json.loads(blob[8:8 + n])
data = blob[8 + n:]
metadata = header.pop('__metadata__', {})
flat = []
for name, info in sorted(header.items(), key=lambda kv: kv[1]['data_offsets'][0]):
    begin, end = info['data_offsets']
    t = np.frombuffer(data[begin:end], dtype='<f4').reshape(info['shape'])
    print(name, info['dtype'], ','.join(str(d) for d in t.shape))
    flat.append(t.ravel())
np.concatenate(flat).astype('<f4').tofile(out)
print('metadata', json.dumps(metadata, sort_keys=True))
)";

bool PythonHasNumpy() {
  return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

// Runs `command`, returning its standard output; fails the test on a non-zero
// exit.
std::string RunCommand(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << command;
    return output;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int rc = ::pclose(pipe);
  EXPECT_EQ(rc, 0) << command << "\n" << output;
  return output;
}

TEST_F(SafetensorsTest, PythonWithNumpyReadsTheFile) {
  if (!PythonHasNumpy()) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import numpy (apt-get install "
                    "python3-numpy)";
  }
  const ModelSpec spec = Lookup("mnist_cnn");
  std::vector<float> values = AwkwardValues(spec.num_parameters, 8);
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, spec, values,
                               {{"round", "7"}, {"model", "mnist_cnn"}})
                  .ok());
  const std::string script = Path("read.py");
  WriteBytes(script, kPythonReader);
  const std::string out = Path("values.f32");
  const std::string output = RunCommand(absl::StrCat(
      "/usr/bin/python3 '", script, "' '", path, "' '", out, "' 2>&1"));

  std::vector<std::string> want;
  for (const TensorSpec& t : spec.tensors) {
    want.push_back(absl::StrCat(t.name, " F32 ", absl::StrJoin(t.shape, ",")));
  }
  want.push_back(R"(metadata {"model": "mnist_cnn", "round": "7"})");
  want.push_back("");
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(output, '\n')), want)
      << output;
  // numpy's view of the tensors, flattened in order, is our flat vector bit for
  // bit.
  EXPECT_EQ(ReadBytes(out), FloatBytes(values));
}

}  // namespace
}  // namespace fedlearn

namespace fedlearn {
namespace {

// --model=PATH.safetensors: the file defines the model.
class SafetensorsModelTest : public SafetensorsTest {
 protected:
  absl::StatusOr<SafetensorsModel> ReadModel(const std::string& header,
                                             const std::string& data) {
    const std::string path = Path("model.safetensors");
    WriteBytes(path, FileBytes(header, data));
    return ReadSafetensorsModel(path);
  }
};

TEST_F(SafetensorsModelTest, TheFilesTensorsInDataOrderAreTheModel) {
  // b's data comes first, so b is the spec's first tensor: the data section
  // is the flat parameter vector as it is. A 0-d tensor has one value.
  absl::StatusOr<SafetensorsModel> model =
      ReadModel(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[12,36]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("s":{"dtype":"F32","shape":[],"data_offsets":[8,12]}})",
                FloatBytes({1, 2, 3, 4, 5, 6, 7, 8, 9}));
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->spec.name, "model");  // the file's stem
  ASSERT_EQ(model->spec.tensors.size(), 3u);
  EXPECT_EQ(model->spec.tensors[0].name, "b");
  EXPECT_EQ(model->spec.tensors[1].name, "s");
  EXPECT_TRUE(model->spec.tensors[1].shape.empty());
  EXPECT_EQ(model->spec.tensors[1].num_elements, 1);
  EXPECT_EQ(model->spec.tensors[2].shape, std::vector<int64_t>({2, 3}));
  EXPECT_EQ(model->spec.num_parameters, 9);
  EXPECT_EQ(model->values, std::vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST_F(SafetensorsModelTest, ASavedModelKeepsItsRegistryName) {
  const ModelSpec mlp = Lookup("mlp_2nn");
  const std::vector<float> values = AwkwardValues(mlp.num_parameters, 3);
  const std::string path = Path("model-000004.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, mlp, values, {{"model", "mlp_2nn"}}).ok());
  absl::StatusOr<SafetensorsModel> model = ReadSafetensorsModel(path);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->spec.name, "mlp_2nn");
  ASSERT_EQ(model->spec.tensors.size(), mlp.tensors.size());
  for (size_t i = 0; i < mlp.tensors.size(); ++i) {
    EXPECT_EQ(model->spec.tensors[i].name, mlp.tensors[i].name);
    EXPECT_EQ(model->spec.tensors[i].shape, mlp.tensors[i].shape);
  }
  ExpectBitExact(model->values, values);
}

TEST_F(SafetensorsModelTest, TwoHundredTensorsRoundTrip) {
  std::vector<TensorDecl> decls;
  for (int i = 0; i < 200; ++i) {
    decls.push_back(
        {absl::StrCat("layer", i, ".weight"), {i % 5 + 1, 3}, Init::kZeros});
  }
  absl::StatusOr<ModelSpec> spec = MakeModelSpec("many", std::move(decls));
  ASSERT_TRUE(spec.ok());
  const std::vector<float> values = AwkwardValues(spec->num_parameters, 9);
  const std::string path = Path("many.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, *spec, values).ok());
  absl::StatusOr<SafetensorsModel> model = ReadSafetensorsModel(path);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->spec.tensors.size(), 200u);
  EXPECT_EQ(model->spec.tensors[199].name, "layer199.weight");
  ExpectBitExact(model->values, values);
}

TEST_F(SafetensorsModelTest, MalformedFilesAreClearErrors) {
  const std::string data = FloatBytes({1, 2, 3, 4, 5, 6, 7, 8});
  struct Case {
    const char* what;
    std::string header;
    std::string data;
    absl::StatusCode code;
    const char* message;
  };
  const std::string w = kGoodW, b = kGoodB;
  const std::vector<Case> cases = {
      {"non-float dtype",
       "{" + absl::StrReplaceAll(w, {{"F32", "I64"}}) + "," + b + "}", data,
       absl::StatusCode::kInvalidArgument, "tensor w: dtype I64"},
      {"half floats",
       "{" + w + "," + absl::StrReplaceAll(b, {{"F32", "F16"}}) + "}", data,
       absl::StatusCode::kInvalidArgument, "tensor b: dtype F16"},
      {"bad JSON", "{" + w + "," + b, data, absl::StatusCode::kInvalidArgument,
       "bad header"},
      {"duplicate names", "{" + w + "," + w + "}", data,
       absl::StatusCode::kInvalidArgument, "\"w\""},
      {"overlapping offsets",
       "{" + w + "," + absl::StrReplaceAll(b, {{"[24,32]", "[16,24]"}}) + "}",
       data, absl::StatusCode::kInvalidArgument, "overlap"},
      {"truncated", "{" + w + "," + b + "}", data.substr(0, 20),
       absl::StatusCode::kDataLoss, "truncated"},
      {"a zero dimension",
       "{" + absl::StrReplaceAll(w, {{"[2,3]", "[0,3]"}}) + "," + b + "}", data,
       absl::StatusCode::kInvalidArgument, "dimension 0"},
      {"no tensor", R"({"__metadata__":{"model":"x"}})", "",
       absl::StatusCode::kInvalidArgument, "holds no tensor"},
      // Each dimension under the reader's 2^40, the product 2^62 + 1: it
      // would have asked for a vector of that many floats.
      {"more values than any model",
       "{" +
           absl::StrReplaceAll(
               w, {{"[2,3]", "[5,5581,8681,49477,384773]"}, {"24]", "4]"}}) +
           "}",
       data.substr(0, 4), absl::StatusCode::kInvalidArgument,
       "more than 2^36 values"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SafetensorsModel> model = ReadModel(c.header, c.data);
    EXPECT_EQ(model.status().code(), c.code)
        << c.what << ": " << model.status();
    EXPECT_THAT(
        model.status().message(),
        AllOf(HasSubstr(Path("model.safetensors")), HasSubstr(c.message)))
        << c.what;
  }
}

}  // namespace
}  // namespace fedlearn
