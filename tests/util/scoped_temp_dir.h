#ifndef FEDLEARN_TESTS_UTIL_SCOPED_TEMP_DIR_H_
#define FEDLEARN_TESTS_UTIL_SCOPED_TEMP_DIR_H_

#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace fedlearn::testing {

// A fresh directory under the test temp dir for the current test, removed with
// the object. Named after the test and the process, so that build trees running
// the same tests at the same time do not collide.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ =
        std::filesystem::path(::testing::TempDir()) /
        absl::StrCat(info->test_suite_name(), "_", info->name(), "_", getpid());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScopedTempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The path of `name` inside the directory.
  std::string Path(const std::string& name) const {
    return (path_ / name).string();
  }

 private:
  std::filesystem::path path_;
};

}  // namespace fedlearn::testing

#endif  // FEDLEARN_TESTS_UTIL_SCOPED_TEMP_DIR_H_
