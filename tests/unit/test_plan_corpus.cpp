// The plan-equivalence corpus (tests/plan_corpus/plan_corpus.hpp): plan_run, which
// runs the real step on the meta device (plan/traced_step.hpp), must give, for
// every configuration, the bytes per memory category (device and host) and the bytes
// on the wire per step that plan_run gave at commit 517860e, when it restated the
// strategy's schedule in closed form (tests/fixtures/plan_corpus_517860e.txt, written
// by tests/plan_corpus/record_plan_corpus at that commit). Identical, not close.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>

#include "../plan_corpus/plan_corpus.hpp"
#include "shardlm/plan/run_plan.hpp"

namespace shardlm {
namespace {

std::map<std::string, std::string> expected_lines() {
  std::ifstream in(std::string(SHARDLM_FIXTURE_DIR) + "/plan_corpus_517860e.txt");
  EXPECT_TRUE(in.good()) << "missing tests/fixtures/plan_corpus_517860e.txt";
  std::map<std::string, std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines[line.substr(0, line.find(' '))] = line;
  return lines;
}

TEST(PlanCorpus, CoversTheDimensionsTheIssueNames) {
  const auto cases = plan_corpus::cases();
  EXPECT_GE(cases.size(), 60u);
  std::map<std::string, int> seen;
  for (const auto& c : cases) {
    const RunPlanRequest& r = c.request;
    seen["family " + r.config.family] += 1;
    seen["strategy " + to_string(r.strategy.kind)] += 1;
    seen["precision " + std::string(dtype_name(r.model.precision))] += 1;
    seen["world " + std::to_string(r.world_size)] += 1;
    seen[r.config.quantize_base == BaseQuant::nf4 ? "qlora" : r.config.lora.enabled() ? "lora" : "full"] += 1;
    seen[r.model.activation_checkpointing ? "checkpointing" : "no checkpointing"] += 1;
    seen[r.strategy.optimizer_on_host ? "offload" : r.model.device.is_host() ? "cpu" : "emulated"] += 1;
    seen["family " + r.config.family + " x strategy " + to_string(r.strategy.kind)] += 1;
  }
  for (const char* family : {"gpt2", "llama", "qwen2", "qwen3"})
    for (const char* kind : {"ddp", "zero1", "zero2", "zero3", "hybrid"})
      EXPECT_GT(seen[std::string("family ") + family + " x strategy " + kind], 0) << family << " " << kind;
  for (const char* key : {"precision fp32", "precision bf16", "precision fp16", "world 1", "world 2",
                          "world 3", "world 8", "world 1024", "full", "lora", "qlora",
                          "checkpointing", "no checkpointing", "cpu", "emulated", "offload"})
    EXPECT_GT(seen[key], 0) << key;
}

TEST(PlanCorpus, TheTracedStepPlansTheBytesOf517860e) {
  const auto expected = expected_lines();
  const auto cases = plan_corpus::cases();
  EXPECT_EQ(expected.size(), cases.size());
  int identical = 0;
  for (const auto& c : cases) {
    const auto it = expected.find(c.name);
    ASSERT_NE(it, expected.end()) << c.name << " is not in plan_corpus_517860e.txt";
    const std::string got = plan_corpus::figures_line(c.name, plan_run(c.request));
    EXPECT_EQ(got, it->second);
    identical += got == it->second;
  }
  std::printf("plan corpus: %d of %zu configurations identical to 517860e\n", identical,
              cases.size());
}

}  // namespace
}  // namespace shardlm
