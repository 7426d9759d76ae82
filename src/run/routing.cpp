// A mixture of experts' routing as data (include/trainmem/run/routing.hpp).
#include "trainmem/run/routing.hpp"

#include <nlohmann/json.hpp>

#include "trainmem/base/error.hpp"
#include "trainmem/base/input_file.hpp"

namespace trainmem {

Routing balanced_routing(const ModelConfig& m, const TrainConfig& t) {
  const std::int64_t E = m.experts, choices = t.batch * t.seq * m.experts_per_token;
  std::vector<std::int64_t> counts(std::size_t(E), choices / E);
  for (std::int64_t e = 0; e < choices % E; ++e) ++counts[std::size_t(e)];
  Routing out;
  for (std::int64_t l = 0; l < m.layers; ++l)
    if (m.is_moe_layer(l)) out.push_back({l, counts, dropped_choices(counts, moe_capacity(m, t))});
  return out;
}

Routing read_routing_file(const std::string& path, const ModelConfig& m, const TrainConfig& t) {
  const std::string who = "--routing " + path;
  const nlohmann::json d =
      parse_json_strict(read_input_file(path, "--routing", kMaxConfigBytes), who);
  auto fail = [&](const std::string& field, const std::string& what) -> InputError {
    return InputError(who + ": " + field + ": " + what);
  };
  if (!d.is_object()) throw fail("the document", "not a JSON object (a --dump-routing file)");
  auto integer = [&](const nlohmann::json& v, const std::string& field) {
    if (!v.is_number_integer()) throw fail(field, "not an integer: " + clip(v.dump()));
    return v.get<std::int64_t>();
  };
  auto must_equal = [&](const char* key, std::int64_t want, const std::string& flag) {
    if (!d.contains(key)) throw fail(key, "missing");
    const std::int64_t got = integer(d[key], key);
    if (got != want)
      throw fail(key,
                 std::to_string(got) + ", but this run has " + flag + " " + std::to_string(want));
  };
  must_equal("experts", m.experts, m.name + "'s num_local_experts");
  must_equal("experts_per_token", m.experts_per_token, m.name + "'s num_experts_per_tok");
  must_equal("batch", t.batch, "--batch");
  must_equal("seq", t.seq, "--seq");
  if (!d.contains("layers") || !d["layers"].is_array())
    throw fail("layers", "missing or not an array");
  const nlohmann::json& layers = d["layers"];
  std::vector<std::int64_t> moe_layers;
  for (std::int64_t l = 0; l < m.layers; ++l)
    if (m.is_moe_layer(l)) moe_layers.push_back(l);
  if (layers.size() != moe_layers.size())
    throw fail("layers", std::to_string(layers.size()) + " entries, but " + m.name + " has " +
                             std::to_string(moe_layers.size()) + " MoE layers");
  const std::int64_t tokens = t.batch * t.seq, choices = tokens * m.experts_per_token;
  Routing out;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const std::string at = "layers[" + std::to_string(l) + "]";
    const nlohmann::json& layer = layers[l];
    if (!layer.is_object() || !layer.contains("layer") || !layer.contains("tokens_per_expert"))
      throw fail(at, "not an object with \"layer\" and \"tokens_per_expert\"");
    if (integer(layer["layer"], at + ".layer") != moe_layers[l])
      throw fail(at + ".layer", clip(layer["layer"].dump()) + ", expected " +
                                    std::to_string(moe_layers[l]) +
                                    " (one entry per MoE layer, in order)");
    const nlohmann::json& counts = layer["tokens_per_expert"];
    if (!counts.is_array() || std::int64_t(counts.size()) != m.experts)
      throw fail(at + ".tokens_per_expert",
                 "not an array of " + std::to_string(m.experts) + " counts (one per expert)");
    std::vector<std::int64_t> row;
    std::int64_t sum = 0;
    for (std::size_t e = 0; e < counts.size(); ++e) {
      const std::int64_t c =
          integer(counts[e], at + ".tokens_per_expert[" + std::to_string(e) + "]");
      if (c < 0 || c > tokens)
        throw fail(at + ".tokens_per_expert[" + std::to_string(e) + "]",
                   std::to_string(c) + " is outside [0, b·s = " + std::to_string(tokens) +
                       "] (a token picks K distinct experts)");
      sum += c;
      row.push_back(c);
    }
    if (sum != choices)
      throw fail(at + ".tokens_per_expert", "sums to " + std::to_string(sum) +
                                                ", but b·s·K = " + std::to_string(choices) +
                                                " choices are routed in every layer");
    const std::int64_t dropped = dropped_choices(row, moe_capacity(m, t));
    out.push_back({moe_layers[l], std::move(row), dropped});
  }
  return out;
}

std::int64_t dropped_choices(const std::vector<std::int64_t>& routed, std::int64_t capacity) {
  if (capacity <= 0) return 0;
  std::int64_t dropped = 0;
  for (std::int64_t c : routed) dropped += c > capacity ? c - capacity : 0;
  return dropped;
}

}  // namespace trainmem
