#include "common/flags.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/message.h>
#include <google/protobuf/text_format.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/files.h"

namespace fedlearn {
namespace {

namespace pb = ::google::protobuf;

bool IsFedlearnFlagFile(absl::string_view path) {
  return absl::StrContains(path, "server/") ||
         absl::StrContains(path, "client/") ||
         absl::StrContains(path, "common/") ||
         absl::StrContains(path, "bench/");
}

void SetUsage(const char* usage) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = IsFedlearnFlagFile;
  config.contains_helpshort_flags = IsFedlearnFlagFile;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
}

// The value of --config on the command line (the last one wins, as for any
// flag), or "": looked up before absl parses the command line, which then
// applies its flags over the file's.
std::string ConfigPath(int argc, char** argv) {
  std::string path;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;  // the rest are positional arguments
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) {
      continue;
    }
    if (absl::ConsumePrefix(&arg, "config=")) {
      path = std::string(arg);
    } else if (arg == "config" && i + 1 < argc) {
      path = argv[++i];
    }
  }
  return path;
}

// Keeps the first error the text-format parser reports, with its position.
class FirstError : public pb::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) {
      first_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
    }
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

// A field's value as its flag would read it on the command line.
std::string FlagText(const pb::Message& message,
                     const pb::FieldDescriptor* field) {
  const pb::Reflection* r = message.GetReflection();
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(r->GetInt32(message, field));
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(r->GetInt64(message, field));
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(r->GetUInt32(message, field));
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(r->GetUInt64(message, field));
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      return absl::StrFormat("%.17g", r->GetDouble(message, field));
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      return absl::StrFormat("%.9g", r->GetFloat(message, field));
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(message, field) ? "true" : "false";
    case pb::FieldDescriptor::CPPTYPE_ENUM:
      return r->GetEnum(message, field)->name();
    case pb::FieldDescriptor::CPPTYPE_STRING:
      return r->GetString(message, field);
    case pb::FieldDescriptor::CPPTYPE_MESSAGE: {
      // A message field sets its flag to the message in one-line text format
      // (--strategy_config takes that, or a file holding it).
      pb::TextFormat::Printer printer;
      printer.SetSingleLineMode(true);
      std::string text;
      printer.PrintToString(r->GetMessage(message, field), &text);
      return text;
    }
  }
  return "";
}

}  // namespace

absl::Status ApplyConfigFile(const std::string& path,
                             const pb::Message& config_type) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat("--config=", path, ": ", text.status().message()));
  }
  std::unique_ptr<pb::Message> config(config_type.New());
  pb::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(*text, config.get())) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", errors.first()));
  }
  std::vector<const pb::FieldDescriptor*> fields;
  config->GetReflection()->ListFields(*config, &fields);
  for (const pb::FieldDescriptor* field : fields) {
    if (field->is_repeated()) {
      return absl::InternalError(absl::StrCat(
          field->full_name(), " is repeated and cannot set a flag"));
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(field->name());
    if (flag == nullptr) {
      return absl::InternalError(
          absl::StrCat(field->full_name(), " names no flag of this program"));
    }
    std::string error;
    if (!flag->ParseFrom(FlagText(*config, field), &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", field->name(), ": ", error));
    }
  }
  return absl::OkStatus();
}

std::vector<char*> ParseFlags(int argc, char** argv, const char* usage) {
  SetUsage(usage);
  return absl::ParseCommandLine(argc, argv);
}

std::vector<char*> ParseFlags(int argc, char** argv, const char* usage,
                              const pb::Message& config_type) {
  SetUsage(usage);
  if (const std::string path = ConfigPath(argc, argv); !path.empty()) {
    if (absl::Status applied = ApplyConfigFile(path, config_type);
        !applied.ok()) {
      std::fprintf(stderr, "%s\n", std::string(applied.message()).c_str());
      std::exit(2);
    }
  }
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace fedlearn
