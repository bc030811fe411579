#include "common/flags.h"

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace fedlearn {
namespace {

bool IsFedlearnFlagFile(absl::string_view path) {
  return absl::StrContains(path, "server/") ||
         absl::StrContains(path, "client/") ||
         absl::StrContains(path, "common/") ||
         absl::StrContains(path, "bench/");
}

}  // namespace

std::vector<char*> ParseFlags(int argc, char** argv, const char* usage) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = IsFedlearnFlagFile;
  config.contains_helpshort_flags = IsFedlearnFlagFile;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace fedlearn
