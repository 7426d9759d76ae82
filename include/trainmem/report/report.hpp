// Output helpers shared by every subcommand: GiB figures (through bytes.hpp, the one place
// byte figures are written in a unit), a small aligned table whose cells carry their state
// (rendered as text like a paper's memory table, optionally coloured, as Markdown and as CSV), and
// the JSON blocks of docs/design.md's schema "trainmem/1"
// ("model", "run", "analytic", figures, tensor lists; their keys: schema.hpp, which diff's
// reader reads them back through). Subcommands compose these: `estimate`
// emits {"schema", "model", "run", "analytic"}; `profile` adds "measured", "reconciliation" and
// "tensors"; `compare` and `sweep` wrap several such objects in {"schema", "runs": [...]}.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/bytes.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/base/figures.hpp"
#include "trainmem/report/schema.hpp"

namespace trainmem::report {

// ---------------------------------------------------------------- numbers
std::string fixed(double value, int decimals);

// GiB figures with two decimals (format_bytes in GiB, bytes.hpp), e.g. "45.61".
std::string gib2(std::uint64_t bytes);
// Compact coefficient: "32", "8.5", "0.0625" (up to 4 decimals, trailing zeros dropped).
std::string coef(double value);
std::string with_commas(std::uint64_t n);  // 6738415616 -> "6,738,415,616"

// ---------------------------------------------------------------- tables
enum class Align { left, right };

// Whether a text report may colour what it writes (see cli::stdout_colour for when it is on).
enum class Colour { off, on };

// What a cell (or a line) says about a check: ok (green on a terminal), fail (red), or neither.
// Only the text form with colour on shows it; the visible text is the same in every form.
enum class Tone { neutral, ok, fail };

struct Cell {
  std::string text;
  Tone tone = Tone::neutral;
  Cell(std::string t, Tone tn = Tone::neutral) : text(std::move(t)), tone(tn) {}
  Cell(const char* t, Tone tn = Tone::neutral) : text(t), tone(tn) {}
};
// The cell of a yes/no check: "yes" (ok) or "NO" (fail).
Cell check_cell(bool ok);

// ANSI codes of the text form with colour on.
std::string bold(const std::string& s);
std::string toned(const std::string& s, Tone tone);  // unchanged when neutral

// A table with aligned columns, described once as rows of cells and rendered as text,
// Markdown or CSV. Rules separate groups of rows in the text form (ignored by Markdown and
// CSV).
class Table {
 public:
  struct Column {
    std::string header;
    Align align = Align::right;
  };
  explicit Table(std::vector<Column> columns);
  // Throws Error when the cell count differs from the column count.
  void add_row(std::vector<Cell> cells);
  void add_rule();
  std::size_t row_count() const;
  std::size_t column_count() const { return columns_.size(); }

  // Text: header, a rule of '-', rows; columns separated by two spaces, aligned per column.
  // With colour on, a cell's tone colours its text (the widths are those of the plain text).
  std::string text(Colour colour = Colour::off) const;
  // GitHub Markdown (alignment row uses ---: for right-aligned columns).
  std::string markdown() const;
  // RFC 4180 CSV: header line then rows; fields quoted when they hold , " or newlines.
  std::string csv() const;

  // The description itself, for the writers that render cells one by one (HTML): the columns,
  // and the rows in order, an empty row marking a rule.
  const std::vector<Column>& columns() const { return columns_; }
  const std::vector<std::vector<Cell>>& rows() const { return rows_; }

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<Cell>> rows_;  // an empty row marks a rule
};

std::string csv_field(const std::string& s);

// ---------------------------------------------------------------- JSON blocks
// "model": {"name", "params", "layers", "hidden", "intermediate", "heads", "kv_heads", "vocab"}
// (plus "tied_embeddings"); for a model that departs from LLaMA (another family, or any of
// ModelConfig::features()) also "family", "head_dim", "qkv_bias", "qk_norm", "sliding_window",
// "window_from_layer", "rope_scaling" (null or {"rope_type": "llama3", ...}) and "features";
// for a config.json with ignored keys, "ignored_fields".
nlohmann::json model_json(const ModelConfig& m, std::uint64_t param_count);

// The report header's line on the model's family: "model family qwen2: q/k/v biases; sliding
// window 6 from layer 1". Empty for a plain LLaMA (so LLaMA reports are unchanged).
std::string family_line(const ModelConfig& m);
// --explain's line on config.json keys that change nothing ("config.json keys ignored (no
// effect on a training step): ..."); empty when there are none (presets).
std::string ignored_fields_line(const ModelConfig& m);
// "run": {"batch", "seq", "dtype", "optimizer", "checkpointing", "attention", "backend",
// "steps"}. `backend` empty and steps < 0 write null (estimate runs nothing).
nlohmann::json run_json(const TrainConfig& t, const std::string& backend, int steps);
// {"params", ..., "inputs", "sum", "peak"} (schema::kFigures); with `breakdown`, also
// "peak_breakdown": {category: bytes}.
nlohmann::json figures_json(const MemoryFigures& f, bool breakdown);
nlohmann::json breakdown_json(const CategoryBytes& b);
// {"sbh", "sbi", "as2b", "sb", "other_bytes"} (schema::kCoefficientTerms, schema::kOtherBytes).
nlohmann::json coefficients_json(const Coefficients& c);
// One tensor entry of the analytic lists, with its group ("embedding", "layer", ...):
// schema::kTensorFields.
nlohmann::json tensor_entry_json(const TensorEntry& e, const std::string& group);
// "analytic": {"<profile>": {figures, "per_layer_activations", "coefficients": {"sbh", "sbi",
// "as2b", "sb", "other_bytes"}, "label", "notes", "tensors", ...}}
nlohmann::json analytic_profile_json(const Estimate& e);
nlohmann::json analytic_json(const std::vector<Estimate>& estimates);

// ---------------------------------------------------------------- memory tables
// One row of a paper-style memory table.
struct MemoryRow {
  std::vector<std::string> keys;  // leading label cells (e.g. optimizer, checkpointing, profile)
  MemoryFigures figures;
};
// Columns: <key headers...>, Params, Gradients, Optimizer States, Activations, Total, Peak —
// GiB with two decimals. `Total` is `sum` (params + gradients + optimizer states +
// activations, as published tables add them); `Peak` is the high-water mark.
Table memory_table(const std::vector<std::string>& key_headers, const std::vector<MemoryRow>& rows);
// The same rows in bytes (exact integers) for CSV: <keys>, params, gradients, optimizer_states,
// activations, activations_peak, workspace, inputs, sum, peak.
Table memory_table_bytes(const std::vector<std::string>& key_headers,
                         const std::vector<MemoryRow>& rows);

// ---------------------------------------------------------------- explanations
// The per-tensor list of one estimate as a table: group, tensor, shape, dtype, bytes, term,
// coefficient, kept by.
Table tensor_table(const Estimate& e);
// "32·sbh + 8·sbi + 8·as²b + 8·sb + 2052 B" (omits zero terms).
std::string per_layer_formula(const Estimate& e);
// What the native step re-runs in backward under the native estimate's policy, in words, with
// its FLOPs per step: "one extra forward of 16 of the 32 layers during backward, 123.45 GFLOP
// per step"; "" without recompute.
std::string recompute_text(const Estimate& native);
// --offload-activations, the native estimate's host side in words: "layers 0-30 on the host:
// 19.44 GiB at the end of forward, 38.87 GiB copied per step (to the host and back)"; ""
// without offload.
std::string offload_text(const Estimate& native);
// A paged bitsandbytes optimizer (`--optimizer paged-adamw|paged-adamw8bit`), measured or
// planned: "paged-adamw8bit: 6.03 MiB of optimizer state in CUDA managed memory (...)"; ""
// for the other optimizers.
std::string managed_text(Optimizer o, std::uint64_t bytes);
// Per-layer bytes expressed as one coefficient of s·b·h:
// c_sbh + c_sbi·i/h + c_as2b·a·s/h + (c_sb + other/(sb))/h. ZeRO's 12 elements are 12·w here.
double sbh_equivalent(const Estimate& e);
// A multi-line plain-text explanation of one estimate (formula, groups, notes, tensor table).
std::string explain_text(const Estimate& e);

}  // namespace trainmem::report
