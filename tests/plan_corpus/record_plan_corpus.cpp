// Prints the plan-equivalence corpus's figures (plan_corpus.hpp) as this build's
// plan_run computes them, one line per case. Run at commit 517860e it wrote
// tests/fixtures/plan_corpus_517860e.txt:
//   build/tests/record_plan_corpus > tests/fixtures/plan_corpus_517860e.txt
#include <cstdio>

#include "plan_corpus.hpp"

int main() {
  for (const auto& c : shardlm::plan_corpus::cases())
    std::printf("%s\n",
                shardlm::plan_corpus::figures_line(c.name, shardlm::plan_run(c.request)).c_str());
  return 0;
}
