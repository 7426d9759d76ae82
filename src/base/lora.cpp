// LoRA adapter targets and counts (include/trainmem/base/lora.hpp).
#include "trainmem/base/lora.hpp"

#include <array>
#include <cstdio>
#include <sstream>

#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

struct TargetName {
  LoraTarget bit;
  const char* name;
};
constexpr std::array<TargetName, 7> kTargets = {{{kLoraQ, "q_proj"},
                                                 {kLoraK, "k_proj"},
                                                 {kLoraV, "v_proj"},
                                                 {kLoraO, "o_proj"},
                                                 {kLoraGate, "gate_proj"},
                                                 {kLoraUp, "up_proj"},
                                                 {kLoraDown, "down_proj"}}};

std::string allowed() {
  std::string s;
  for (const auto& t : kTargets) s += std::string(s.empty() ? "" : ", ") + t.name;
  return s + " (comma-separated), or all-linear";
}

}  // namespace

unsigned parse_lora_targets(const std::string& list) {
  if (list == "all-linear") return kLoraAllLinear;
  unsigned set = 0;
  std::stringstream ss(list);
  std::string item;
  bool any = false;
  while (std::getline(ss, item, ',')) {
    any = true;
    bool found = false;
    for (const auto& t : kTargets)
      if (item == t.name) {
        if (set & t.bit) throw InputError("--lora-targets: '" + item + "' is listed twice");
        set |= t.bit;
        found = true;
      }
    if (!found)
      throw InputError("--lora-targets: unknown module '" + item + "'; allowed: " + allowed());
  }
  if (!any || list.back() == ',')
    throw InputError("--lora-targets: empty module name in '" + list + "'; allowed: " + allowed());
  return set;
}

std::string lora_targets_name(unsigned targets) {
  if ((targets & kLoraAllLinear) == kLoraAllLinear) return "all-linear";
  std::string s;
  for (const auto& t : kTargets)
    if (targets & t.bit) s += std::string(s.empty() ? "" : ",") + t.name;
  return s;
}

std::uint64_t lora_trainable_count(const ModelConfig& m, std::int64_t rank, unsigned targets) {
  if (rank < 1) throw InputError("--lora-rank must be >= 1, got " + std::to_string(rank));
  const auto h = std::uint64_t(m.hidden), i = std::uint64_t(m.intermediate);
  const auto qd = std::uint64_t(m.q_dim()), kd = std::uint64_t(m.kv_dim());
  // in + out of each projection, in kTargets' order.
  const std::array<std::uint64_t, 7> widths = {h + qd, h + kd, h + kd, qd + h, h + i, h + i, i + h};
  std::uint64_t per_layer = 0;
  for (std::size_t j = 0; j < kTargets.size(); ++j)
    if (targets & kTargets[j].bit) per_layer = checked_add(per_layer, widths[j], "LoRA widths");
  return checked_product({std::uint64_t(rank), per_layer, std::uint64_t(m.layers)},
                         "--lora-rank * adapter widths * num_hidden_layers");
}

std::string train_title_extras(const TrainConfig& t) {
  // A mixture of experts' capacity (--capacity-factor), after the LoRA part.
  const std::string capacity =
      t.capacity_factor > 0 ? "  capacity factor " + number_text(t.capacity_factor) : "";
  if (!t.lora()) return capacity;
  std::string dropout;
  if (t.lora_dropped()) {
    char p[32];
    std::snprintf(p, sizeof p, "%g", t.lora_dropout);
    dropout = std::string(" dropout=") + p;
  }
  if (t.quant8())  // LLM.int8's base (docs/native-plan.md, "8-bit base")
    return "  lora r=" + std::to_string(t.lora_rank) + " " + lora_targets_name(t.lora_targets) +
           dropout + " (base frozen, 8-bit int8, an fp32 absmax per row)" + capacity;
  if (t.quantized())  // QLoRA (docs/native-plan.md, "QLoRA")
    return "  qlora r=" + std::to_string(t.lora_rank) + " " + lora_targets_name(t.lora_targets) +
           dropout + " (base frozen, 4-bit " + quant_name(t.quant) +
           (t.double_quant ? " + double quant" : "") + ", blocksize " +
           std::to_string(t.quant_blocksize) + ")" + capacity;
  return "  lora r=" + std::to_string(t.lora_rank) + " " + lora_targets_name(t.lora_targets) +
         dropout + " (base frozen)" + capacity;
}

}  // namespace trainmem
