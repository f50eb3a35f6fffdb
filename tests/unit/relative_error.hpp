// The error measure the numerical tests share: max |got - want| / max |want|, i.e.
// errors measured against the tensor's scale (plain max |got - want| when want is 0).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

template <typename A, typename B>
double relative_to_max_error(const A& got, const B& want) {
  EXPECT_EQ(got.size(), want.size());
  double max_ref = 0.0, max_diff = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
    max_diff =
        std::max(max_diff, std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
  }
  return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}
