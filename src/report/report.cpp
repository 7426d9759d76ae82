// Output helpers: byte figures, aligned tables of cells (text, Markdown, CSV) and the JSON
// blocks of schema "trainmem/1". See include/trainmem/report/report.hpp.
#include "trainmem/report/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "trainmem/base/error.hpp"
#include "trainmem/base/lora.hpp"

namespace trainmem::report {

using nlohmann::json;

// ---------------------------------------------------------------- numbers

std::string fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string gib2(std::uint64_t bytes) {
  return trainmem::format_bytes(bytes, kGiB);
}

std::string coef(double value) {
  std::string s = fixed(value, 4);
  if (s.find('.') != std::string::npos) {
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

std::string with_commas(std::uint64_t n) {
  std::string digits = std::to_string(n), out;
  int count = 0;
  for (auto it = digits.rbegin(); it != digits.rend(); ++it) {
    if (count && count % 3 == 0) out.push_back(',');
    out.push_back(*it);
    ++count;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

// ---------------------------------------------------------------- tables

Cell check_cell(bool ok) {
  return ok ? Cell("yes", Tone::ok) : Cell("NO", Tone::fail);
}

std::string bold(const std::string& s) {
  return "\033[1m" + s + "\033[0m";
}

std::string toned(const std::string& s, Tone tone) {
  switch (tone) {
    case Tone::ok:
      return "\033[32m" + s + "\033[0m";
    case Tone::fail:
      return "\033[1;31m" + s + "\033[0m";
    case Tone::neutral:
      break;
  }
  return s;
}

Table::Table(std::vector<Column> columns) : columns_(std::move(columns)) {}

void Table::add_row(std::vector<Cell> cells) {
  if (cells.size() != columns_.size())
    throw Error("report table: row has " + std::to_string(cells.size()) + " cells, table has " +
                std::to_string(columns_.size()) + " columns");
  rows_.push_back(std::move(cells));
}

void Table::add_rule() {
  rows_.emplace_back();
}

std::size_t Table::row_count() const {
  return static_cast<std::size_t>(
      std::count_if(rows_.begin(), rows_.end(), [](const auto& r) { return !r.empty(); }));
}

namespace {
// Display width: counts UTF-8 code points (the tables carry "·" and "²").
std::size_t display_width(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}
// The cell's text, coloured by its tone when `colour` is on, padded to `width` visible
// characters.
std::string pad(const Cell& cell, std::size_t width, Align a, Colour colour) {
  const std::string s = colour == Colour::on ? toned(cell.text, cell.tone) : cell.text;
  const std::size_t w = display_width(cell.text);
  if (w >= width) return s;
  const std::string fill(width - w, ' ');
  return a == Align::left ? s + fill : fill + s;
}
}  // namespace

std::string Table::text(Colour colour) const {
  std::vector<std::size_t> width(columns_.size());
  for (std::size_t c = 0; c < columns_.size(); ++c) width[c] = display_width(columns_[c].header);
  for (const auto& r : rows_)
    for (std::size_t c = 0; c < r.size(); ++c)
      width[c] = std::max(width[c], display_width(r[c].text));
  std::size_t total = 0;
  for (auto w : width) total += w;
  total += columns_.empty() ? 0 : 2 * (columns_.size() - 1);
  auto line = [&](const std::vector<Cell>& cells) {
    std::string out;
    for (std::size_t c = 0; c < columns_.size(); ++c) {
      if (c) out += "  ";
      out += pad(cells[c], width[c], columns_[c].align, colour);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::vector<Cell> headers;
  for (const auto& col : columns_) headers.emplace_back(col.header);
  std::string out = line(headers);
  out += std::string(total, '-') + "\n";
  for (const auto& r : rows_) out += r.empty() ? std::string(total, '-') + "\n" : line(r);
  return out;
}

std::string Table::markdown() const {
  auto esc = [](const std::string& s) {
    std::string o;
    for (char c : s) {
      if (c == '|')
        o += "\\|";
      else
        o.push_back(c);
    }
    return o;
  };
  std::string out = "|";
  for (const auto& col : columns_) out += " " + esc(col.header) + " |";
  out += "\n|";
  for (const auto& col : columns_) out += col.align == Align::right ? " ---: |" : " :--- |";
  out += "\n";
  for (const auto& r : rows_) {
    if (r.empty()) continue;
    out += "|";
    for (const auto& cell : r) out += " " + esc(cell.text) + " |";
    out += "\n";
  }
  return out;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) {
    if (c == '"')
      o += "\"\"";
    else
      o.push_back(c);
  }
  return o + "\"";
}

std::string Table::csv() const {
  std::string out;
  for (std::size_t c = 0; c < columns_.size(); ++c)
    out += (c ? "," : "") + csv_field(columns_[c].header);
  out += "\n";
  for (const auto& r : rows_) {
    if (r.empty()) continue;
    for (std::size_t c = 0; c < r.size(); ++c) out += (c ? "," : "") + csv_field(r[c].text);
    out += "\n";
  }
  return out;
}

// ---------------------------------------------------------------- JSON blocks

namespace {
bool departs_from_llama(const ModelConfig& m) {
  return m.family != "llama" || !m.features().empty();
}
std::string joined(const std::vector<std::string>& xs, const char* sep) {
  std::string out;
  for (const auto& x : xs) out += (out.empty() ? "" : sep) + x;
  return out;
}
}  // namespace

json model_json(const ModelConfig& m, std::uint64_t param_count) {
  namespace key = schema::model_key;
  json j{{key::kName, m.name},
         {key::kParams, param_count},
         {key::kLayers, m.layers},
         {key::kHidden, m.hidden},
         {key::kIntermediate, m.intermediate},
         {key::kHeads, m.heads},
         {key::kKvHeads, m.kv_heads},
         {key::kVocab, m.vocab},
         {key::kTiedEmbeddings, m.tied_embeddings}};
  if (departs_from_llama(m)) {
    j["family"] = m.family;
    j["head_dim"] = m.head_dim();
    j["qkv_bias"] = m.qkv_bias;
    j["qk_norm"] = m.qk_norm;
    j["sliding_window"] = m.sliding_window;
    j["window_from_layer"] = m.window_from_layer;
    if (m.rope_scaling.kind == RopeScalingKind::llama3)
      j["rope_scaling"] =
          json{{"rope_type", "llama3"},
               {"factor", m.rope_scaling.factor},
               {"low_freq_factor", m.rope_scaling.low_freq_factor},
               {"high_freq_factor", m.rope_scaling.high_freq_factor},
               {"original_max_position_embeddings", m.rope_scaling.original_max_positions}};
    else
      j["rope_scaling"] = nullptr;
    j["features"] = m.features();
  }
  if (m.moe())
    j["moe"] = json{{"experts", m.experts},
                    {"experts_per_token", m.experts_per_token},
                    {"expert_intermediate", m.expert_intermediate},
                    {"shared_expert_intermediate", m.shared_expert_intermediate},
                    {"norm_topk_prob", m.norm_topk_prob},
                    {"moe_layers", m.moe_layer_count()},
                    {"output_router_logits", m.output_router_logits}};
  if (!m.ignored_fields.empty()) j["ignored_fields"] = m.ignored_fields;
  return j;
}

std::string family_line(const ModelConfig& m) {
  if (!departs_from_llama(m)) return "";
  const auto f = m.features();
  return "model family " + m.family + ": " +
         (f.empty() ? std::string("LLaMA's layer (no departure on)") : joined(f, "; "));
}

std::string ignored_fields_line(const ModelConfig& m) {
  if (m.ignored_fields.empty()) return "";
  return "config.json keys ignored (no effect on a training step): " +
         joined(m.ignored_fields, ", ");
}

json run_json(const TrainConfig& t, const std::string& backend, int steps) {
  namespace key = schema::run_key;
  json j{{key::kBatch, t.batch},
         {key::kSeq, t.seq},
         {key::kDtype, dtype_name(t.dtype)},
         {key::kOptimizer, optimizer_name(t.optimizer)},
         {key::kCheckpointing, checkpointing_name(t)},
         {key::kAttention, attention_name(t.attention)},
         {key::kOffloadActivations, t.offload_activations}};
  if (t.lora()) {  // trainmem's own LoRA step (docs/native-plan.md, "LoRA")
    j["finetune"] = t.quant4() ? "qlora" : "lora";
    j["lora_rank"] = t.lora_rank;
    j["lora_targets"] = lora_targets_name(t.lora_targets);
    j["lora_alpha"] = t.lora_alpha;
    j["lora_dropout"] = t.lora_dropout;
    if (t.quant4()) {  // QLoRA (docs/native-plan.md, "QLoRA")
      j["quant"] = quant_name(t.quant);
      j["double_quant"] = t.double_quant;
      j["quant_blocksize"] = t.quant_blocksize;
    } else if (t.quant8()) {  // the 8-bit base (docs/native-plan.md, "8-bit base")
      j["quant"] = quant_name(t.quant);
    }
  }
  if (t.capacity_factor > 0) j["capacity_factor"] = t.capacity_factor;  // a mixture of experts
  j[key::kBackend] = backend.empty() ? json(nullptr) : json(backend);
  j[key::kSteps] = steps < 0 ? json(nullptr) : json(steps);
  return j;
}

json breakdown_json(const CategoryBytes& b) {
  json j = json::object();
  for (Category c : all_categories()) j[category_name(c)] = b[static_cast<int>(c)];
  return j;
}

json figures_json(const MemoryFigures& f, bool breakdown) {
  json j = json::object();
  for (const auto& figure : schema::kFigures) j[figure.key] = f.*figure.member;
  if (breakdown) j[schema::kPeakBreakdown] = breakdown_json(f.peak_breakdown);
  return j;
}

json coefficients_json(const Coefficients& c) {
  json j = json::object();
  for (const auto& term : schema::kCoefficientTerms) j[term.key] = c.*term.member;
  j[schema::kOtherBytes] = c.other_bytes;
  return j;
}

namespace {
json tensor_field_json(const TensorEntry& e, const schema::TensorField& field) {
  switch (field.value) {
    case schema::EntryValue::text:
      return e.*field.text;
    case schema::EntryValue::bytes:
      return e.bytes;
    case schema::EntryValue::term:
      return term_name(e.term);
    case schema::EntryValue::coefficient:
      return e.coefficient;
  }
  throw Error(std::string("tensor_entry_json: no value for field ") + field.key);
}
}  // namespace

json tensor_entry_json(const TensorEntry& e, const std::string& group) {
  json j{{schema::kEntryGroup, group}};
  for (const auto& field : schema::kTensorFields) j[field.key] = tensor_field_json(e, field);
  return j;
}

json analytic_profile_json(const Estimate& e) {
  json j = figures_json(e.figures, true);
  const auto& a = e.activations;
  j[schema::kPerLayerActivations] = a.per_layer_bytes;
  j[schema::kCoefficients] = coefficients_json(a.per_layer);
  j["sbh_equivalent"] = sbh_equivalent(e);
  j[schema::kLabel] = e.label;
  j["embedding_activations"] = a.embedding_bytes;
  j["shared_activations"] = a.shared_bytes;
  if (!a.layer_dense.empty()) {  // a mixture of experts with dense layers among the MoE ones
    j["dense_layers"] = a.dense_layers;
    j["dense_layer_activations"] = a.layer_dense_bytes;
  }
  j["head_activations"] = a.head_bytes;
  // The native LoRA step: the adapters' elements (hf-peft writes its own below).
  if (e.profile == Profile::native && e.train.lora()) j["trainable_params"] = e.trainable_params;
  // A paged bitsandbytes optimizer's states in CUDA managed memory (in no figure above).
  if (e.profile == Profile::hf_peft || paged_optimizer(e.train.optimizer))
    j["optimizer_states_managed"] = e.optimizer_states_managed;
  if (e.profile == Profile::hf_peft) {
    const PeftOptions& p = e.hf.peft;
    j["trainable_params"] = e.trainable_params;
    j["first_layer_activations"] = a.first_layer_bytes;
    j["peft"] =
        json{{"finetune", finetune_name(p.finetune)},
             {"lora_rank", p.rank},
             {"lora_targets", lora_targets_name(p.targets)},
             {"lora_dropout", p.dropout},
             {"lora_dtype", p.adapters_are_fp32() ? "fp32" : dtype_name(e.train.dtype)},
             {"quant", quant_name(p.quant)},
             {"double_quant", p.quant != Quant::none && p.double_quant},
             {"quant_blocksize", p.quant != Quant::none ? json(p.quant_blocksize) : json(nullptr)},
             {"kbit_prepare", p.quant != Quant::none && p.kbit_prepare},
             {"bnb_version", p.bnb_version.empty() ? json(nullptr) : json(p.bnb_version)},
             {"bnb_era", bnb_era_name(p.bnb_era)},
             {"peft_version", p.peft_version.empty() ? json(nullptr) : json(p.peft_version)},
             {"peft_era", peft_era_name(p.peft_era)},
             {"optimizer", p.optimizer == BnbOptimizer::none
                               ? std::string(optimizer_name(e.train.optimizer))
                               : std::string(bnb_optimizer_name(p.optimizer))},
             {"measured_with", std::string("transformers 5.25.0, peft ") +
                                   peft_era_measured(p.peft_era) +
                                   ", bitsandbytes 0.50.2, torch 2.15.0"}};
  }
  if (e.profile == Profile::hf_eager || e.profile == Profile::hf_sdpa ||
      e.profile == Profile::hf_peft) {
    j["loop_activations"] = a.loop_bytes;
    j["hf"] = json{
        {"transformers_era", hf_era_name(*e.hf.era)},
        {"transformers_releases", hf_era_range(*e.hf.era)},
        {"transformers_version", e.hf.hf_version.empty() ? json(nullptr) : json(e.hf.hf_version)},
        {"torch_series", torch_era_name(*e.hf.torch)},
        {"torch_version", e.hf.torch_version.empty() ? json(nullptr) : json(e.hf.torch_version)},
        {"loop", loop_name(e.hf.loop)},
        {"use_cache", e.hf.use_cache && e.train.checkpointed_count(0, e.model.layers) == 0},
        {"use_cache_bytes", e.use_cache_bytes}};
    if (e.model.moe())
      j["hf"]["experts_implementation"] = e.hf.experts_grouped_mm ? "grouped_mm" : "eager";
    j["hf"]["precision"] = precision_name(e.hf.recipe(e.train.dtype));
    j["hf"]["adamw_implementation"] = adamw_impl_name(e.hf.adamw_impl);
    j["hf"]["peak_from_event_sequence"] = e.hf_step_peak;
  }
  j["recompute_activations"] = a.recompute_bytes;
  j[schema::kCheckpointedLayers] = a.checkpointed_layers;
  if (e.profile == Profile::native) {
    j["recompute_flops"] = e.recompute_flops;
    j["offloaded_activations"] = a.offloaded_bytes;
    j["offload_host_bytes"] = e.offload_host_bytes;
    j["offload_transfer_bytes"] = e.offload_transfer_bytes;
  }
  j["largest_gradient"] =
      json{{"name", e.largest_gradient_name}, {"bytes", e.largest_gradient_bytes}};
  if (e.peak_instant >= 0)
    j["peak_instant"] = e.instants[static_cast<std::size_t>(e.peak_instant)].name;
  j["notes"] = e.notes;
  json tensors = json::array();
  for (const auto& group : schema::kTensorGroups)
    for (const auto& t : a.*group.entries) tensors.push_back(tensor_entry_json(t, group.name));
  j[schema::kTensors] = std::move(tensors);
  return j;
}

json analytic_json(const std::vector<Estimate>& estimates) {
  json j = json::object();
  for (const auto& e : estimates) j[profile_name(e.profile)] = analytic_profile_json(e);
  return j;
}

// ---------------------------------------------------------------- memory tables

Table memory_table(const std::vector<std::string>& key_headers,
                   const std::vector<MemoryRow>& rows) {
  std::vector<Table::Column> cols;
  for (const auto& k : key_headers) cols.push_back({k, Align::left});
  for (const char* h : {"Params", "Gradients", "Optimizer States", "Activations", "Total", "Peak"})
    cols.push_back({h, Align::right});
  Table t(cols);
  for (const auto& r : rows) {
    std::vector<Cell> cells(r.keys.begin(), r.keys.end());
    const auto& f = r.figures;
    for (auto b : {f.params, f.gradients, f.optimizer_states, f.activations, f.sum, f.peak})
      cells.emplace_back(gib2(b));
    t.add_row(std::move(cells));
  }
  return t;
}

Table memory_table_bytes(const std::vector<std::string>& key_headers,
                         const std::vector<MemoryRow>& rows) {
  std::vector<Table::Column> cols;
  for (const auto& k : key_headers) cols.push_back({k, Align::left});
  for (const char* h : {"params", "gradients", "optimizer_states", "activations",
                        "activations_peak", "workspace", "inputs", "sum", "peak"})
    cols.push_back({h, Align::right});
  Table t(cols);
  for (const auto& r : rows) {
    std::vector<Cell> cells(r.keys.begin(), r.keys.end());
    const auto& f = r.figures;
    for (auto b : {f.params, f.gradients, f.optimizer_states, f.activations, f.activations_peak,
                   f.workspace, f.inputs, f.sum, f.peak})
      cells.emplace_back(std::to_string(b));
    t.add_row(std::move(cells));
  }
  return t;
}

// ---------------------------------------------------------------- explanations

Table tensor_table(const Estimate& e) {
  Table t({{"group", Align::left},
           {"tensor", Align::left},
           {"shape", Align::left},
           {"dtype", Align::left},
           {"bytes", Align::right},
           {"term", Align::left},
           {"coef", Align::right},
           {"kept by", Align::left}});
  bool first = true;
  for (const auto& group : schema::kTensorGroups) {
    const auto& entries = e.activations.*group.entries;
    if (entries.empty()) continue;
    if (!first) t.add_rule();
    first = false;
    for (const auto& x : entries)
      t.add_row({group.name, x.name, x.shape, x.dtype, with_commas(x.bytes), term_name(x.term),
                 x.term == Term::other ? "-" : coef(x.coefficient), x.kept_by});
  }
  return t;
}

std::string recompute_text(const Estimate& e) {
  const TrainConfig& t = e.train;
  std::string what;
  if (t.checkpointing == Checkpointing::selective) {
    if (t.attention != Attention::eager)
      return "nothing with flash attention (no s² tensor to drop)";
    what =
        "the attention core (scores, softmax, the product with v) of every layer again during "
        "backward";
  } else {
    const std::int64_t L = e.model.layers, n = t.checkpointed_count(0, L);
    if (n == 0) return "";
    what = n == L ? "one extra forward of every layer during backward"
                  : "one extra forward of " + std::to_string(n) + " of the " + std::to_string(L) +
                        " layers during backward";
  }
  return what + (e.recompute_flops > 0
                     ? ", " + fixed(e.recompute_flops / 1e9, 2) + " GFLOP per step"
                     : std::string());
}

std::string offload_text(const Estimate& e) {
  if (!e.train.offload_activations) return "";
  if (e.offload_transfer_bytes == 0)
    return "nothing (one layer: its set is used at once by the backward)";
  const std::int64_t last = e.model.layers - 2;
  return (last == 0 ? std::string("layer 0") : "layers 0-" + std::to_string(last)) +
         " on the host: " + format_bytes_human(e.offload_host_bytes) + " at the end of forward, " +
         format_bytes_human(e.offload_transfer_bytes) + " copied per step (to the host and back)";
}

std::string managed_text(Optimizer o, std::uint64_t bytes) {
  if (!paged_optimizer(o)) return "";
  return std::string(optimizer_name(o)) + ": " + format_bytes_human(bytes) +
         " of optimizer state in CUDA managed memory (state1/state2 of the tensors of 100,000 "
         "elements or more, as bitsandbytes pages them), in no column and outside the peak: it "
         "moves to the GPU when the update touches it and back to the host under memory pressure";
}

std::string per_layer_formula(const Estimate& e) {
  const auto& c = e.activations.per_layer;
  std::string out;
  auto add = [&](double v, const char* mono) {
    if (v == 0) return;
    if (!out.empty()) out += " + ";
    out += coef(v) + "·" + mono;
  };
  add(c.sbh, "sbh");
  add(c.sbi, "sbi");
  add(c.as2b, "as²b");
  add(c.sb, "sb");
  if (c.other_bytes) out += (out.empty() ? "" : " + ") + std::to_string(c.other_bytes) + " B";
  return out.empty() ? "0" : out;
}

double sbh_equivalent(const Estimate& e) {
  const auto& c = e.activations.per_layer;
  const double s = static_cast<double>(e.train.seq), b = static_cast<double>(e.train.batch);
  const double h = static_cast<double>(e.model.hidden),
               i = static_cast<double>(e.model.intermediate);
  const double a = static_cast<double>(e.model.heads);
  return c.sbh + c.sbi * i / h + c.as2b * a * s / h + c.sb / h +
         static_cast<double>(c.other_bytes) / (s * b * h);
}

std::string explain_text(const Estimate& e) {
  const auto& a = e.activations;
  const auto& t = e.train;
  std::ostringstream o;
  o << "== " << profile_name(e.profile) << ": " << e.label << "\n";
  o << "   " << optimizer_name(t.optimizer) << ", checkpointing " << checkpointing_name(t)
    << ", attention " << attention_name(t.attention) << ", " << dtype_name(t.dtype)
    << (t.offload_activations ? ", activations offloaded" : "") << "\n";
  o << "per layer (bytes) = " << per_layer_formula(e) << "\n";
  o << "                  = " << with_commas(a.per_layer_bytes)
    << " B = " << gib2(a.per_layer_bytes) << " GiB per layer  (= " << coef(sbh_equivalent(e))
    << "·sbh)\n";
  const std::int64_t windowed = a.layer_windowed.empty() ? 0 : a.windowed_layers;
  const std::int64_t ckpt = a.layer_checkpointed.empty() ? 0 : a.checkpointed_layers;
  const std::int64_t first = a.first_layer.empty() ? 0 : 1;
  const std::int64_t dense = a.layer_dense.empty() ? 0 : a.dense_layers;
  o << "activations = embedding " << gib2(a.embedding_bytes);
  if (first > 0) o << " + layer 0 " << gib2(a.first_layer_bytes);
  o << " + " << a.layers - windowed - ckpt - first - dense << (dense > 0 ? " MoE" : "")
    << " layers × " << gib2(a.per_layer_bytes);
  if (windowed > 0) o << " + " << windowed << " windowed layers × " << gib2(a.layer_windowed_bytes);
  if (dense > 0) o << " + " << dense << " dense layers × " << gib2(a.layer_dense_bytes);
  if (ckpt > 0) o << " + " << ckpt << " checkpointed layers × " << gib2(a.layer_checkpointed_bytes);
  o << " + shared " << gib2(a.shared_bytes) << " + head " << gib2(a.head_bytes);
  if (!a.loop.empty()) o << " + loop " << gib2(a.loop_bytes);
  if (a.offloaded_bytes > 0) o << " − offloaded " << gib2(a.offloaded_bytes);
  o << " = " << gib2(a.total_bytes) << " GiB\n";
  if (const std::string off = offload_text(e); !off.empty())
    o << "activation offload: " << off << "\n";
  if (!a.recompute.empty())
    o << "recomputed in backward, one layer at a time: " << gib2(a.recompute_bytes) << " GiB\n";
  if (e.recompute_flops > 0)
    o << "recompute per step: " << fixed(e.recompute_flops / 1e9, 2) << " GFLOP\n";
  o << "activations_peak = " << gib2(e.figures.activations_peak)
    << " GiB, workspace = " << gib2(e.figures.workspace)
    << " GiB, inputs = " << gib2(e.figures.inputs) << " GiB\n";
  if (e.peak_instant >= 0)
    o << "peak " << gib2(e.figures.peak)
      << " GiB at: " << e.instants[static_cast<std::size_t>(e.peak_instant)].name << "\n";
  for (const auto& n : e.notes) o << "  note: " << n << "\n";
  o << "\n" << tensor_table(e).text();
  if (!e.instants.empty()) {
    // The instants the peak is the maximum of (native), in step order; * marks the peak.
    Table t({{"", Align::left},
             {"instant", Align::left},
             {"activations", Align::right},
             {"workspace", Align::right},
             {"gradients", Align::right},
             {"total GiB", Align::right}});
    for (std::size_t n = 0; n < e.instants.size(); ++n) {
      const auto& in = e.instants[n];
      auto at = [&](Category c) { return gib2(in.bytes[static_cast<int>(c)]); };
      t.add_row({static_cast<int>(n) == e.peak_instant ? "*" : "", in.name,
                 at(Category::activations), at(Category::workspace), at(Category::gradients),
                 gib2(in.total())});
    }
    o << "\npeak candidates (GiB; params, optimizer states and inputs are constant):\n" << t.text();
  }
  return o.str();
}

}  // namespace trainmem::report
