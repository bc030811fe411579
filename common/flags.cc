#include "common/flags.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/message.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/files.h"

namespace fedlearn {
namespace {

namespace pb = ::google::protobuf;

bool IsFedlearnFlagFile(absl::string_view path) {
  return absl::StrContains(path, "server/") ||
         absl::StrContains(path, "client/") ||
         absl::StrContains(path, "common/") ||
         absl::StrContains(path, "bench/") || absl::StrContains(path, "fuzz/");
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

bool AsksForSchema(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--config_schema" || arg == "-config_schema") return true;
  }
  return false;
}

// The flags a config file may set, by name: this program's own (those in
// fedlearn's sources), but --config.
std::vector<absl::CommandLineFlag*> ConfigurableFlags() {
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (name != "config" && IsFedlearnFlagFile(flag->Filename())) {
      flags.push_back(flag);
    }
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  return flags;
}

// The config field type of a flag (a message flag's is set by the caller).
pb::FieldDescriptorProto::Type FieldType(const absl::CommandLineFlag& flag) {
  using F = pb::FieldDescriptorProto;
  if (flag.IsOfType<bool>()) return F::TYPE_BOOL;
  if (flag.IsOfType<int32_t>()) return F::TYPE_INT32;
  if (flag.IsOfType<int64_t>()) return F::TYPE_INT64;
  if (flag.IsOfType<uint32_t>()) return F::TYPE_UINT32;
  if (flag.IsOfType<uint64_t>()) return F::TYPE_UINT64;
  if (flag.IsOfType<double>()) return F::TYPE_DOUBLE;
  if (flag.IsOfType<float>()) return F::TYPE_FLOAT;
  return F::TYPE_STRING;  // std::string, and absl::Duration etc. as text
}

// The schema message, built once per process from the flags defined by then
// (all of them: flags are defined at static initialisation).
class ConfigMessage {
 public:
  // One schema per program: a second, different one is a bug.
  static const ConfigMessage& Get(const ConfigSchema& schema) {
    static const ConfigMessage* const message = new ConfigMessage(schema);
    if (message->descriptor_->full_name() != schema.message_name) {
      std::fprintf(stderr, "config schema %s asked for after %s\n",
                   schema.message_name.c_str(),
                   message->descriptor_->full_name().c_str());
      std::abort();
    }
    return *message;
  }

  const pb::Descriptor* descriptor() const { return descriptor_; }
  std::unique_ptr<pb::Message> New() const {
    return std::unique_ptr<pb::Message>(
        factory_.GetPrototype(descriptor_)->New());
  }
  // The flag behind a field (nullptr for none: cannot happen).
  absl::CommandLineFlag* Flag(const pb::FieldDescriptor* field) const {
    return absl::FindCommandLineFlag(field->name());
  }

 private:
  explicit ConfigMessage(const ConfigSchema& schema)
      : pool_(pb::DescriptorPool::generated_pool()), factory_(&pool_) {
    factory_.SetDelegateToGeneratedFactory(true);
    const absl::string_view full = schema.message_name;
    const size_t dot = full.rfind('.');
    pb::FileDescriptorProto file;
    file.set_name(
        absl::StrCat(absl::StrReplaceAll(full, {{".", "/"}}), ".flags.proto"));
    file.set_syntax("proto2");  // presence: only the fields set are applied
    if (dot != absl::string_view::npos) {
      file.set_package(std::string(full.substr(0, dot)));
    }
    pb::DescriptorProto* message = file.add_message_type();
    message->set_name(std::string(
        dot == absl::string_view::npos ? full : full.substr(dot + 1)));
    absl::flat_hash_set<std::string> imports;
    int number = 0;
    for (const absl::CommandLineFlag* flag : ConfigurableFlags()) {
      pb::FieldDescriptorProto* field = message->add_field();
      field->set_name(std::string(flag->Name()));
      field->set_number(++number);
      field->set_label(pb::FieldDescriptorProto::LABEL_OPTIONAL);
      field->set_type(FieldType(*flag));
      for (const auto& [name, type] : schema.message_flags) {
        if (name != flag->Name()) continue;
        field->set_type(pb::FieldDescriptorProto::TYPE_MESSAGE);
        field->set_type_name(absl::StrCat(".", type->full_name()));
        if (imports.insert(type->file()->name()).second) {
          file.add_dependency(type->file()->name());
        }
      }
    }
    const pb::FileDescriptor* built = pool_.BuildFile(file);
    // The input is made here from valid flag names: a failure is a bug.
    if (built == nullptr) {
      std::fprintf(stderr, "cannot build the %s message from the flags\n",
                   schema.message_name.c_str());
      std::abort();
    }
    descriptor_ = built->message_type(0);
  }

  pb::DescriptorPool pool_;
  mutable pb::DynamicMessageFactory factory_;
  const pb::Descriptor* descriptor_ = nullptr;
};

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
                             const ConfigSchema& schema) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat("--config=", path, ": ", text.status().message()));
  }
  const ConfigMessage& type = ConfigMessage::Get(schema);
  std::unique_ptr<pb::Message> config = type.New();
  pb::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(*text, config.get())) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", errors.first()));
  }
  std::vector<const pb::FieldDescriptor*> fields;
  config->GetReflection()->ListFields(*config, &fields);
  for (const pb::FieldDescriptor* field : fields) {
    absl::CommandLineFlag* flag = type.Flag(field);
    std::string error;
    if (flag == nullptr || !flag->ParseFrom(FlagText(*config, field), &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", field->name(), ": ", error));
    }
  }
  return absl::OkStatus();
}

std::string ConfigSchemaProto(const ConfigSchema& schema) {
  const pb::Descriptor* message = ConfigMessage::Get(schema).descriptor();
  std::string out = absl::StrCat(
      "// The --config message, derived from the flags: each field is the flag "
      "of its\n// name (see --help). Use it in text format only: field numbers "
      "follow the\n// flags' names and change when a flag is added.\n"
      "syntax = \"proto2\";\n\n");
  const pb::FileDescriptor* file = message->file();
  if (!file->package().empty()) {
    absl::StrAppend(&out, "package ", file->package(), ";\n\n");
  }
  for (int i = 0; i < file->dependency_count(); ++i) {
    absl::StrAppend(&out, "import \"", file->dependency(i)->name(), "\";\n");
  }
  if (file->dependency_count() > 0) out += "\n";
  absl::StrAppend(&out, "message ", message->name(), " {\n");
  for (int i = 0; i < message->field_count(); ++i) {
    const pb::FieldDescriptor* field = message->field(i);
    const absl::CommandLineFlag* flag =
        absl::FindCommandLineFlag(field->name());
    absl::StrAppend(
        &out, "  // ", flag->Help(), " (default: ",
        flag->DefaultValue().empty() ? "\"\"" : flag->DefaultValue(),
        ")\n  optional ",
        field->message_type() != nullptr
            ? absl::StrCat(".", field->message_type()->full_name())
            : std::string(field->type_name()),
        " ", field->name(), " = ", field->number(), ";\n");
  }
  out += "}\n";
  return out;
}

// What every fedlearn binary sets up before parsing its flags.
void SetUpProcess(const char* usage) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  SetUsage(usage);
}

std::vector<char*> ParseFlags(int argc, char** argv, const char* usage) {
  SetUpProcess(usage);
  return absl::ParseCommandLine(argc, argv);
}

std::vector<char*> ParseFlags(int argc, char** argv, const char* usage,
                              const ConfigSchema& schema) {
  SetUpProcess(usage);
  if (AsksForSchema(argc, argv)) {
    std::fputs(ConfigSchemaProto(schema).c_str(), stdout);
    std::exit(0);
  }
  if (const std::string path = ConfigPath(argc, argv); !path.empty()) {
    if (absl::Status applied = ApplyConfigFile(path, schema); !applied.ok()) {
      std::fprintf(stderr, "%s\n", std::string(applied.message()).c_str());
      std::exit(2);
    }
  }
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace fedlearn
