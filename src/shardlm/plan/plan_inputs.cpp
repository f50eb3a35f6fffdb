#include "shardlm/plan/plan_inputs.hpp"

#include <filesystem>
#include <optional>

#include "shardlm/core/error.hpp"
#include "shardlm/data/prepare.hpp"
#include "shardlm/data/sft_prepare.hpp"
#include "shardlm/parallel/strategy_options.hpp"

namespace shardlm {

RunPlanRequest plan_request(const TrainOptions& o, const ModelConfig& config, int world_size) {
  RunPlanRequest r;
  r.config = config;
  r.world_size = world_size;
  r.strategy = o.strategy_options();
  r.model = o.model_options(parse_device(o.device, "--device"));
  r.micro_batch = o.micro_batch;
  r.seq_len = o.seq_len;
  r.global_batch = o.global_batch;
  // --grad-accum: that many micro-batches per data-parallel rank of the asked layout, the
  // global batch the trainer runs (Trainer::read_inputs) and --strategy auto's candidates
  // keep.
  if (o.grad_accum > 0)
    r.global_batch = o.micro_batch * strategy_mesh(r.strategy, world_size).data_parallel_size() * o.grad_accum;
  r.min_unit_params = o.min_unit_params;
  return r;
}

std::optional<HardwareProfile> resolve_profile(const std::string& flag) {
  if (!flag.empty()) return load_profile(flag);
  const std::string path = default_profile_path();
  if (std::filesystem::exists(path)) return load_profile(path);
  return std::nullopt;
}

PlanInputs resolve_plan_inputs(const TrainOptions& o, int world_size, const ProfileOptions& p) {
  SHARDLM_CHECK(world_size >= 1, "-n must be at least 1, got {}", world_size);
  o.validate_run_shape();
  SHARDLM_CHECK(p.nodes >= 1 && world_size % p.nodes == 0,
                "--nodes {} must divide the {} ranks (the same number of ranks on every node)",
                p.nodes, world_size);
  if (!p.link.empty()) link_transport(p.link, 1.0);  // names the flag on a bad value
  PlanInputs in;
  std::optional<int> data_vocab;  // without data, every model keeps its own vocabulary
  if (!o.data_dir.empty())
    data_vocab = static_cast<int>(is_sft_dataset(o.data_dir) ? read_sft_dataset_meta(o.data_dir).vocab_size
                                                              : read_dataset_meta(o.data_dir).vocab_size);
  in.config = resolve_model_config(o, data_vocab);
  in.request = plan_request(o, in.config, world_size);
  if (o.strategy != "auto") o.mesh_shape(world_size);  // names the flag and the numbers
  in.profile = resolve_profile(p.profile);
  in.cluster = {p.nodes, p.link};
  return in;
}

}  // namespace shardlm
