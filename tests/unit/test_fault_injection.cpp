// SHARDLM_FAULT's two spellings: <point>[:exit] fails at a point, <point>=<value> hands
// a test action its value (the trainer's save_after_load=DIR); neither is taken for
// the other, nor a point for another whose name it starts with.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "shardlm/core/error.hpp"
#include "shardlm/core/fault_injection.hpp"

namespace {

struct FaultEnv {
  explicit FaultEnv(const char* spec) { ::setenv("SHARDLM_FAULT", spec, 1); }
  ~FaultEnv() { ::unsetenv("SHARDLM_FAULT"); }
};

TEST(FaultInjection, ValueOfTheNamedPointOnly) {
  ::unsetenv("SHARDLM_FAULT");
  EXPECT_EQ(shardlm::fault_value("save_after_load"), std::nullopt);
  {
    FaultEnv env("save_after_load=/tmp/a=b:exit");
    EXPECT_EQ(shardlm::fault_value("save_after_load"), std::optional<std::string>("/tmp/a=b:exit"));
    EXPECT_EQ(shardlm::fault_value("save_after"), std::nullopt);
    EXPECT_EQ(shardlm::fault_value("save_after_load_x"), std::nullopt);
    EXPECT_NO_THROW(shardlm::fault_point("save_after_load"));  // a value is no failure
  }
  {
    FaultEnv env("save_after_load");
    EXPECT_EQ(shardlm::fault_value("save_after_load"), std::nullopt);  // no '=': a failure point
    EXPECT_THROW(shardlm::fault_point("save_after_load"), shardlm::Error);
  }
  {
    FaultEnv env("save_after_load=");
    EXPECT_EQ(shardlm::fault_value("save_after_load"), std::optional<std::string>(""));
  }
}

}  // namespace
