// The --config loader: any bytes as a coordinator's config file (protobuf
// text format of fedlearn.v1.CoordinatorConfig, built from the coordinator's
// own flags). It must never crash; a file it refuses leaves an error that
// names the file. (Flags keep what earlier inputs set: the loader only sets
// them, never reads them.)

#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "fedlearn/v1/config.pb.h"
#include "fuzz/fuzz_util.h"

// The coordinator's run options as flags, as server/main.cc defines them, and
// the one message-typed flag.
#define FEDLEARN_OPTION(type, name, default_value, help) \
  ABSL_FLAG(type, name, default_value, help);
#include "server/options.inc"
#undef FEDLEARN_OPTION
ABSL_FLAG(std::string, strategy_config, "", "the strategy's knobs");

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fedlearn;
  static const ConfigSchema schema{
      "fedlearn.v1.FuzzCoordinatorConfig",
      {{"strategy_config", v1::StrategyConfig::descriptor()}}};
  const std::string path = fuzz::WriteScratch(
      "coordinator.textproto",
      absl::string_view(reinterpret_cast<const char*>(data), size));
  const absl::Status status = ApplyConfigFile(path, schema);
  if (!status.ok() && !absl::StrContains(status.message(), path)) std::abort();
  return 0;
}
