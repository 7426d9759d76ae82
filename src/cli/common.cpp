// The common and run flags shared by the subcommands, their validation, and --output.
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>

#include "cli.hpp"
#include "size.hpp"
#include "trainmem/analytic/analytic.hpp"
#include "trainmem/analytic/caching_allocator.hpp"
#include "trainmem/backends/backend.hpp"
#include "trainmem/base/atomic_file.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/lora.hpp"
#include "trainmem/comm/collective.hpp"
#include "trainmem/run/run.hpp"

namespace trainmem::cli {
namespace {

const std::vector<std::string> kLogLevels = {"trace", "debug", "info", "warn", "error", "off"};
// "all" expands to the first four; hf-sdpa is asked for by name (docs/decisions.md).
const std::vector<std::string> kAllProfiles = {"native", "hf-eager", "megatron", "zero"};
const std::vector<std::string> kProfiles = {"native", "hf-eager", "megatron",
                                            "zero",   "hf-sdpa",  "hf-peft"};
const std::vector<std::string> kLoops = {"hf-model-loss", "shift-ce", "none"};

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

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// --model DIR: a HuggingFace model folder (what from_pretrained takes) holds config.json.
std::string model_argument(const std::string& model) {
  if (!is_directory(model)) return model;
  std::string path = model;
  if (path.back() != '/') path += '/';
  path += "config.json";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw InputError("--model: " + model +
                     " is a directory without a config.json; give a preset (" +
                     join(preset_names()) + "), a HuggingFace config.json or its folder");
  return path;
}

}  // namespace

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

void check_writable(const std::string& path, const std::string& flag) {
  if (path.empty()) throw InputError(flag + ": empty path");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      throw InputError(flag + ": " + path + " is a directory; give a file name");
    if (::access(path.c_str(), W_OK) != 0)
      throw InputError(flag + ": cannot open " + path + " for writing: " + std::strerror(errno));
    // A regular file is replaced by a finished temporary file written beside it
    // (atomic_file.hpp): its folder must take new files too. Devices are written in place.
    if (!S_ISREG(st.st_mode)) return;
  }
  const auto slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? std::string(".") : (slash == 0 ? "/" : path.substr(0, slash));
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw InputError(flag + ": cannot open " + path + " for writing: the folder " + dir +
                     " does not exist");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw InputError(flag + ": cannot open " + path + " for writing: the folder " + dir +
                     " is not writable: " + std::strerror(errno));
}

std::optional<std::uint64_t> host_memory_available() {
  if (const char* v = std::getenv("TRAINMEM_HOST_MEMORY"))
    return parse_size(v, "TRAINMEM_HOST_MEMORY");
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

void check_run_can_start(const RunRequest& rq) {
  if (rq.backend == "cuda") {
    const std::string why = cuda_unavailable_reason();
    if (!why.empty())
      throw InputError("--backend cuda: no usable CUDA device (" + why +
                       "); allowed here: --backend meta (the same allocation trace, predicted) "
                       "or --backend cpu (small models), or auto");
  }
  if (rq.backend != "cpu") return;
  // The cpu backend allocates every byte of the step in host memory: refuse a step that
  // cannot fit before the kernel's out-of-memory killer ends the process half way.
  const auto available = host_memory_available();
  if (!available) return;
  std::uint64_t need = estimate(Profile::native, rq.model, rq.train).figures.peak;
  if (rq.device_budget) need = std::min(need, *rq.device_budget);
  if (need <= *available) return;
  const auto gib = [](std::uint64_t b) { return format_bytes_with_unit(b, table_unit(b)); };
  throw InputError("--backend cpu: this step needs " + gib(need) + " of host memory (" +
                   rq.model.name + ", batch " + std::to_string(rq.train.batch) + ", seq " +
                   std::to_string(rq.train.seq) + ": the native profile's peak) and " +
                   gib(*available) +
                   " is available; use --backend meta (the same allocation trace, predicted, "
                   "no memory touched), a smaller --model/--batch/--seq, or --device-budget "
                   "to stop at a budget");
}

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

void add_finetune_flags(CLI::App& cmd, CommonFlags& flags) {
  cmd.add_option(
         "--finetune", flags.finetune,
         "full|lora|qlora: what is trained. lora and qlora (estimate, maxbatch) model peft's "
         "adapters on a frozen 16-bit or bitsandbytes 4-bit base as HF + peft run them "
         "(profile hf-peft; docs/formulas.md); profile, compare, sweep and plan --finetune "
         "lora|qlora run trainmem's own step with the adapters (docs/native-plan.md, \"LoRA\", "
         "\"QLoRA\"; per rank: docs/distributed.md, \"LoRA per rank\")")
      ->capture_default_str();
  cmd.add_option("--lora-rank", flags.lora_rank, "LoRA rank r (1 to 65536)")
      ->check(integer_check<std::int64_t>("an integer; allowed: an integer from 1 to 65536"))
      ->capture_default_str();
  cmd.add_option("--lora-targets", flags.lora_targets,
                 "Projections with an adapter: a comma list of q_proj,k_proj,v_proj,o_proj,"
                 "gate_proj,up_proj,down_proj, or all-linear (peft's default: q_proj,v_proj)")
      ->capture_default_str();
  cmd.add_option("--lora-dropout", flags.lora_dropout, "lora_dropout p (0 <= p < 1)")
      ->capture_default_str();
  cmd.add_option("--lora-dtype", flags.lora_dtype,
                 "fp32|model: the adapters' dtype (peft upcasts them to fp32 by default) [fp32; "
                 "peft 0.10-0.11: the base's dtype, no option]");
  cmd.add_option("--quant", flags.quant,
                 "none|nf4|fp4|int8: bitsandbytes' storage of the frozen base's linear weights, "
                 "4-bit (--finetune qlora; default nf4) or LLM.int8's 8-bit (--finetune lora "
                 "--quant int8: trainmem's own step; default: none)");
  cmd.add_option("--double-quant", flags.double_quant,
                 "on|off: quantize the 4-bit weights' absmax again (bnb_4bit_use_double_quant)")
      ->capture_default_str();
  cmd.add_option("--quant-blocksize", flags.quant_blocksize,
                 "Elements per absmax block of a 4-bit weight: 64, 128, ... 4096")
      ->check(integer_check<std::int64_t>("an integer; allowed: 64, 128, 256, 512, 1024, 2048, "
                                          "4096"))
      ->capture_default_str();
  cmd.add_option("--kbit-prepare", flags.kbit_prepare,
                 "on|off (qlora): peft's prepare_model_for_kbit_training, which upcasts every "
                 "non-4-bit weight to fp32 (and with it the activations)")
      ->capture_default_str();
  cmd.add_option("--bnb-version", flags.bnb_version,
                 "bitsandbytes release the hf-peft profile follows (0.43.x, 0.44-0.50.x) "
                 "[0.50.2, measured]");
  cmd.add_option(
      "--peft-version", flags.peft_version,
      "peft release the hf-peft profile follows (0.10-0.11.x, 0.12-0.18.x, 0.19-0.21.x: the "
      "adapters' dtype) [0.21.2, measured]");
}

void add_common_flags(CLI::App& cmd, CommonFlags& flags) {
  cmd.add_option("--model", flags.model,
                 "A preset (" + join(preset_names()) + ") or a HuggingFace config.json path")
      ->capture_default_str();
  cmd.add_option("--batch", flags.batch, "Micro-batch size b (>= 1)")
      ->check(integer_check<std::int64_t>("an integer; allowed: an integer >= 1"))
      ->capture_default_str();
  cmd.add_option("--seq", flags.seq, "Sequence length s (>= 2)")
      ->check(integer_check<std::int64_t>("an integer; allowed: an integer >= 2"))
      ->capture_default_str();
  cmd.add_option("--dtype", flags.dtype, "Training dtype: bf16|fp16|fp32")->capture_default_str();
  cmd.add_option("--optimizer", flags.optimizer,
                 "adamw|sgd|lomo, or bitsandbytes' adamw8bit|paged-adamw|paged-adamw8bit "
                 "(AdamW8bit, PagedAdamW, PagedAdamW8bit)")
      ->capture_default_str();
  // Given alone, --checkpointing means "full" (resolve_common maps the empty value).
  cmd.add_option("--checkpointing", flags.checkpointing,
                 "none|full|selective|every:K|layers:LIST|budget:SIZE; the bare flag means full "
                 "(default: none)")
      ->expected(0, 1);  // no default_str: CLI11 would substitute it for the bare flag
  cmd.add_option("--attention", flags.attention, "eager|flash")->capture_default_str();
  cmd.add_flag("--offload-activations", flags.offload_activations,
               "Copy what each layer but the last saves for backward to host memory after the "
               "next layer's forward, prefetched one layer ahead in backward (trainmem's own "
               "step on one GPU; docs/formulas.md, Activation offload)");
  cmd.add_option("--profile", flags.profile,
                 "Analytic profiles: " + join(kProfiles, "|") + "|all (" + join(kAllProfiles, ",") +
                     "), or a comma list")
      ->capture_default_str();
  cmd.add_option("--hf-version", flags.hf_version,
                 "hf-eager/hf-sdpa: the transformers release whose code era to model (4.28-4.29, "
                 "4.30, 4.31-4.34, 4.35, 5.25; default 4.30 for hf-eager, 5.25 for hf-sdpa and "
                 "for the families (mistral, qwen2, qwen3, rope_scaling, head_dim), measured "
                 "in 5.25 only)");
  cmd.add_option("--torch-version", flags.torch_version,
                 "hf-eager/hf-sdpa: the PyTorch release (1.13-2.1: mean keeps its input; "
                 "2.2-2.15: it does not; default 2.0, 2.15 with transformers 5.25)");
  cmd.add_option("--loop", flags.loop,
                 "hf-eager/hf-sdpa: the training loop: hf-model-loss (model(..., labels=...)), "
                 "shift-ce (the caller's CrossEntropyLoss on the shifted logits), none")
      ->capture_default_str();
  cmd.add_flag("--use-cache", flags.use_cache,
               "hf-eager/hf-sdpa: the model returns past_key_values and the loop holds them "
               "(HF turns it off under checkpointing)");
  cmd.add_option("--precision", flags.precision,
                 "hf-eager/hf-sdpa (transformers 5.25): the precision recipe of the HF step: pure "
                 "(the model and AdamW's moments in --dtype), amp (an fp32 model under autocast, "
                 "HF Trainer's bf16=True/fp16=True), mixed (a 16-bit model with fp32 master "
                 "weights and moments; the default, pure in fp32)");
  cmd.add_option("--adamw-impl", flags.adamw_impl,
                 "hf-eager/hf-sdpa (transformers 5.25): torch.optim.AdamW's implementation: "
                 "foreach (the default on a GPU), fused, forloop");
  cmd.add_option("--experts-impl", flags.experts_impl,
                 "hf-eager on a mixture of experts: transformers 5.25's experts implementation, "
                 "grouped_mm (its default where torch._grouped_mm runs) or eager (a loop over "
                 "the experts; default grouped_mm)");
  cmd.add_option("--capacity-factor", flags.capacity_factor,
                 "a mixture of experts in trainmem's own step (native): each expert computes at "
                 "most ceil((b*s*K/E)*C) of the choices routed to it, in token order, the rest "
                 "dropped (GShard; default: none, every choice kept)");
  add_finetune_flags(cmd, flags);
  cmd.add_option("--format", flags.format, "table|json|csv|markdown|html")->capture_default_str();
  cmd.add_option("--output", flags.output, "Write the report to FILE instead of stdout");
  add_log_level_flag(cmd, flags.log_level);
}

namespace {

bool on_off(const std::string& value, const char* flag) {
  if (value == "on") return true;
  if (value == "off") return false;
  throw InputError(std::string(flag) + ": '" + value + "'; allowed: on, off");
}

// --finetune and the LoRA flags into opts.peft; InputError naming the flag.
void resolve_peft(const CommonFlags& flags, PeftOptions& p) {
  if (const auto f = parse_finetune(flags.finetune))
    p.finetune = *f;
  else
    throw InputError("--finetune: unknown '" + flags.finetune + "'; allowed: full, lora, qlora");
  const CommonFlags defaults;
  if (p.finetune == Finetune::full) {
    const std::pair<const char*, bool> given[] = {
        {"--lora-rank", flags.lora_rank != defaults.lora_rank},
        {"--lora-targets", flags.lora_targets != defaults.lora_targets},
        {"--lora-dropout", flags.lora_dropout != defaults.lora_dropout},
        {"--lora-dtype", flags.lora_dtype != defaults.lora_dtype},
        {"--quant", !flags.quant.empty() && flags.quant != "none"},
        {"--double-quant", flags.double_quant != defaults.double_quant},
        {"--quant-blocksize", flags.quant_blocksize != defaults.quant_blocksize},
        {"--kbit-prepare", flags.kbit_prepare != defaults.kbit_prepare},
        {"--bnb-version", !flags.bnb_version.empty()},
        {"--peft-version", !flags.peft_version.empty()}};
    for (const auto& [flag, set] : given)
      if (set)
        throw InputError(std::string(flag) +
                         " applies to --finetune lora or qlora (--finetune is full)");
    return;
  }
  p.rank = flags.lora_rank;
  p.targets = parse_lora_targets(flags.lora_targets);
  {
    const std::optional<double> x = parse_number(flags.lora_dropout);
    if (!x || !(*x >= 0 && *x < 1))
      throw InputError("--lora-dropout: '" + flags.lora_dropout +
                       "'; allowed: a number p with 0 <= p < 1");
    p.dropout = *x;
  }
  if (flags.lora_dtype.empty() || flags.lora_dtype == "fp32")
    p.adapters_fp32 = true;
  else if (flags.lora_dtype == "model")
    p.adapters_fp32 = false;
  else
    throw InputError("--lora-dtype: unknown '" + flags.lora_dtype + "'; allowed: fp32, model");
  const std::string quant =
      flags.quant.empty() ? (p.finetune == Finetune::qlora ? "nf4" : "none") : flags.quant;
  if (const auto q = parse_quant(quant))
    p.quant = *q;
  else
    throw InputError("--quant: unknown '" + quant + "'; allowed: none, nf4, fp4, int8");
  // The rank's range and the base/finetune pairs: check_hf_options, for every caller.
  p.double_quant = on_off(flags.double_quant, "--double-quant");
  p.kbit_prepare = on_off(flags.kbit_prepare, "--kbit-prepare");
  if (!flags.bnb_version.empty()) {
    p.bnb_era = parse_bnb_version(flags.bnb_version);
    p.bnb_version = flags.bnb_version;
  }
  if (!flags.peft_version.empty()) {
    p.peft_era = parse_peft_version(flags.peft_version);
    p.peft_version = flags.peft_version;
    if (p.peft_era == PeftEra::v0_10 && flags.lora_dtype != defaults.lora_dtype)
      throw InputError("--lora-dtype " + flags.lora_dtype + " with --peft-version " +
                       flags.peft_version +
                       ": peft before 0.12 has no autocast_adapter_dtype; its adapters take the "
                       "base weight's dtype (fp32 on a 4-bit base)");
  }
  p.quant_blocksize = flags.quant_blocksize;
  if (p.quant == Quant::none && (flags.double_quant != defaults.double_quant ||
                                 flags.quant_blocksize != defaults.quant_blocksize ||
                                 flags.kbit_prepare != defaults.kbit_prepare))
    throw InputError(
        "--double-quant, --quant-blocksize and --kbit-prepare apply to a 4-bit base "
        "(--finetune qlora)");
  if (p.quant == Quant::int8 && (flags.double_quant != defaults.double_quant ||
                                 flags.quant_blocksize != defaults.quant_blocksize ||
                                 flags.kbit_prepare != defaults.kbit_prepare))
    throw InputError(
        "--double-quant, --quant-blocksize and --kbit-prepare apply to a 4-bit base (--finetune "
        "qlora; --kbit-prepare to its hf-peft profile); --quant int8 stores one fp32 absmax per "
        "row and hf-peft does not model it");
}

}  // namespace

void add_run_flags(CLI::App& cmd, RunFlags& flags, bool several_runs) {
  cmd.add_option("--backend", flags.backend, "auto|cuda|cpu|meta")
      ->check(CLI::IsMember({"auto", "cuda", "cpu", "meta"}))
      ->capture_default_str();
  cmd.add_option("--steps", flags.steps,
                 "Training steps to run (1 to " + std::to_string(kMaxSteps) + ")")
      ->check(integer_check<int>("an integer; allowed: an integer from 1 to " +
                                 std::to_string(kMaxSteps)))
      ->check(CLI::Range(1, kMaxSteps))
      ->capture_default_str();
  cmd.add_option("--seed", flags.seed, "Seed for the initial weights and random tokens")
      ->check(integer_check<std::uint64_t>(
          "a seed; allowed: an integer from 0 to 18446744073709551615"))
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
  if (!several_runs) {
    cmd.add_option("--dump-routing", flags.dump_routing,
                   "A mixture of experts: write the tokens each expert received in the last "
                   "step, layer by layer (JSON; cpu or cuda)")
        ->check(suffix_check({".json"}));
    cmd.add_option("--routing", flags.routing,
                   "A mixture of experts on --backend meta (which routes nothing): balanced (the "
                   "default) or a --dump-routing FILE.json; the report shows it and, under "
                   "--capacity-factor, the choices it drops (no byte depends on it)");
  }
  cmd.add_option("--device-budget", flags.device_budget,
                 several_runs ? "Refuse allocations past SIZE live bytes in every run "
                                "(out-of-memory: exit 3)"
                              : "Refuse allocations past SIZE live bytes (out-of-memory: exit "
                                "3, the report of what was measured still written)");
  cmd.add_option("--allocator", flags.allocator,
                 std::string("Also report what PyTorch's CUDA caching allocator would reserve: "
                             "pytorch, or pytorch:KEY=VALUE,... with PYTORCH_CUDA_ALLOC_CONF's "
                             "keys (docs/allocator.md); with --device-budget the out-of-memory "
                             "is PyTorch's (reserved bytes)") +
                     (several_runs ? "; every run" : ""));
}

void check_outputs(const Common& c, const RunFlags& flags) {
  check_distinct_outputs({{"--output", c.output},
                          {"--timeline", flags.timeline},
                          {"--dump", flags.dump},
                          {"--dump-routing", flags.dump_routing}});
  // An input overwritten by an output would be read after it changed.
  for (const auto& [in_flag, in] : {std::pair<std::string, std::string>{"--weights", flags.weights},
                                    {"--tokens", flags.tokens},
                                    {"--routing", flags.routing}})
    for (const auto& [out_flag, out] : {std::pair<std::string, std::string>{"--output", c.output},
                                        {"--timeline", flags.timeline},
                                        {"--dump", flags.dump},
                                        {"--dump-routing", flags.dump_routing}})
      if (same_output_file(in, out))
        throw InputError(out_flag + " " + out + " is the " + in_flag +
                         " file: the run would overwrite its own input; give another path");
}

RunRequest run_request(const Common& c, const RunFlags& flags) {
  check_outputs(c, flags);
  RunRequest rq;
  rq.model = c.model;
  rq.train = c.train;
  rq.backend = flags.backend;
  rq.steps = flags.steps;
  rq.seed = flags.seed;
  rq.weights = flags.weights;
  rq.tokens = flags.tokens;
  rq.dump = flags.dump;
  if (!flags.device_budget.empty())
    rq.device_budget = parse_size(flags.device_budget, "--device-budget");
  if (!flags.allocator.empty()) {
    rq.allocator = parse_allocator(flags.allocator);
  }
  for (const auto& name : c.profiles) {
    const auto p = parse_profile(name);
    if (!p) throw InputError("--profile: unknown profile '" + name + "'");
    rq.profiles.push_back(*p);
  }
  rq.hf = c.hf;
  rq.keep_timeline = !flags.timeline.empty();
  return rq;
}

Format parse_format(const std::string& name) {
  if (name == "table") return Format::table;
  if (name == "json") return Format::json;
  if (name == "csv") return Format::csv;
  if (name == "markdown") return Format::markdown;
  if (name == "html") return Format::html;
  throw InputError("--format: unknown format '" + name +
                   "'; allowed: table, json, csv, markdown, html");
}

Common resolve_common(const CommonFlags& flags, bool allow_all_optimizers, bool allow_both_modes,
                      bool allow_finetune, bool native_lora) {
  Common c;
  c.model = resolve_model(model_argument(flags.model));
  resolve_peft(flags, c.hf.peft);
  const bool lora = c.hf.peft.finetune != Finetune::full;
  // trainmem's own step: LoRA adapters on a frozen 16-bit or 4-bit base (docs/native-plan.md,
  // "LoRA", "QLoRA").
  // A command that only runs it refuses the recipes it cannot run; estimate models it beside
  // hf-peft where it can.
  const PeftOptions& peft = c.hf.peft;
  // bitsandbytes' optimizers are TrainConfig optimizers: trainmem's own step and hf-peft run
  // them alike (PeftOptions::optimizer stays none; hf-peft takes them from the TrainConfig).
  if (lora && native_lora) {
    check_hf_options(Profile::hf_peft, c.hf);  // the rank's range, the base/finetune pairs
    peft.apply_to(c.train);
  }
  if (lora && !allow_finetune && !native_lora)
    throw InputError("--finetune " + flags.finetune +
                     ": this command models full fine-tunes only; `trainmem estimate --finetune " +
                     flags.finetune +
                     "` models the step as HF + peft run it (profile hf-peft), and `trainmem "
                     "maxbatch --finetune " +
                     flags.finetune + "` searches the largest batch with it");

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
    if (lora) c.optimizers.pop_back();  // LOMO updates every weight in the backward
  } else if (auto o = parse_optimizer(flags.optimizer)) {
    c.optimizers = {*o};
  } else {
    throw InputError("--optimizer: unknown optimizer '" + flags.optimizer +
                     "'; allowed: adamw, sgd, lomo, adamw8bit, paged-adamw, paged-adamw8bit" +
                     (allow_all_optimizers ? ", all" : ""));
  }
  c.train.optimizer = c.optimizers.front();
  if (!flags.bnb_version.empty() && !eight_bit_optimizer(c.train.optimizer))
    throw InputError("--bnb-version " + flags.bnb_version +
                     ": the releases hf-peft knows differ only in the 8-bit optimizers' state; "
                     "give it with --optimizer adamw8bit or paged-adamw8bit");

  c.checkpointing_modes = parse_checkpoint_policies(
      flags.checkpointing.empty() ? "full" : flags.checkpointing, c.model.layers, allow_both_modes);
  c.checkpointing_modes.front().apply(c.train);

  const auto attention = parse_attention(flags.attention);
  if (!attention)
    throw InputError("--attention: unknown attention '" + flags.attention +
                     "'; allowed: eager, flash");
  c.train.attention = *attention;
  c.train.offload_activations = flags.offload_activations;
  if (lora && c.train.offload_activations)
    throw InputError("--offload-activations with --finetune " + flags.finetune +
                     ": activation offload is trainmem's own step's; hf-peft models HF's step, "
                     "which keeps its activations on the GPU");

  bool all_profiles = false;
  for (const auto& p : split_commas(flags.profile)) {
    std::vector<std::string> expanded;
    if (p == "all")
      expanded = !lora            ? kAllProfiles
                 : c.train.lora() ? std::vector<std::string>{"native", "hf-peft"}
                                  : std::vector<std::string>{"hf-peft"};
    else if (std::find(kProfiles.begin(), kProfiles.end(), p) != kProfiles.end())
      expanded = {p};
    else
      throw InputError("--profile: unknown profile '" + p + "'; allowed: " + join(kProfiles) +
                       ", all (or a comma-separated list)");
    all_profiles |= p == "all";
    for (const auto& e : expanded)
      if (std::find(c.profiles.begin(), c.profiles.end(), e) == c.profiles.end())
        c.profiles.push_back(e);
  }

  c.format = parse_format(flags.format);

  if (!flags.hf_version.empty()) {
    c.hf.era = parse_hf_version(flags.hf_version);
    c.hf.hf_version = flags.hf_version;
  }
  if (!flags.torch_version.empty()) {
    c.hf.torch = parse_torch_version(flags.torch_version, &c.hf);
    c.hf.torch_version = flags.torch_version;
  }
  const auto loop = parse_loop(flags.loop);
  if (!loop)
    throw InputError("--loop: unknown loop '" + flags.loop + "'; allowed: " + join(kLoops));
  c.hf.loop = *loop;
  c.hf.use_cache = flags.use_cache;
  if (!flags.precision.empty()) {
    const auto p = parse_precision(flags.precision);
    if (!p)
      throw InputError("--precision: unknown recipe '" + flags.precision +
                       "'; allowed: pure, amp, mixed");
    c.hf.precision = *p;
  }
  if (!flags.adamw_impl.empty()) {
    const auto a = parse_adamw_impl(flags.adamw_impl);
    if (!a)
      throw InputError("--adamw-impl: unknown implementation '" + flags.adamw_impl +
                       "'; allowed: foreach, fused, forloop");
    c.hf.adamw_impl = *a;
  }
  if (!flags.experts_impl.empty()) {
    if (flags.experts_impl != "grouped_mm" && flags.experts_impl != "eager")
      throw InputError("--experts-impl: unknown implementation '" + flags.experts_impl +
                       "'; allowed: grouped_mm, eager");
    if (!c.model.moe())
      throw InputError("--experts-impl " + flags.experts_impl + ": " + c.model.name +
                       " is not a mixture of experts (the flag applies to mixtral, qwen2_moe and "
                       "qwen3_moe models)");
    c.hf.experts_grouped_mm = flags.experts_impl == "grouped_mm";
  }
  if (!flags.capacity_factor.empty()) {
    const std::string& v = flags.capacity_factor;
    const std::optional<double> C = parse_number(v);
    if (!C || !(*C > 0.0))
      throw InputError("--capacity-factor: '" + v + "'; allowed: a number C > 0");
    if (!c.model.moe())
      throw InputError("--capacity-factor " + v + ": " + c.model.name +
                       " is not a mixture of experts (the flag applies to mixtral, qwen2_moe and "
                       "qwen3_moe models)");
    c.train.capacity_factor = *C;
  }
  c.profiles_all = all_profiles;
  if (all_profiles && c.train.lora()) {
    // Beside the native step, hf-peft where it models the family (LLaMA, Mistral, Qwen2) and the
    // base (not the 8-bit one yet).
    try {
      if (c.train.quant8())
        throw InputError("hf-peft does not model bitsandbytes' 8-bit base (--quant int8) yet");
      check_hf_model(Profile::hf_peft, c.hf, c.model);
    } catch (const InputError& e) {
      spdlog::warn("--profile all: hf-peft left out: {}", e.what());
      c.profiles.erase(std::remove(c.profiles.begin(), c.profiles.end(), "hf-peft"),
                       c.profiles.end());
    }
  }
  // The releases that key the hf-peft profile alone: an error, not a no-op, without it.
  if (std::find(c.profiles.begin(), c.profiles.end(), "hf-peft") == c.profiles.end())
    for (const auto& [flag, value] :
         {std::pair<const char*, const std::string&>{"--peft-version", flags.peft_version},
          {"--bnb-version", flags.bnb_version}})
      if (!value.empty())
        throw InputError(std::string(flag) + " " + value +
                         ": it keys the hf-peft profile, which this run does not compute "
                         "(--profile " +
                         flags.profile + ")");
  if (c.model.moe()) {
    // A mixture of experts: the HF profiles model its classes, native trainmem's own MoE layer
    // (require_native_moe says what it does not model yet); no other profile does yet.
    if (all_profiles && c.train.capacity_factor > 0.0) {
      // HF's MoE blocks drop no token: the capacity is the native step's alone.
      spdlog::warn(
          "--profile all with --capacity-factor {}: only native models a capacity (HF's "
          "MoE blocks drop no token)",
          flags.capacity_factor);
      c.profiles = {"native"};
    } else if (all_profiles) {
      c.profiles = {"native", "hf-eager", "hf-sdpa"};
      try {
        require_native_moe(c.model, c.train, "profile native");
      } catch (const InputError& e) {
        spdlog::warn("--profile all: native left out: {}", e.what());
        c.profiles.erase(c.profiles.begin());
      }
      // HF's default experts implementation cannot run every width (torch._grouped_mm): the HF
      // profiles are left out then, said, as the real class would raise.
      if (const std::string why = grouped_mm_problem(c.model, c.train.dtype, c.hf); !why.empty()) {
        spdlog::warn(
            "--profile all: hf-eager and hf-sdpa left out under --experts-impl "
            "grouped_mm: {}",
            why);
        c.profiles.erase(std::remove_if(c.profiles.begin(), c.profiles.end(),
                                        [](const std::string& p) { return p != "native"; }),
                         c.profiles.end());
        if (c.profiles.empty())
          throw InputError("--profile all: no profile models " + c.model.name + " (" + why + ")");
      }
      spdlog::warn("--profile all: {} is a mixture of experts; only {} model it", c.model.name,
                   join(c.profiles));
    }
    for (const auto& name : c.profiles)
      if (name == "native")
        require_native_moe(c.model, c.train, "profile native");
      else if (name != "hf-eager" && name != "hf-sdpa")
        require_dense(c.model, "profile " + name);
      else if (c.train.capacity_factor > 0.0)
        throw InputError("--profile " + name + " with --capacity-factor " + flags.capacity_factor +
                         ": HF's MoE blocks drop no token; the capacity applies to the native "
                         "profile and trainmem's own step");
  }
  for (const auto& name : c.profiles) {
    if (lora && name != "hf-peft" && !(c.train.lora() && name == "native"))
      throw InputError("--profile " + name + " with --finetune " + flags.finetune +
                       ": only hf-peft" + (native_lora ? " and native model" : " models") +
                       " a LoRA step (the other profiles train every weight)");
    check_hf_options(*parse_profile(name), c.hf);
  }
  if (!flags.precision.empty() || !flags.adamw_impl.empty()) {
    const bool hf = std::any_of(c.profiles.begin(), c.profiles.end(), [](const std::string& n) {
      return n == "hf-eager" || n == "hf-sdpa";
    });
    if (!hf)
      throw InputError(std::string(flags.precision.empty() ? "--adamw-impl" : "--precision") +
                       ": applies to the HF step (--profile hf-eager or hf-sdpa); --profile " +
                       join(c.profiles) + " has neither");
  }

  c.output = flags.output;
  if (!c.output.empty()) check_writable(c.output, "--output");
  c.train.validate();
  // Sizes past 64 bits: say which flags make them so (the arithmetic only knows the product).
  for (const auto& name : c.profiles) {
    TrainConfig t = c.train;
    for (Optimizer o : c.optimizers)
      for (const CheckpointPolicy& m : c.checkpointing_modes) {
        t.optimizer = o;
        m.apply(t);
        if (t.checkpoint_layers.budget > 0) t.checkpoint_layers = {{0}, "", 0};  // sizes only
        try {
          (void)estimate(*parse_profile(name), c.model, t, c.hf);
        } catch (const OverflowError& e) {
          throw InputError("--batch " + std::to_string(c.train.batch) + ", --seq " +
                           std::to_string(c.train.seq) + ": the step's sizes for " + c.model.name +
                           " do not fit 64-bit byte counts (" + e.what() +
                           "); choose a smaller --batch or --seq");
        }
      }
  }
  return c;
}

void write_output(const std::string& output_path, const std::string& text) {
  if (output_path.empty()) {
    std::cout << text << std::flush;
    return;
  }
  write_file_atomically(output_path, text, "--output");
  spdlog::info("wrote {}", output_path);
}

bool user_terminal(int fd) {
  return isatty(fd) == 1 && !detect_launch().under_mpi;
}

report::Colour stdout_colour(const std::string& output_path) {
  return output_path.empty() && user_terminal(STDOUT_FILENO) && !std::getenv("NO_COLOR")
             ? report::Colour::on
             : report::Colour::off;
}

std::string suffixed_path(const std::string& path, const std::string& suffix) {
  const auto dot = path.find_last_of('.');
  const auto slash = path.find_last_of('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash))
    return path + "-" + suffix;
  return path.substr(0, dot) + "-" + suffix + path.substr(dot);
}

}  // namespace trainmem::cli
