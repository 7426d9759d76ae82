// The trainmem command line: common flags shared by every subcommand, run flags for the
// subcommands that execute steps, and one registration function per subcommand (each in
// its own file: cmd_estimate.cpp, cmd_profile.cpp, cmd_compare.cpp, cmd_sweep.cpp,
// cmd_maxbatch.cpp, cmd_diff.cpp, cmd_plan.cpp). Exit codes: 0 ok, 2 bad input, 3 out of
// memory, 1 anything else.
#pragma once
#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainmem/base/config.hpp"
#include "trainmem/base/parallel.hpp"
#include "trainmem/cli/cli.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/run/run.hpp"

namespace trainmem::cli {

// --format: the report writer's format (report_writer.hpp).
using Format = report::Format;

// Raw flag values, as typed. Defaults follow docs/design.md.
struct CommonFlags {
  std::string model = "llama-7b";
  std::int64_t batch = 8;
  std::int64_t seq = 512;
  std::string dtype = "bf16";
  std::string optimizer = "adamw";     // adamw|sgd|lomo (|all where a command allows)
  std::string checkpointing = "none";  // none|full (|both); the bare flag means full
  std::string attention = "eager";     // eager|flash
  bool offload_activations = false;    // --offload-activations (native step, one GPU)
  std::string profile = "all";         // native|hf-eager|megatron|zero|hf-sdpa|all (comma list)
  // The HF profiles' semantics: a transformers release and a PyTorch release (each mapped to
  // its era; "" = the profile's default), the training loop, use_cache.
  std::string hf_version;
  std::string torch_version;
  std::string loop = "hf-model-loss";
  bool use_cache = false;
  // The HF step's precision recipe and torch AdamW implementation (hf-eager/hf-sdpa, 5.25).
  std::string precision;   // pure|amp|mixed; "" = mixed (pure in fp32)
  std::string adamw_impl;  // foreach|fused|forloop; "" = foreach
  // hf-eager on a mixture of experts: transformers 5.25's experts implementation.
  std::string experts_impl;  // grouped_mm|eager; "" = grouped_mm (given: a MoE model only)
  // trainmem's own MoE step: GShard-style token dropping, ⌈(b·s·K/E)·C⌉ rows per expert; "" =
  // none (given: a MoE model only).
  std::string capacity_factor;
  // LoRA / QLoRA (the hf-peft profile of estimate and maxbatch; the other commands refuse
  // anything but full).
  std::string finetune = "full";  // full|lora|qlora
  std::int64_t lora_rank = 16;
  std::string lora_targets = "q_proj,v_proj";
  std::string lora_dropout = "0";
  std::string lora_dtype;           // fp32|model; "" = fp32 (peft's autocast), or the era's
  std::string quant;                // none|nf4|fp4; "" = nf4 for qlora, none otherwise
  std::string double_quant = "on";  // on|off (qlora)
  std::int64_t quant_blocksize = 64;
  std::string kbit_prepare = "on";  // on|off (qlora): prepare_model_for_kbit_training
  std::string bnb_version;          // "" = 0.50.2 (what hf-peft measured)
  std::string peft_version;         // "" = 0.21.2 (what hf-peft measured)
  std::string format = "table";
  std::string output;  // empty: stdout
  std::string log_level = "info";
};

struct RunFlags {
  std::string backend = "auto";  // auto|cuda|cpu|meta
  int steps = 2;
  std::uint64_t seed = 0;
  std::string weights;       // .safetensors
  std::string tokens;        // raw int32 LE, batch*seq
  std::string dump;          // .safetensors
  std::string timeline;      // .json (Perfetto) or .svg
  std::string dump_routing;  // .json: a mixture of experts' measured routing (profile only)
  std::string routing;       // balanced|FILE.json: the routing the meta trace is given (profile)
  // --device-budget SIZE (raw): the ledger's allocator refuses to go above it; "" for none.
  std::string device_budget;
  // --allocator pytorch[:KEY=VALUE,...] (raw): mirror the run in a model of PyTorch's caching
  // allocator; "" for none.
  std::string allocator;
};

// One --checkpointing policy: none, full, every:K, layers:LIST or budget:SIZE (docs/decisions.md,
// "Which layers are checkpointed, and selective recompute"). budget:SIZE stays unresolved
// (layers.budget > 0) until resolve_checkpoint_budget picks its layers, once the layout is known.
struct CheckpointPolicy {
  Checkpointing mode = Checkpointing::none;
  CheckpointLayers layers;
  void apply(TrainConfig& t) const {
    t.checkpointing = mode;
    t.checkpoint_layers = layers;
  }
};
// "a,b,,c" -> {"a", "b", "", "c"} (empty parts kept, for the caller to refuse).
std::vector<std::string> split_commas(const std::string& s);

// Parses --checkpointing's value for a model of `layers` layers: one policy, or with
// `allow_list` "both" (none, full) or a comma list of policies ("none,every:2,full"; the
// numbers after layers: belong to it: "layers:0,3,full" is layers 0 and 3, then full).
// InputError naming --checkpointing and what is allowed.
std::vector<CheckpointPolicy> parse_checkpoint_policies(const std::string& text,
                                                        std::int64_t layers, bool allow_list);
// budget:SIZE: the fewest checkpointed layers (the first ones of every pipeline stage, as
// Megatron's --recompute-method block picks them) whose native peak on the worst rank of
// `layout` fits SIZE; InputError when even every layer checkpointed does not. Other policies
// are returned as they are.
CheckpointPolicy resolve_checkpoint_budget(const CheckpointPolicy& policy, const ModelConfig& model,
                                           const TrainConfig& train, const ParallelConfig& layout);

// resolve_checkpoint_budget over every policy of c (and c.train's), for `layout`.
struct Common;
void resolve_checkpointing(Common& c, const ParallelConfig& layout);

// Flags after validation. Errors are InputError naming the flag and what is allowed.
struct Common {
  ModelConfig model;
  TrainConfig train;                  // with the first optimizer / checkpointing policy
  std::vector<Optimizer> optimizers;  // one, or all three for "all"
  std::vector<CheckpointPolicy> checkpointing_modes;  // one, or a list ("both": none, full)
  std::vector<std::string> profiles;                  // expanded "all"
  bool profiles_all = false;                          // --profile all (the default)
  HfOptions hf;                                       // --hf-version, --torch-version, --loop, ...
  Format format = Format::table;
  std::string output;
};

// A CLI11 check, run on the text before CLI11 converts it, that the value is a whole number
// of type T; otherwise "'<value>' is not <what>" (CLI11 prefixes the flag). CLI11's own
// message ("Could not convert: --batch = abc") says nothing of what is allowed. Bounds are
// checked after parsing, where the messages say them.
template <typename T>
CLI::Validator integer_check(const std::string& what) {
  return CLI::Validator(
      [what](std::string& value) -> std::string {
        T v{};
        const char* last = value.data() + value.size();
        const auto [end, ec] = std::from_chars(value.data(), last, v);
        if (value.empty() || ec != std::errc() || end != last)
          return "'" + value + "' is not " + what;
        return "";
      },
      "INT");
}

// Adds the common flags to a subcommand.
void add_common_flags(CLI::App& cmd, CommonFlags& flags);
// --finetune and the LoRA/QLoRA flags alone (add_common_flags' share; plan registers them too).
void add_finetune_flags(CLI::App& cmd, CommonFlags& flags);
// Adds the run flags (--backend ... --timeline, --device-budget) to a subcommand that runs
// steps; `several_runs` says that --device-budget applies to each of its runs (compare,
// sweep) in the help.
void add_run_flags(CLI::App& cmd, RunFlags& flags, bool several_runs = false);
// Validates the flags. allow_all_optimizers / allow_both_modes say whether "all" / "both" are
// accepted by this subcommand.
// `allow_finetune`: the command models --finetune lora|qlora (estimate, and maxbatch through the
// hf-peft profile); `native_lora`: it runs trainmem's own step, which trains LoRA adapters on a
// frozen 16-bit base (--finetune lora: TrainConfig::lora_rank, lora_targets; profiles native and
// hf-peft); the others refuse it.
Common resolve_common(const CommonFlags& flags, bool allow_all_optimizers, bool allow_both_modes,
                      bool allow_finetune = false, bool native_lora = false);

// The request of one run from the validated common flags and the run flags (profile, compare,
// sweep): model and training configuration (callers vary optimizer, checkpointing, batch,
// seq), backend, steps, seed, weights, tokens, dump, --device-budget (parsed: InputError
// naming it when it is not a SIZE), the analytic profiles to attach, and whether to keep the
// timeline (--timeline given).
RunRequest run_request(const Common& c, const RunFlags& flags);

// Two outputs of one command that are the same file (--output, --timeline, --dump), or an output
// that is an input (--weights, --tokens): InputError naming both flags (exit 2).
void check_outputs(const Common& c, const RunFlags& flags);

// Sets spdlog's level from a --log-level value: trace|debug|info|warn|error|off (InputError
// listing them otherwise). add_common_flags wires --log-level to it during parsing.
void set_log_level(const std::string& level);
// Adds only --log-level (the top-level app has it too: `trainmem --log-level debug estimate`).
void add_log_level_flag(CLI::App& cmd, std::string& level);

// Checks, without writing anything, that `path` can be written (an existing writable file, or
// a new name in an existing writable folder); InputError naming `flag` otherwise. Called
// before a run starts, so that a long run does not end with its report undeliverable.
void check_writable(const std::string& path, const std::string& flag);

// Host memory a cpu run may use: /proc/meminfo's MemAvailable, or the environment variable
// TRAINMEM_HOST_MEMORY (a SIZE: containers whose limit MemAvailable does not show, tests).
std::optional<std::uint64_t> host_memory_available();

// Checks, before anything runs, that the request can start on this machine: --backend cuda
// needs a usable device; --backend cpu needs the step's memory (the native profile's peak,
// or --device-budget when lower) to be available in host memory. InputError naming
// --backend and the alternatives otherwise.
void check_run_can_start(const RunRequest& rq);

// Writes `text` to --output (or stdout when empty).
void write_output(const std::string& output_path, const std::string& text);
// --format's value: InputError naming --format and the formats allowed.
Format parse_format(const std::string& name);

// Whether `fd` is the user's terminal: a terminal, and not a rank under an MPI launcher (mpirun
// gives its ranks a pseudo-terminal of its own even when its output goes to a file or a pipe,
// so colours and progress bars would end up in captured output).
bool user_terminal(int fd);

// Colour for a report written to `output_path` ("" = stdout): on only when it goes to stdout,
// stdout is the user's terminal (user_terminal) and NO_COLOR is not set.
report::Colour stdout_colour(const std::string& output_path);

// "file.svg" -> "file-<suffix>.svg" (timelines of several runs).
std::string suffixed_path(const std::string& path, const std::string& suffix);

// A subcommand: registers its flags and sets `run` to the function that executes it and
// returns the exit code.
using Runner = std::function<int()>;
Runner register_estimate(CLI::App& app);
Runner register_profile(CLI::App& app);
Runner register_compare(CLI::App& app);
Runner register_sweep(CLI::App& app);
Runner register_maxbatch(CLI::App& app);
Runner register_diff(CLI::App& app);
Runner register_plan(CLI::App& app);
Runner register_replay(CLI::App& app);

// One side of `trainmem diff A B` as typed (cmd_diff.cpp): a profile spec
// "NAME[:key=value,...]" (NAME a profile: native, hf-eager, megatron, zero; keys model, batch,
// seq, dtype, optimizer, checkpointing, attention, applied over the common flags), or a saved
// JSON report "FILE[:profile=NAME,run=N]" (the options follow the last ':'; a text naming an
// existing file is a file). `which` ("A", "B") starts every InputError. The keys are checked
// when the side is built, against one table (kSideOptions in cmd_diff.cpp).
struct DiffSideSpec {
  enum class Kind { profile, report };
  Kind kind = Kind::profile;
  std::string name;  // the profile's name, or the report's path
  std::vector<std::pair<std::string, std::string>> options;  // key=value, in the order given
};
DiffSideSpec parse_diff_side(const std::string& text, const std::string& which);

// Runs `body` and returns its exit code; an exception becomes a message on stderr and the
// exit code of its kind: InputError (and CLI11 errors) 2, OutOfMemory 3, anything else 1.
int run_guarded(const std::function<int()>& body);

}  // namespace trainmem::cli
