#ifndef FEDLEARN_COMMON_STATUS_MACROS_H_
#define FEDLEARN_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define FEDLEARN_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    absl::Status fedlearn_status_ = (expr);              \
    if (!fedlearn_status_.ok()) return fedlearn_status_; \
  } while (false)

// Evaluates `expr` (an absl::StatusOr<T>); returns its status if not OK, else
// moves the value into `lhs` (a declaration such as `auto x` or an existing
// variable).
#define FEDLEARN_ASSIGN_OR_RETURN(lhs, expr) \
  FEDLEARN_ASSIGN_OR_RETURN_IMPL_(           \
      FEDLEARN_STATUS_CONCAT_(fedlearn_statusor_, __LINE__), lhs, expr)

#define FEDLEARN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                    \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()

#define FEDLEARN_STATUS_CONCAT_(a, b) FEDLEARN_STATUS_CONCAT_INNER_(a, b)
#define FEDLEARN_STATUS_CONCAT_INNER_(a, b) a##b

#endif  // FEDLEARN_COMMON_STATUS_MACROS_H_
