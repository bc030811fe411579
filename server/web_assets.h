#ifndef FEDLEARN_SERVER_WEB_ASSETS_H_
#define FEDLEARN_SERVER_WEB_ASSETS_H_

#include <cstddef>

#include "absl/types/span.h"

namespace fedlearn {

// A file of server/web/, built into the binary (cmake/embed_files.cmake).
struct WebAsset {
  const char* path;  // URL path: "/index.html"
  const char* content_type;
  const unsigned char* data;
  size_t size;
};

absl::Span<const WebAsset> WebAssets();

}  // namespace fedlearn

#endif  // FEDLEARN_SERVER_WEB_ASSETS_H_
