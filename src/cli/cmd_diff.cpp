// trainmem diff A B — where the bytes of one setup differ from another's, tensor by tensor
// (include/trainmem/report/diff.hpp). Each side is a profile spec computed now from the common
// flags, "name[:key=value,...]" (native, hf-eager:dtype=fp32, native:checkpointing=full), or a
// saved "trainmem/1" JSON report, "FILE[:profile=NAME,run=N]". parse_diff_side is the one parser of
// both forms and kSideOptions the one table of the keys a side takes: an option of a profile
// (e.g. an era of hf-eager) is one more line there.
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <memory>
#include <optional>

#include "cli.hpp"
#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/lora.hpp"
#include "trainmem/report/diff.hpp"
#include "trainmem/report/report_writer.hpp"

namespace trainmem::cli {
namespace {

std::string join(const std::vector<std::string>& xs, const char* sep = ", ") {
  std::string out;
  for (std::size_t n = 0; n < xs.size(); ++n) out += (n ? sep : "") + xs[n];
  return out;
}

// The profiles a side may name: every analytic profile, hf-peft (LoRA; not in all_profiles())
// included.
std::vector<std::string> profile_names() {
  std::vector<std::string> out;
  for (Profile p : all_profiles()) out.push_back(profile_name(p));
  out.push_back(profile_name(Profile::hf_peft));
  return out;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::int64_t integer_value(const std::string& key, const std::string& value, std::int64_t least,
                           const std::string& which) {
  std::int64_t v = 0;
  const char* last = value.data() + value.size();
  const auto [end, ec] = std::from_chars(value.data(), last, v);
  if (value.empty() || ec != std::errc() || end != last || v < least)
    throw InputError("diff " + which + ": " + key + "=" + value +
                     " is not an integer >= " + std::to_string(least));
  return v;
}

// What one side becomes once its options are applied.
struct SideSetup {
  ModelConfig model;  // profile sides: the common flags', then the options'
  TrainConfig train;
  HfOptions hf;         // profile sides: the HF profiles' era and loop (--hf-version, ...)
  std::string profile;  // report sides: profile=
  int run = 0;          // report sides: run= (1-based; 0: the only one)
};

struct SideOption {
  const char* key;
  DiffSideSpec::Kind kind;  // the sides it applies to
  const char* values;       // what it takes, for help and errors
  void (*apply)(SideSetup& s, const std::string& value, const std::string& which);
};

using Kind = DiffSideSpec::Kind;

// Every key a side takes. A profile's own option (an era of hf-eager, say `hf=4.29`) is one
// line here, setting the field of TrainConfig the profile reads.
const std::vector<SideOption> kSideOptions = {
    {"model", Kind::profile, "NAME|config.json",
     [](SideSetup& s, const std::string& v, const std::string&) { s.model = resolve_model(v); }},
    {"batch", Kind::profile, "an integer >= 1",
     [](SideSetup& s, const std::string& v, const std::string& which) {
       s.train.batch = integer_value("batch", v, 1, which);
     }},
    {"seq", Kind::profile, "an integer >= 2",
     [](SideSetup& s, const std::string& v, const std::string& which) {
       s.train.seq = integer_value("seq", v, 2, which);
     }},
    {"dtype", Kind::profile, "bf16|fp16|fp32",
     [](SideSetup& s, const std::string& v, const std::string& which) {
       const auto d = parse_dtype(v);
       if (!d || *d == DType::i32)
         throw InputError("diff " + which + ": dtype=" + v + "; allowed: bf16, fp16, fp32");
       s.train.dtype = *d;
     }},
    {"optimizer", Kind::profile, "adamw|sgd|lomo|adamw8bit|paged-adamw|paged-adamw8bit",
     [](SideSetup& s, const std::string& v, const std::string& which) {
       const auto o = parse_optimizer(v);  // bitsandbytes': the native step's and hf-peft's
       if (!o)
         throw InputError("diff " + which + ": optimizer=" + v +
                          "; allowed: adamw, sgd, lomo, adamw8bit, paged-adamw, paged-adamw8bit");
       s.train.optimizer = *o;  // hf-peft takes bitsandbytes' from it
       s.hf.peft.optimizer = BnbOptimizer::none;
     }},
    {"checkpointing", Kind::profile, "none|full|selective",
     [](SideSetup& s, const std::string& v, const std::string& which) {
       const auto m = parse_checkpointing(v);
       if (!m)
         throw InputError("diff " + which + ": checkpointing=" + v +
                          "; allowed: none, full, selective (per-layer policies: --checkpointing)");
       s.train.checkpointing = *m;
       s.train.checkpoint_layers = {};
     }},
    {"attention", Kind::profile, "eager|flash",
     [](SideSetup& s, const std::string& v, const std::string& which) {
       const auto a = parse_attention(v);
       if (!a) throw InputError("diff " + which + ": attention=" + v + "; allowed: eager, flash");
       s.train.attention = *a;
     }},
    {"hf", Kind::profile, "a transformers release (hf-eager, hf-sdpa; as --hf-version)",
     [](SideSetup& s, const std::string& v, const std::string&) {
       s.hf.era = parse_hf_version(v);
       s.hf.hf_version = v;
     }},
    {"torch", Kind::profile, "a PyTorch release (hf-eager, hf-sdpa; as --torch-version)",
     [](SideSetup& s, const std::string& v, const std::string&) {
       s.hf.torch = parse_torch_version(v, &s.hf);
       s.hf.torch_version = v;
     }},
    {"loop", Kind::profile, "hf-model-loss|shift-ce|none (as --loop)",
     [](SideSetup& s, const std::string& v, const std::string& which) {
       const auto l = parse_loop(v);
       if (!l)
         throw InputError("diff " + which + ": loop=" + v +
                          "; allowed: hf-model-loss, shift-ce, none");
       s.hf.loop = *l;
     }},
    // hf-peft's recipe (as --finetune, --lora-rank, --lora-targets, --quant, --kbit-prepare);
    // native takes the first four (trainmem's own LoRA / QLoRA step).
    {"finetune", Kind::profile, "lora|qlora (hf-peft, native; as --finetune)",
     [](SideSetup& s, const std::string& v, const std::string& which) {
       const auto f = parse_finetune(v);
       if (!f || *f == Finetune::full)
         throw InputError("diff " + which + ": finetune=" + v + "; allowed: lora, qlora");
       s.hf.peft.finetune = *f;
     }},
    {"rank", Kind::profile, "an integer 1..65536 (hf-peft, native; as --lora-rank)",
     [](SideSetup& s, const std::string& v, const std::string& which) {
       s.hf.peft.rank = std::min<std::int64_t>(integer_value("rank", v, 1, which), 1 << 30);
     }},
    {"targets", Kind::profile,
     "q_proj+v_proj+...|all-linear (hf-peft, native; as --lora-targets, '+' "
     "between names)",
     [](SideSetup& s, const std::string& v, const std::string&) {
       std::string list = v;
       std::replace(list.begin(), list.end(), '+', ',');
       s.hf.peft.targets = parse_lora_targets(list);
     }},
    {"quant", Kind::profile, "none|nf4|fp4|int8 (hf-peft, native; as --quant)",
     [](SideSetup& s, const std::string& v, const std::string& which) {
       const auto q = parse_quant(v);
       if (!q)
         throw InputError("diff " + which + ": quant=" + v + "; allowed: none, nf4, fp4, int8");
       s.hf.peft.quant = *q;
     }},
    {"prepare", Kind::profile, "on|off (hf-peft with a 4-bit base; as --kbit-prepare)",
     [](SideSetup& s, const std::string& v, const std::string& which) {
       if (v != "on" && v != "off")
         throw InputError("diff " + which + ": prepare=" + v + "; allowed: on, off");
       s.hf.peft.kbit_prepare = v == "on";
     }},
    {"profile", Kind::report, "NAME (a profile the report holds, or measured)",
     [](SideSetup& s, const std::string& v, const std::string&) { s.profile = v; }},
    {"run", Kind::report, "N (the run's place in the report's \"runs\", from 1)",
     [](SideSetup& s, const std::string& v, const std::string& which) {
       s.run = static_cast<int>(std::min<std::int64_t>(integer_value("run", v, 1, which), 1 << 30));
     }},
};

std::string keys_of(Kind kind) {
  std::vector<std::string> keys;
  for (const auto& o : kSideOptions)
    if (o.kind == kind) keys.push_back(std::string(o.key) + "=" + o.values);
  return join(keys);
}

void apply_options(const DiffSideSpec& spec, SideSetup& s, const std::string& which) {
  const bool report = spec.kind == Kind::report;
  for (const auto& [key, value] : spec.options) {
    const auto it = std::find_if(kSideOptions.begin(), kSideOptions.end(),
                                 [&](const SideOption& o) { return key == o.key; });
    if (it == kSideOptions.end() || it->kind != spec.kind)
      throw InputError("diff " + which + ": '" + key + "' is not an option of " +
                       (report ? "a report side" : "a profile side") +
                       "; allowed: " + keys_of(spec.kind));
    it->apply(s, value, which);
  }
}

const char* kSideHelp =
    "a profile spec NAME[:key=value,...] (NAME: native, hf-eager, hf-sdpa, hf-peft, megatron, "
    "zero; "
    "keys: model, batch, seq, dtype, optimizer, checkpointing, attention, hf, torch, loop, and "
    "for hf-peft finetune, rank, targets, quant, prepare, for native the first four, over the "
    "common flags) or a "
    "trainmem JSON report FILE[:profile=NAME,run=N]";

}  // namespace

DiffSideSpec parse_diff_side(const std::string& text, const std::string& which) {
  if (text.empty()) throw InputError("diff " + which + ": empty; give " + kSideHelp);
  DiffSideSpec spec;
  auto parse_options = [&](const std::string& list) {
    std::size_t start = 0;
    while (true) {
      const std::size_t comma = list.find(',', start);
      const std::string item =
          list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      const std::size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
        throw InputError("diff " + which + ": '" + item + "' in '" + text +
                         "' is not key=value (a side is " + kSideHelp + ")");
      spec.options.emplace_back(item.substr(0, eq), item.substr(eq + 1));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  };
  const auto names = profile_names();
  const std::size_t colon = text.find(':');
  const std::string head = text.substr(0, colon);
  if (std::find(names.begin(), names.end(), head) != names.end()) {
    spec.kind = Kind::profile;
    spec.name = head;
    if (colon != std::string::npos) parse_options(text.substr(colon + 1));
    return spec;
  }
  spec.kind = Kind::report;
  spec.name = text;
  // FILE:key=value,...: the options follow the last ':' (a path may hold ':' itself, never
  // followed by key=value), unless the whole text names a file.
  const std::size_t last = text.rfind(':');
  if (!exists(text) && last != std::string::npos && last > 0 &&
      text.find('=', last) != std::string::npos) {
    spec.name = text.substr(0, last);
    parse_options(text.substr(last + 1));
  }
  if (!exists(spec.name) && spec.options.empty() && spec.name.find('/') == std::string::npos &&
      spec.name.find('.') == std::string::npos)
    throw InputError("diff " + which + ": '" + text + "' is neither a profile (" + join(names) +
                     ") nor a file; give " + kSideHelp);
  return spec;
}

namespace {

struct DiffFlags {
  CommonFlags common;
  std::string a, b;
  bool all = false;
};

// A profile side: the common flags, the side's options, then the estimate.
diff::Side profile_side(const DiffSideSpec& spec, const std::string& text, const Common& c,
                        const std::string& which) {
  SideSetup s{c.model, c.train, c.hf, "", 0};
  const Profile profile = *parse_profile(spec.name);
  const bool peft = profile == Profile::hf_peft, native = profile == Profile::native;
  try {
    bool quant_given = false;
    for (const auto& kv : spec.options) {
      const std::string& k = kv.first;
      if (profile != Profile::hf_eager && profile != Profile::hf_sdpa &&
          (k == "hf" || k == "torch" || k == "loop"))
        throw InputError(k + "= applies to hf-eager and hf-sdpa only");
      if (!peft && k == "prepare") throw InputError("prepare= applies to hf-peft only");
      if (!peft && !native && (k == "finetune" || k == "rank" || k == "targets" || k == "quant"))
        throw InputError(k + "= applies to hf-peft and native only");
      quant_given = quant_given || k == "quant";
    }
    apply_options(spec, s, which);
    PeftOptions& p = s.hf.peft;
    if (peft && p.finetune == Finetune::full)
      throw InputError("hf-peft needs finetune=lora|qlora (or --finetune lora|qlora)");
    // finetune= alone takes its base as --finetune does: qlora nf4, lora none.
    if ((peft || native) && !quant_given) {
      if (p.finetune == Finetune::qlora && p.quant == Quant::none) p.quant = Quant::nf4;
      if (p.finetune == Finetune::lora) p.quant = Quant::none;
    }
    if (native && p.finetune == Finetune::full)
      for (const auto& kv : spec.options)
        if (kv.first == "rank" || kv.first == "targets" || kv.first == "quant")
          throw InputError(kv.first + "= needs finetune=lora|qlora (or --finetune lora|qlora)");
    if (native && p.finetune != Finetune::full) {
      // trainmem's own LoRA / QLoRA step (docs/native-plan.md, "LoRA", "QLoRA"): its recipe's
      // finetune/quant pairs are hf-peft's (a 4-bit base is qlora, int8 lora's).
      check_hf_options(Profile::hf_peft, s.hf);
      p.apply_to(s.train);
    }
    s.train.validate();
    check_hf_options(profile, s.hf);
    diff::Side side = diff::side_from_estimate(estimate(profile, s.model, s.train, s.hf));
    side.spec = text;
    return side;
  } catch (const InputError& e) {
    throw InputError("diff " + which + " (" + text + "): " + e.what());
  }
}

// A side on its way: parsed, its report read and its run chosen, its profile decided where it
// can be on its own.
struct Pending {
  DiffSideSpec spec;
  std::string text, which;
  std::optional<diff::Report> report;
  std::size_t run = 0;            // index into report->runs
  std::vector<std::string> held;  // the profiles the run holds
  std::string profile;            // empty: not decided yet
};

// A report side's profile: profile=, else --profile, else the report's only analytic profile;
// otherwise decided from the other side (decide_from_other).
Pending pending_side(const std::string& text, const std::string& which,
                     const std::string& flag_profile) {
  Pending p;
  p.spec = parse_diff_side(text, which);
  p.text = text;
  p.which = which;
  if (p.spec.kind == Kind::profile) {
    p.profile = p.spec.name;
    return p;
  }
  SideSetup s;
  apply_options(p.spec, s, which);
  p.report = diff::read_report(p.spec.name, which);
  const nlohmann::json& ro = diff::choose_run(*p.report, s.run, which);
  p.run = static_cast<std::size_t>(&ro - p.report->runs.data());
  p.held = diff::profiles_of(ro);
  p.profile = s.profile.empty() ? flag_profile : s.profile;
  if (p.profile.empty()) {
    std::vector<std::string> analytic;
    for (const auto& h : p.held)
      if (h != "measured") analytic.push_back(h);
    if (analytic.size() == 1) p.profile = analytic.front();
  }
  return p;
}

// An undecided report side takes the other side's profile when its run holds it.
void decide_from_other(Pending& p, const Pending& other) {
  if (!p.profile.empty()) return;
  if (!other.profile.empty() &&
      std::find(p.held.begin(), p.held.end(), other.profile) != p.held.end()) {
    p.profile = other.profile;
    return;
  }
  throw InputError("diff " + p.which + ": " + p.spec.name + " holds " +
                   (p.held.empty() ? std::string("no profiles") : "the profiles " + join(p.held)) +
                   "; choose one with " + p.spec.name + ":profile=NAME or --profile NAME");
}

diff::Side build_side(const Pending& p, const Common& c) {
  if (p.spec.kind == Kind::profile) return profile_side(p.spec, p.text, c, p.which);
  diff::Side side =
      diff::side_from_run_object(p.report->runs[p.run], p.profile, p.which + ": " + p.spec.name);
  side.file = p.spec.name;
  side.spec = p.text;
  return side;
}

int run_diff(const DiffFlags& flags, const CLI::App& cmd) {
  const Common c = resolve_common(flags.common, false, false, /*allow_finetune=*/true);
  std::string flag_profile;
  if (cmd.count("--profile") > 0) {
    if (c.profiles.size() != 1)
      throw InputError(
          "--profile: diff takes one profile name here (the profile read from a "
          "report side that holds several), got '" +
          flags.common.profile + "'");
    flag_profile = c.profiles.front();
  }
  Pending pa = pending_side(flags.a, "A", flag_profile);
  Pending pb = pending_side(flags.b, "B", flag_profile);
  if (pa.spec.kind == Kind::report && pb.spec.kind == Kind::report) {
    std::vector<std::string> ignored;
    for (const char* f : {"--model", "--batch", "--seq", "--dtype", "--optimizer",
                          "--checkpointing", "--attention", "--offload-activations"})
      if (cmd.count(f) > 0) ignored.push_back(f);
    if (!ignored.empty())
      spdlog::warn("{}: ignored, both sides are reports (the flags apply to profile sides)",
                   join(ignored));
  }
  decide_from_other(pa, pb);
  decide_from_other(pb, pa);
  const diff::Side a = build_side(pa, c);
  const diff::Side b = build_side(pb, c);
  const diff::Result r = diff::compare(a, b);

  const auto w = report::make_writer(c.format, stdout_colour(c.output));
  diff::write_report(r, *w, flags.all);
  write_output(c.output, w->str());
  return 0;
}

}  // namespace

Runner register_diff(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "diff",
      "Tensor-by-tensor difference B - A between two analytic profiles or saved JSON reports: "
      "where the extra bytes of one setup go");
  auto flags = std::make_shared<DiffFlags>();
  cmd->add_option("A", flags->a, std::string("The first side: ") + kSideHelp)->required();
  cmd->add_option("B", flags->b, "The second side, as A")->required();
  add_common_flags(*cmd, flags->common);
  cmd->get_option("--profile")
      ->description(
          "The profile read from a report side that holds several (default: the report's only "
          "one, or the other side's profile)")
      ->default_str("");
  cmd->add_flag("--all", flags->all,
                "Also list the tensors that are the same on both sides (text, markdown)");
  cmd->footer(
      "Examples:\n"
      "  trainmem diff native hf-eager --model llama-7b --batch 8 --seq 512 --dtype fp16\n"
      "  trainmem diff hf-eager hf-eager:dtype=fp32\n"
      "  trainmem diff native native:checkpointing=full\n"
      "  trainmem diff hf-sdpa hf-peft:finetune=qlora,targets=all-linear --checkpointing\n"
      "  trainmem diff old.json new.json --profile hf-eager\n"
      "  trainmem diff saved.json:profile=native,run=2 native\n"
      "The common flags apply to profile sides; a side's own key=value options override them.");
  const CLI::App* cmd_ptr = cmd;
  return [flags, cmd_ptr] { return run_diff(*flags, *cmd_ptr); };
}

}  // namespace trainmem::cli
