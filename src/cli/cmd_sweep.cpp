// trainmem sweep — runs a grid of (batch, seq) and, with lists of --hidden / --intermediate /
// --heads, of model widths; with --fit, least-squares fits the per-layer activation bytes and
// prints the fitted coefficients beside the analytic (native) ones, with residuals and R²,
// for the ledger and every device source that can give the figure (include/trainmem/run/fit.hpp
// says which coefficients a grid can identify).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "cli.hpp"
#include "progress.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/report/report.hpp"
#include "trainmem/report/report_writer.hpp"
#include "trainmem/report/sweep_report.hpp"
#include "trainmem/run/fit.hpp"
#include "trainmem/run/run.hpp"
#include "trainmem/run/series.hpp"
#include "trainmem/run/sweep.hpp"

namespace trainmem::cli {
namespace {

struct SweepFlags {
  CommonFlags common;
  RunFlags run;
  std::string batches = "1,2,4";
  std::string seqs = "128,256";
  std::string hiddens, intermediates, heads;
  bool fit = false;
};

std::vector<std::int64_t> parse_list(const std::string& text, const std::string& flag,
                                     std::int64_t minimum, const std::string& example) {
  std::vector<std::int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::size_t used = 0;
    std::int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < minimum)
      throw InputError(flag + ": '" + item + "' is not an integer >= " + std::to_string(minimum) +
                       "; give a comma-separated list, e.g. " + flag + " " + example);
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
  if (out.empty()) throw InputError(flag + ": empty list; give e.g. " + flag + " " + example);
  return out;
}

// The model variants of the grid: the base model with each (hidden, intermediate, heads)
// combination. kv heads keep the base model's ratio to heads.
std::vector<ModelConfig> model_variants(const ModelConfig& base, const SweepFlags& f) {
  const auto hs = f.hiddens.empty() ? std::vector<std::int64_t>{base.hidden}
                                    : parse_list(f.hiddens, "--hidden", 1, "32,48");
  const auto is = f.intermediates.empty()
                      ? std::vector<std::int64_t>{base.intermediate}
                      : parse_list(f.intermediates, "--intermediate", 1, "64,100");
  const auto as = f.heads.empty() ? std::vector<std::int64_t>{base.heads}
                                  : parse_list(f.heads, "--heads", 1, "2,4");
  std::vector<ModelConfig> out;
  for (auto h : hs)
    for (auto i : is)
      for (auto a : as) {
        ModelConfig m = base;
        m.hidden = h;
        m.intermediate = i;
        m.heads = a;
        if ((a * base.kv_heads) % base.heads != 0)
          throw InputError("--heads " + std::to_string(a) + ": " + base.name + " has " +
                           std::to_string(base.heads) + " heads and " +
                           std::to_string(base.kv_heads) +
                           " kv heads; the sweep keeps that ratio, so heads must be a multiple "
                           "of " +
                           std::to_string(base.heads / std::gcd(base.heads, base.kv_heads)));
        m.kv_heads = a * base.kv_heads / base.heads;
        if (h % a != 0)
          throw InputError("--hidden " + std::to_string(h) + " is not divisible by --heads " +
                           std::to_string(a) + " (head dim = hidden / heads)");
        if (hs.size() > 1 || is.size() > 1 || as.size() > 1)
          m.name = base.name + "[h=" + std::to_string(h) + ",i=" + std::to_string(i) +
                   ",a=" + std::to_string(a) + "]";
        m.validate();
        out.push_back(m);
      }
  return out;
}

int run_sweep(const SweepFlags& flags) {
  if (!flags.run.timeline.empty() || !flags.run.dump.empty())
    throw InputError(std::string(flags.run.timeline.empty() ? "--dump" : "--timeline") +
                     ": sweep runs many configurations; use trainmem profile for one");
  if (!flags.common.bnb_version.empty())
    throw InputError("--bnb-version " + flags.common.bnb_version +
                     ": it keys the hf-peft profile's 8-bit states, and sweep reports the native "
                     "step only (which uses bitsandbytes 0.44+'s 256-element blocks)");
  if (!flags.common.peft_version.empty())
    throw InputError("--peft-version " + flags.common.peft_version +
                     ": it keys the hf-peft profile's adapters, and sweep reports the native step "
                     "only");
  const auto batches = parse_list(flags.batches, "--batch", 1, "1,2,4");
  const auto seqs = parse_list(flags.seqs, "--seq", 2, "128,256");
  // The common flags' --batch and --seq are the lists here: validate the rest with the
  // grid's largest point (its sizes are the ones that could overflow).
  CommonFlags common = flags.common;
  common.batch = *std::max_element(batches.begin(), batches.end());
  common.seq = *std::max_element(seqs.begin(), seqs.end());
  const Common c = resolve_common(common, false, false, /*allow_finetune=*/false,
                                  /*native_lora=*/true);
  const auto models = model_variants(c.model, flags);
  const FitTerms terms = models.size() > 1 ? FitTerms::separate : FitTerms::one_model;

  if (flags.fit && c.train.attention == Attention::flash) {
    for (const auto& m : models)
      if (m.heads != models.front().heads)
        throw InputError(
            "--fit with --attention flash and several --heads: flash attention keeps a (b,a,s) "
            "fp32 log-sum-exp per layer, a·s·b bytes, which none of sbh, sbi, as2b, sb absorbs "
            "when the head count varies; fix --heads or use --attention eager");
  }
  if (flags.fit) {
    // Refuse a grid that cannot identify the coefficients before running anything.
    std::vector<FitSample> probe;
    for (const auto& m : models)
      for (auto b : batches)
        for (auto s : seqs) {
          FitSample x{b, s, m.hidden, m.intermediate, m.heads, 0};
          for (const auto& n : fit_term_names(terms)) x.bytes += double(fit_regressor(n, x));
          probe.push_back(x);
        }
    fit_activation_coefficients(probe, terms);
  }

  // Every grid point first, checked before the first one runs.
  std::vector<RunRequest> requests;
  for (const auto& m : models)
    for (auto b : batches)
      for (auto s : seqs) {
        RunRequest rq = run_request(c, flags.run);
        rq.profiles.clear();  // sweep reports the native profile only
        rq.model = m;
        rq.train.batch = b;
        rq.train.seq = s;
        rq.train.validate();
        check_run_can_start(rq);
        requests.push_back(std::move(rq));
      }
  ProgressBar progress("sweep", requests.size());
  SeriesHooks hooks;
  hooks.before = [&](const RunRequest& rq) {
    progress.step(rq.model.name + " b=" + std::to_string(rq.train.batch) +
                  " s=" + std::to_string(rq.train.seq));
  };
  const std::vector<RunResult> runs = run_series(requests, hooks);
  progress.done();
  bool failed = false;
  for (const auto& r : runs) failed |= bool(r.failure);

  std::optional<SweepFits> fits;
  if (flags.fit && !failed) fits = fit_sources(runs, terms);
  if (flags.fit && failed) spdlog::error("--fit: skipped, a run ran out of memory");

  const auto w = report::make_writer(c.format, stdout_colour(c.output));
  report::write_sweep(*w, c.model, c.train, runs, models.size() > 1, fits);
  write_output(c.output, w->str());
  return failed ? 3 : 0;
}

}  // namespace

Runner register_sweep(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "sweep",
      "Run a grid of batch x seq (x widths); --fit least-squares fits the per-layer "
      "activation coefficients");
  auto flags = std::make_shared<SweepFlags>();
  add_common_flags(*cmd, flags->common);
  add_run_flags(*cmd, flags->run, /*several_runs=*/true);
  // --batch and --seq take lists here.
  cmd->remove_option(cmd->get_option("--batch"));
  cmd->remove_option(cmd->get_option("--seq"));
  cmd->add_option("--batch", flags->batches, "Batch sizes, comma-separated")->capture_default_str();
  cmd->add_option("--seq", flags->seqs, "Sequence lengths, comma-separated")->capture_default_str();
  cmd->add_option("--hidden", flags->hiddens,
                  "Hidden sizes to vary (comma-separated; default: the model's)");
  cmd->add_option("--intermediate", flags->intermediates,
                  "SwiGLU widths to vary (comma-separated; default: the model's)");
  cmd->add_option("--heads", flags->heads,
                  "Head counts to vary (comma-separated; kv heads keep the model's ratio)");
  cmd->add_flag("--fit", flags->fit,
                "Least-squares fit of per-layer activation bytes against the analytic "
                "coefficients");
  return [flags] { return run_sweep(*flags); };
}

}  // namespace trainmem::cli
