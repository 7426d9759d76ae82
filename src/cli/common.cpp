// The common and run flags shared by the subcommands, their validation, and --output.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>

#include "cli/cli.hpp"
#include "trainmem/error.hpp"

namespace trainmem::cli {
namespace {

const std::vector<std::string> kLogLevels = {"trace", "debug", "info", "warn", "error", "off"};
const std::vector<std::string> kProfiles = {"native", "hf-eager", "megatron", "zero"};

std::string join(const std::vector<std::string>& xs, const char* sep = ", ") {
  std::string out;
  for (std::size_t n = 0; n < xs.size(); ++n) {
    if (n) out += sep;
    out += xs[n];
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = s.find(',', start);
    parts.push_back(
        s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return parts;
}

// A CLI11 check that the path ends in one of the suffixes.
CLI::Validator suffix_check(std::vector<std::string> suffixes) {
  const std::string allowed = join(suffixes, " or ");
  return CLI::Validator(
      [suffixes, allowed](std::string& value) -> std::string {
        for (const auto& s : suffixes)
          if (ends_with(value, s)) return "";
        return "'" + value + "' must end in " + allowed;
      },
      "FILE(" + allowed + ")");
}

}  // namespace

void set_log_level(const std::string& level) {
  if (level == "trace")
    spdlog::set_level(spdlog::level::trace);
  else if (level == "debug")
    spdlog::set_level(spdlog::level::debug);
  else if (level == "info")
    spdlog::set_level(spdlog::level::info);
  else if (level == "warn")
    spdlog::set_level(spdlog::level::warn);
  else if (level == "error")
    spdlog::set_level(spdlog::level::err);
  else if (level == "off")
    spdlog::set_level(spdlog::level::off);
  else
    throw InputError("--log-level: unknown level '" + level + "'; allowed: " + join(kLogLevels));
}

void add_log_level_flag(CLI::App& cmd, std::string& level) {
  cmd.add_option("--log-level", level, "Logging on stderr: " + join(kLogLevels, "|"))
      ->check(CLI::IsMember(kLogLevels))
      ->each([](const std::string& v) { set_log_level(v); })
      ->capture_default_str();
}

void add_common_flags(CLI::App& cmd, CommonFlags& flags) {
  cmd.add_option("--model", flags.model,
                 "A preset (" + join(preset_names()) + ") or a HuggingFace config.json path")
      ->capture_default_str();
  cmd.add_option("--batch", flags.batch, "Micro-batch size b (>= 1)")->capture_default_str();
  cmd.add_option("--seq", flags.seq, "Sequence length s (>= 2)")->capture_default_str();
  cmd.add_option("--dtype", flags.dtype, "Training dtype: bf16|fp16|fp32")->capture_default_str();
  cmd.add_option("--optimizer", flags.optimizer, "adamw|sgd|lomo")->capture_default_str();
  // Given alone, --checkpointing means "full" (resolve_common maps the empty value).
  cmd.add_option("--checkpointing", flags.checkpointing,
                 "none|full; the bare flag means full (default: none)")
      ->expected(0, 1);  // no default_str: CLI11 would substitute it for the bare flag
  cmd.add_option("--attention", flags.attention, "eager|flash")->capture_default_str();
  cmd.add_option("--profile", flags.profile,
                 "Analytic profiles: " + join(kProfiles, "|") + "|all, or a comma list")
      ->capture_default_str();
  cmd.add_option("--format", flags.format, "table|json|csv|markdown")->capture_default_str();
  cmd.add_option("--output", flags.output, "Write the report to FILE instead of stdout");
  add_log_level_flag(cmd, flags.log_level);
}

void add_run_flags(CLI::App& cmd, RunFlags& flags) {
  cmd.add_option("--backend", flags.backend, "auto|cuda|cpu|meta")
      ->check(CLI::IsMember({"auto", "cuda", "cpu", "meta"}))
      ->capture_default_str();
  cmd.add_option("--steps", flags.steps, "Training steps to run (>= 1)")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  cmd.add_option("--seed", flags.seed, "Seed for the initial weights and random tokens")
      ->capture_default_str();
  cmd.add_option("--weights", flags.weights, "Initial weights (HuggingFace names)")
      ->check(CLI::ExistingFile)
      ->check(suffix_check({".safetensors"}));
  cmd.add_option("--tokens", flags.tokens, "Token ids: raw little-endian int32, batch*seq")
      ->check(CLI::ExistingFile);
  cmd.add_option("--dump", flags.dump, "Write the first step's loss and gradients (fp32)")
      ->check(suffix_check({".safetensors"}));
  cmd.add_option("--timeline", flags.timeline, "Memory timeline: .json (Perfetto) or .svg")
      ->check(suffix_check({".json", ".svg"}));
}

Common resolve_common(const CommonFlags& flags, bool allow_all_optimizers, bool allow_both_modes) {
  Common c;
  c.model = resolve_model(flags.model);

  c.train.batch = flags.batch;
  c.train.seq = flags.seq;
  if (flags.batch < 1)
    throw InputError("--batch must be a positive integer, got " + std::to_string(flags.batch));
  if (flags.seq < 2)
    throw InputError("--seq must be >= 2 (the loss predicts the next token), got " +
                     std::to_string(flags.seq));
  if (flags.seq > c.model.max_positions)
    spdlog::warn("--seq {} is longer than {}'s max_position_embeddings {}", flags.seq, c.model.name,
                 c.model.max_positions);

  const auto dtype = parse_dtype(flags.dtype);
  if (!dtype || *dtype == DType::i32)
    throw InputError("--dtype: unknown dtype '" + flags.dtype + "'; allowed: bf16, fp16, fp32");
  c.train.dtype = *dtype;

  if (allow_all_optimizers && flags.optimizer == "all") {
    c.optimizers = {Optimizer::adamw, Optimizer::sgd, Optimizer::lomo};
  } else if (auto o = parse_optimizer(flags.optimizer)) {
    c.optimizers = {*o};
  } else {
    throw InputError("--optimizer: unknown optimizer '" + flags.optimizer +
                     "'; allowed: adamw, sgd, lomo" + (allow_all_optimizers ? ", all" : ""));
  }
  c.train.optimizer = c.optimizers.front();

  const std::string mode = flags.checkpointing.empty() ? "full" : flags.checkpointing;
  if (allow_both_modes && mode == "both") {
    c.checkpointing_modes = {Checkpointing::none, Checkpointing::full};
  } else if (auto m = parse_checkpointing(mode)) {
    c.checkpointing_modes = {*m};
  } else {
    throw InputError("--checkpointing: unknown mode '" + flags.checkpointing +
                     "'; allowed: none, full" + (allow_both_modes ? ", both" : ""));
  }
  c.train.checkpointing = c.checkpointing_modes.front();

  const auto attention = parse_attention(flags.attention);
  if (!attention)
    throw InputError("--attention: unknown attention '" + flags.attention +
                     "'; allowed: eager, flash");
  c.train.attention = *attention;

  for (const auto& p : split_commas(flags.profile)) {
    std::vector<std::string> expanded;
    if (p == "all")
      expanded = kProfiles;
    else if (std::find(kProfiles.begin(), kProfiles.end(), p) != kProfiles.end())
      expanded = {p};
    else
      throw InputError("--profile: unknown profile '" + p + "'; allowed: " + join(kProfiles) +
                       ", all (or a comma-separated list)");
    for (const auto& e : expanded)
      if (std::find(c.profiles.begin(), c.profiles.end(), e) == c.profiles.end())
        c.profiles.push_back(e);
  }

  if (flags.format == "table")
    c.format = Format::table;
  else if (flags.format == "json")
    c.format = Format::json;
  else if (flags.format == "csv")
    c.format = Format::csv;
  else if (flags.format == "markdown")
    c.format = Format::markdown;
  else
    throw InputError("--format: unknown format '" + flags.format +
                     "'; allowed: table, json, csv, markdown");

  c.output = flags.output;
  c.train.validate();
  return c;
}

void write_output(const std::string& output_path, const std::string& text) {
  if (output_path.empty()) {
    std::cout << text << std::flush;
    return;
  }
  std::ofstream out(output_path, std::ios::binary | std::ios::trunc);
  if (!out)
    throw InputError("--output: cannot open " + output_path +
                     " for writing: " + std::strerror(errno));
  out << text;
  out.flush();
  if (!out) throw Error("--output: writing " + output_path + " failed");
  spdlog::info("wrote {}", output_path);
}

}  // namespace trainmem::cli
