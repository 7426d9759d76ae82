// --checkpointing: the policies (none, full, every:K, layers:LIST, budget:SIZE), parsed against
// the model, and budget:SIZE resolved to layers once the layout is known (docs/decisions.md,
// "Which layers are checkpointed, and selective recompute").
#include <algorithm>
#include <cctype>
#include <charconv>

#include "cli.hpp"
#include "size.hpp"
#include "trainmem/analytic/analytic_rank.hpp"
#include "trainmem/base/bytes.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem::cli {
namespace {

constexpr const char* kAllowed =
    "none, full, selective, every:K, layers:LIST (e.g. layers:0,2-5), budget:SIZE";

bool is_integer(const std::string& s, std::int64_t* v) {
  const char* last = s.data() + s.size();
  const auto [end, ec] = std::from_chars(s.data(), last, *v);
  return !s.empty() && ec == std::errc() && end == last;
}

// A resolved list that names every layer is plain full (an empty list).
CheckpointPolicy per_layer(std::vector<std::int64_t> list, std::string spec, std::int64_t layers) {
  std::sort(list.begin(), list.end());
  list.erase(std::unique(list.begin(), list.end()), list.end());
  CheckpointPolicy p;
  p.mode = list.empty() ? Checkpointing::none : Checkpointing::full;
  if (static_cast<std::int64_t>(list.size()) == layers) list.clear();
  p.layers = {std::move(list), std::move(spec), 0};
  return p;
}

CheckpointPolicy parse_one(const std::string& item, std::int64_t layers) {
  if (item == "none") return {};
  if (item == "full") return {Checkpointing::full, {}};
  if (item == "selective") return {Checkpointing::selective, {}};
  const std::string range = "0-" + std::to_string(layers - 1);
  if (item.rfind("every:", 0) == 0) {
    std::int64_t k = 0;
    if (!is_integer(item.substr(6), &k) || k < 1 || k > layers)
      throw InputError("--checkpointing " + item + ": K must be an integer from 1 to the model's " +
                       std::to_string(layers) +
                       " layers (every K-th layer is checkpointed: layers K-1, 2K-1, ...)");
    std::vector<std::int64_t> list;
    for (std::int64_t l = k - 1; l < layers; l += k) list.push_back(l);
    return per_layer(std::move(list), item, layers);
  }
  if (item.rfind("layers:", 0) == 0) {
    std::vector<std::int64_t> list;
    const std::string rest = item.substr(7);
    if (rest.empty())
      throw InputError(
          "--checkpointing layers: give the layers to checkpoint, e.g. layers:0,2-5 "
          "(the model's layers are " +
          range + ")");
    for (const std::string& part : split_commas(rest)) {
      const std::size_t dash = part.find('-');
      std::int64_t lo = 0, hi = 0;
      const bool ok = dash == std::string::npos
                          ? is_integer(part, &lo) && (hi = lo, true)
                          : is_integer(part.substr(0, dash), &lo) &&
                                is_integer(part.substr(dash + 1), &hi) && lo <= hi;
      if (!ok)
        throw InputError("--checkpointing " + item + ": '" + part +
                         "' is not a layer or a range of layers (N or N-M, N <= M)");
      if (lo < 0 || hi >= layers)
        throw InputError("--checkpointing " + item + ": layer " + std::to_string(lo < 0 ? lo : hi) +
                         " is out of range; the model has " + std::to_string(layers) + " layers (" +
                         range + ")");
      for (std::int64_t l = lo; l <= hi; ++l) list.push_back(l);
    }
    return per_layer(std::move(list), item, layers);
  }
  if (item.rfind("budget:", 0) == 0) {
    CheckpointPolicy p{Checkpointing::full, {{}, item, 0}};
    p.layers.budget = parse_size(item.substr(7), "--checkpointing budget");
    if (p.layers.budget == 0)
      throw InputError("--checkpointing " + item + ": the budget must be above 0 bytes");
    return p;
  }
  throw InputError("--checkpointing: unknown policy '" + item + "'; allowed: " + kAllowed);
}

}  // namespace

std::vector<CheckpointPolicy> parse_checkpoint_policies(const std::string& text,
                                                        std::int64_t layers, bool allow_list) {
  const std::string lists = allow_list ? "; or both (none and full), or a comma list of them" : "";
  if (text == "both") {
    if (!allow_list)
      throw InputError("--checkpointing both: this command runs one policy; allowed: " +
                       std::string(kAllowed));
    return {CheckpointPolicy{}, CheckpointPolicy{Checkpointing::full, {}}};
  }
  // Items are comma-separated; a number (or N-M) continues the layers: list before it.
  std::vector<std::string> items;
  for (const std::string& part : split_commas(text)) {
    const bool number = !part.empty() && (std::isdigit(static_cast<unsigned char>(part[0])) != 0);
    if (number && !items.empty() && items.back().rfind("layers:", 0) == 0)
      items.back() += "," + part;
    else
      items.push_back(part);
  }
  std::vector<CheckpointPolicy> out;
  for (const auto& item : items) {
    if (item.empty())
      throw InputError("--checkpointing '" + text + "': an empty policy; allowed: " + kAllowed +
                       lists);
    out.push_back(parse_one(item, layers));
  }
  if (out.size() > 1 && !allow_list)
    throw InputError("--checkpointing " + text +
                     ": this command runs one policy (a list is for estimate and compare); "
                     "allowed: " +
                     kAllowed);
  return out;
}

CheckpointPolicy resolve_checkpoint_budget(const CheckpointPolicy& policy, const ModelConfig& model,
                                           const TrainConfig& train, const ParallelConfig& layout) {
  const std::uint64_t budget = policy.layers.budget;
  if (budget == 0) return policy;
  const std::int64_t Ls = model.layers / layout.pp;
  std::uint64_t last_peak = 0;
  for (std::int64_t k = 0; k <= Ls; ++k) {
    std::vector<std::int64_t> list;
    for (std::int64_t st = 0; st < layout.pp; ++st)
      for (std::int64_t j = 0; j < k; ++j) list.push_back(st * Ls + j);
    CheckpointPolicy p = per_layer(std::move(list), policy.layers.spec, model.layers);
    TrainConfig t = train;
    p.apply(t);
    const LayoutEstimate e = estimate_layout(model, t, layout);
    last_peak = e.ranks[static_cast<std::size_t>(e.worst)].est.figures.peak;
    if (last_peak <= budget) return p;
  }
  throw InputError("--checkpointing " + policy.layers.spec + ": no choice fits; with every layer " +
                   "checkpointed the step's peak (" + optimizer_name(train.optimizer) + ") is " +
                   std::to_string(last_peak) + " B (" + format_bytes_human(last_peak) +
                   ") on the worst rank, above the budget of " + std::to_string(budget) + " B");
}

void resolve_checkpointing(Common& c, const ParallelConfig& layout) {
  for (auto& p : c.checkpointing_modes) p = resolve_checkpoint_budget(p, c.model, c.train, layout);
  c.checkpointing_modes.front().apply(c.train);
}

}  // namespace trainmem::cli
