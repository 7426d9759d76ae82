// `trainmem plan`'s enumeration and cost model (include/trainmem/analytic/plan.hpp; the model and
// what is enumerated are documented in docs/plan.md).
#include "trainmem/analytic/plan.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "trainmem/analytic/analytic.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/lora.hpp"

namespace trainmem {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string str(std::int64_t v) {
  return std::to_string(v);
}

std::string num(double v) {
  std::string s = std::to_string(v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// Ascending; O(sqrt n) divisions.
std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> low, high;
  for (std::int64_t d = 1; d <= n / d; ++d)
    if (n % d == 0) {
      low.push_back(d);
      if (d != n / d) high.push_back(n / d);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

// The structural rules of the enumeration (docs/plan.md): ZeRO shards over the gradient group
// (the dp·cp ranks, `dp` here), so with one such rank only stage 0 is a layout of its own;
// --offload optimizer offloads the ZeRO shard (stage 1 or more) and optimizer+params the ZeRO-3
// parameter shard.
bool enumerated(std::int64_t dp, int zero, Offload offload) {
  if (zero > 0 && dp == 1) return false;
  if (offload == Offload::optimizer && zero < 1) return false;
  if (offload == Offload::optimizer_params && zero != 3) return false;
  return true;
}

// What ParallelConfig::resolve said, with the kind of refusal in front.
std::string refusal(const std::string& message) {
  return (message.find("divisible") != std::string::npos ? "does not divide the model: "
                                                         : "not supported: ") +
         message;
}

bool has_policy(const PlanOptions& o, PlanPolicy::Kind kind) {
  for (const PlanPolicy& p : o.policies)
    if (p.kind == kind) return true;
  return false;
}

void add_unique(std::vector<std::string>& xs, const std::string& x) {
  if (std::find(xs.begin(), xs.end(), x) == xs.end()) xs.push_back(x);
}

// "76GiB", "512MiB", or the bytes: a budget policy's name.
std::string size_text(std::uint64_t bytes) {
  if (bytes > 0 && bytes % (std::uint64_t{1} << 30) == 0)
    return str(std::int64_t(bytes >> 30)) + "GiB";
  if (bytes > 0 && bytes % (std::uint64_t{1} << 20) == 0)
    return str(std::int64_t(bytes >> 20)) + "MiB";
  return std::to_string(bytes);
}

}  // namespace

std::string PlanPolicy::name() const {
  switch (kind) {
    case Kind::none:
      return "none";
    case Kind::selective:
      return "selective";
    case Kind::every:
      return "every:" + str(k);
    case Kind::full:
      return "full";
    case Kind::budget:
      return "budget";
  }
  return "?";
}

bool PlanPolicy::apply(TrainConfig& train, const ModelConfig& model, std::int64_t pp,
                       std::int64_t first, std::uint64_t budget) const {
  train.checkpoint_layers = {};
  switch (kind) {
    case Kind::none:
      train.checkpointing = Checkpointing::none;
      return true;
    case Kind::selective:
      train.checkpointing = Checkpointing::selective;
      return true;
    case Kind::full:
      train.checkpointing = Checkpointing::full;
      return true;
    case Kind::every: {
      // torchtitan's every K-th layer: 0-based K-1, 2K-1, ... (as --checkpointing every:K).
      std::vector<std::int64_t> list;
      for (std::int64_t l = k - 1; l < model.layers; l += k) list.push_back(l);
      if (list.empty() || std::int64_t(list.size()) == model.layers) return false;
      train.checkpointing = Checkpointing::full;
      train.checkpoint_layers = {list, name(), 0};
      return true;
    }
    case Kind::budget: {
      const std::int64_t per_stage = model.layers / pp;
      std::vector<std::int64_t> list;
      for (std::int64_t st = 0; st < pp; ++st)
        for (std::int64_t j = 0; j < std::min(first, per_stage); ++j)
          list.push_back(st * per_stage + j);
      const std::string spec = "budget:" + size_text(budget);
      if (list.empty()) {
        train.checkpointing = Checkpointing::none;
        train.checkpoint_layers = {{}, spec, 0};
      } else {
        train.checkpointing = Checkpointing::full;
        if (std::int64_t(list.size()) == model.layers) list.clear();  // every layer
        train.checkpoint_layers = {list, spec, 0};
      }
      return true;
    }
  }
  return false;
}

std::vector<PlanPolicy> parse_plan_policies(const std::string& text) {
  const std::string allowed =
      "allowed: a comma list of none, selective, every:K (K >= 2), full, budget";
  std::vector<PlanPolicy> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    PlanPolicy p;
    if (item == "none") {
      p.kind = PlanPolicy::Kind::none;
    } else if (item == "selective") {
      p.kind = PlanPolicy::Kind::selective;
    } else if (item == "full") {
      p.kind = PlanPolicy::Kind::full;
    } else if (item == "budget") {
      p.kind = PlanPolicy::Kind::budget;
    } else if (item.rfind("every:", 0) == 0) {
      const std::string k = item.substr(6);
      const bool digits =
          !k.empty() && k.size() <= 9 && k.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || std::stoll(k) < 2)
        throw InputError("--checkpointing " + item +
                         ": K must be an integer >= 2 (every:1 is full); " + allowed);
      p = PlanPolicy::every(std::stoll(k));
    } else {
      throw InputError("--checkpointing: unknown policy '" + item + "' for plan; " + allowed +
                       " (budget: the fewest first layers that fit --gpu-memory, per layout)");
    }
    for (const PlanPolicy& q : out)
      if (q.kind == p.kind && q.k == p.k)
        throw InputError("--checkpointing: '" + item + "' is listed twice; " + allowed);
    out.push_back(p);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string family_name(std::int64_t dp, std::int64_t tp, std::int64_t pp, int zero,
                        std::int64_t cp, std::int64_t ep, std::int64_t etp) {
  return "dp " + str(dp) + " tp " + str(tp) + " pp " + str(pp) + (cp > 1 ? " cp " + str(cp) : "") +
         (ep > 1 ? " ep " + str(ep) : "") + (etp > 1 ? " etp " + str(etp) : "") + " ZeRO-" +
         str(zero);
}

void PlanOptions::validate() const {
  if (gpus < 1 || gpus > kMaxPlanGpus)
    throw InputError("--gpus must be from 1 to " + str(kMaxPlanGpus) + ", got " + str(gpus));
  if (gpu_memory == 0)
    throw InputError("--gpu-memory must be more than 0 bytes (a SIZE such as 80GiB)");
  if (!(margin >= 0.0 && margin < 1.0))
    throw InputError("--margin must be from 0 up to (not including) 1, got " + num(margin));
  if (seq < 2)
    throw InputError("--seq must be >= 2 (the loss predicts the next token), got " + str(seq));
  if (global_batch < 1 || global_batch > kMaxPlanGlobalBatch)
    throw InputError("--global-batch must be from 1 to " + str(kMaxPlanGlobalBatch) +
                     " sequences, got " + str(global_batch));
  if (top < 1) throw InputError("--top must be at least 1");
  if (!(cost.tflops > 0) || !std::isfinite(cost.tflops))
    throw InputError("--tflops must be a positive number of TFLOP/s, got " + num(cost.tflops));
  if (!(cost.link_gbps > 0) || !std::isfinite(cost.link_gbps))
    throw InputError("--link-gbps must be a positive number of Gb/s, got " + num(cost.link_gbps));
  if (!(cost.pcie_gbps > 0) || !std::isfinite(cost.pcie_gbps))
    throw InputError("--pcie-gbps must be a positive number of Gb/s, got " + num(cost.pcie_gbps));
  if (optimizers.empty() || zero_stages.empty() || policies.empty() || attention.empty() ||
      offloads.empty() || activation_offload.empty() || cp_degrees.empty())
    throw InputError("plan: nothing to enumerate (an empty list of choices)");
  for (std::int64_t c : cp_degrees)
    if (c < 1 || c > gpus || gpus % c != 0)
      throw InputError("--cp " + str(c) + ": a context-parallel degree must divide --gpus " +
                       str(gpus));
}

std::uint64_t PlanOptions::budget() const {
  // The bytes kept back, to the nearest byte (80 GiB × 0.05 is 4 GiB, not a byte more).
  const auto kept = static_cast<std::uint64_t>(
      std::llround(static_cast<long double>(gpu_memory) * static_cast<long double>(margin)));
  return gpu_memory - std::min(kept, gpu_memory);
}

StepCost step_cost(const ModelConfig& model, const TrainConfig& train, const ParallelConfig& layout,
                   const CostModel& cost) {
  StepCost c;
  const double P = static_cast<double>(model.param_count());
  const double L = static_cast<double>(model.layers), h = static_cast<double>(model.hidden);
  const double b = static_cast<double>(train.batch), s = static_cast<double>(train.seq);
  const double w = static_cast<double>(dtype_size(train.dtype));
  const double dp = static_cast<double>(layout.dp), tp = static_cast<double>(layout.tp),
               pp = static_cast<double>(layout.pp), cp = static_cast<double>(layout.cp);
  const double M = static_cast<double>(layout.microbatches);
  const double N = dp * tp * pp * cp;
  const double sc = s / cp;         // a rank's rows of each sequence
  const double T = b * M * dp * s;  // tokens per optimizer step (G·s)
  // The fraction of the layers re-run in backward (1 under full, K/L for a per-layer policy).
  const double r = static_cast<double>(train.checkpointed_count(0, model.layers)) / L;
  // Selective recompute re-runs the attention core only: its QKᵀ and PV (r_a = 1), no GEMM of
  // the parameters.
  const double ra = train.checkpointing == Checkpointing::selective ? 1.0 : r;

  // Compute: 6·P·T (forward 2, backward 4), + 2·P·T for the forward re-run under full
  // recompute; attention's QKᵀ and PV, 4·s²·h per layer and sequence forward, ×3 for training,
  // + one forward under recompute. Spread evenly over the N GPUs, stretched by the 1F1B
  // bubble.
  // LoRA (docs/plan.md, "LoRA"): the frozen base has no weight gradient, 2·P·T fewer; the
  // adapters' P_a elements cost as trained weights.
  const double Pa =
      train.lora()
          ? static_cast<double>(lora_trainable_count(model, train.lora_rank, train.lora_targets))
          : 0.0;
  // A mixture of experts (docs/plan.md, "Mixture of experts"): a token runs K of the E experts
  // of each MoE layer, so the FLOPs count the active parameters, P − L_moe·(E − K)·3·h·m.
  const double L_moe = static_cast<double>(model.moe_layer_count());
  const double expert = 3.0 * h * static_cast<double>(model.expert_intermediate);
  const double P_act =
      P - L_moe * static_cast<double>(model.experts - model.experts_per_token) * expert;
  const double base_flops =
      train.lora() ? (4.0 + 2.0 * r) * P + (6.0 + 2.0 * r) * Pa : (6.0 + 2.0 * r) * P_act;
  c.flops_per_gpu = (base_flops * T + (12.0 + 4.0 * ra) * L * h * s * T) / N;
  c.bubble = (pp - 1.0) / M;
  c.compute_seconds = c.flops_per_gpu / (cost.tflops * 1e12) * (1.0 + c.bubble);

  // Data parallelism over the stage's TP shard of the parameters (even split); the gradient
  // group is the dp·cp ranks that hold the same parameters.
  // What the gradient group reduces and ZeRO shards: every parameter, or the adapters.
  // A mixture of experts: the experts' E/ep per rank reduce over the expert-data-parallel ranks
  // (edp = dp·tp·cp/ep: whole experts on every tensor-parallel rank), in a weighted share
  // f·P_local (the rest over dp·cp as before).
  const double P_exp = L_moe * static_cast<double>(model.experts) * expert;
  const double ep = static_cast<double>(layout.ep), etp = static_cast<double>(layout.etp),
               edp = dp * tp * cp / (ep * etp);
  const double P_local = (train.lora() ? Pa : P - P_exp) / (tp * pp);
  const double f = (dp * cp - 1.0) / (dp * cp);
  // (each rank holds E/ep experts of m/etp columns)
  const double fe_P = (edp - 1.0) / edp * P_exp / (ep * etp * pp);  // 0 for a dense model
  switch (layout.zero) {
    case 0:  // one all-reduce of the accumulated gradients
    case 1:  // reduce-scatter + all-gather of the updated parameters: the same volume
      c.dp_bytes = 2.0 * f * P_local * w + 2.0 * fe_P * w;
      break;
    case 2:  // a reduce-scatter per micro-batch (the shard cannot hold unreduced gradients)
      c.dp_bytes = (M + 1.0) * f * P_local * w + (M + 1.0) * fe_P * w;
      break;
    default:  // 3: + the parameters gathered for every forward and every backward
      c.dp_bytes = 3.0 * M * f * P_local * w;
      // FSDP2's SHARD_GRAD_OP: a layer gathered in forward is kept for its backward
      if (layout.per_parameter() && !layout.reshard_after_forward)
        c.dp_bytes = 2.0 * M * f * P_local * w;
      // LoRA: the gathers carry every parameter, the frozen base's too; the reduce-scatters
      // the adapters' gradients alone.
      if (train.lora()) c.dp_bytes = M * f * P_local * w + 2.0 * M * f * (P + Pa) / (tp * pp) * w;
      // A mixture of experts: the rank's experts gathered over the expert-data-parallel ranks
      // for every forward and backward, their gradients reduce-scattered there (0 when dense).
      c.dp_bytes += 3.0 * M * fe_P * w;
      break;
  }
  // Tensor parallelism: 2 all-reduces per layer forward, 2 backward (+2 in the recompute),
  // of b·s·h each; sequence parallelism replaces each by reduce-scatter + all-gather, the same
  // volume. A MoE layer has the attention's alone (each rank routes its own s/tp rows), and a
  // dense one's when it has a shared expert (split like the dense MLP).
  const double moe_tp = model.shared_expert_intermediate > 0 ? 4.0 + 2.0 * r : 2.0 + r;
  if (layout.tp > 1)
    c.tp_bytes = M * ((L - L_moe) * (4.0 + 2.0 * r) + L_moe * moe_tp) / pp * 2.0 * (tp - 1.0) / tp *
                 b * sc * h * w;
  // Pipeline: an interior stage sends b·s·h activations forward and b·s·h gradients back per
  // micro-batch.
  if (layout.pp > 1) c.pp_bytes = 2.0 * M * b * sc * h * w;
  // Expert parallelism: each MoE layer's all-to-alls, dispatch and combine in forward, their
  // gradients in backward, again in a recompute (r), each sending the (ep − 1)/ep of the rank's
  // b·(s/cp)·K rows that go to other ranks (balanced routing; b·(s/(cp·tp))·K under tp with
  // sequence parallelism: each tensor-parallel rank routes its own rows).
  // Expert tensor parallelism: the A ≈ b·(s/(cp·tp))·K rows a rank receives gathered over the
  // etp group ((etp − 1)·A rows in) and the partial outputs reduce-scattered back ((etp − 1)·A
  // out), in forward, backward and a recompute alike.
  const double rows = b * (sc / tp) * static_cast<double>(model.experts_per_token);
  if (layout.ep > 1)
    c.ep_bytes = M * (L_moe / pp) * (4.0 + 2.0 * r) * (ep - 1.0) / ep * rows * h * w;
  if (layout.etp > 1) c.ep_bytes += M * (L_moe / pp) * (4.0 + 2.0 * r) * (etp - 1.0) * rows * h * w;
  // Context parallelism: per layer, the forward's ring passes cp − 1 key/value blocks
  // (2·b·(s/cp)·(k/tp)·d of D each) on, again in a recompute (r); the backward's cp − 1 blocks
  // and cp fp32 gradient blocks of the same shape.
  if (layout.cp > 1) {
    const double kd = static_cast<double>(model.kv_heads * model.head_dim()) / tp;
    const double block = 2.0 * b * sc * kd;
    c.cp_bytes = M * (L / pp) * ((2.0 + r) * (cp - 1.0) * block * w + cp * block * 4.0);
  }
  // Offload: gradient shards down (once per step under ZeRO-1, per micro-batch under 2 and 3),
  // updated parameter shards up; optimizer+params fetches the parameter shard for every
  // forward and backward.
  const double shard = P_local / (dp * cp);
  if (layout.offload != Offload::none) {
    const double grads = layout.zero == 1 ? 1.0 : M;
    c.pcie_bytes = (grads + 1.0) * shard * w;
    if (layout.offload == Offload::optimizer_params) c.pcie_bytes += 2.0 * M * shard * w;
  }
  // Activation offload: each micro-batch's offload sets go to the host and come back, the rank's
  // transfer bytes per micro-batch, M times.
  if (train.offload_activations)
    c.pcie_bytes +=
        M * static_cast<double>(
                estimate_layout(model, train, layout).ranks.front().est.offload_transfer_bytes);
  const double link = cost.link_gbps * 1e9 / 8.0, pcie = cost.pcie_gbps * 1e9 / 8.0;
  c.communication_seconds = (c.dp_bytes + c.tp_bytes + c.pp_bytes + c.cp_bytes + c.ep_bytes) / link;
  c.pcie_seconds = c.pcie_bytes / pcie;
  c.total_seconds = c.compute_seconds + c.communication_seconds + c.pcie_seconds;
  return c;
}

PlanResult plan(const ModelConfig& model, const PlanOptions& options,
                const LayoutEstimator& estimator) {
  const auto t_start = Clock::now();
  options.validate();
  const std::int64_t N = options.gpus, G = options.global_batch;
  PlanResult res;
  res.options = options;
  res.model = model;
  res.budget = options.budget();

  TrainConfig base;
  base.batch = 1;
  base.seq = options.seq;
  base.dtype = options.dtype;
  base.optimizer = options.optimizers.front();
  base.lora_rank = options.finetune.lora_rank;
  base.lora_targets = options.finetune.lora_targets;
  base.lora_alpha = options.finetune.lora_alpha;
  base.lora_dropout = options.finetune.lora_dropout;
  base.quant = options.finetune.quant;
  base.double_quant = options.finetune.double_quant;
  base.quant_blocksize = options.finetune.quant_blocksize;
  base.validate();

  // The (dp, tp, pp, cp) of N GPUs: context-parallel degree (as listed), then pipeline depth,
  // then tensor width, ascending; for a mixture of experts each expert-parallel degree ep that
  // divides the experts and the stage's dp·tp·cp ranks (tp > 1 with sequence parallelism:
  // check_moe_layout), ascending.
  struct Triple {
    std::int64_t dp, tp, pp, cp, ep = 1, etp = 1;
  };
  std::vector<Triple> triples;
  for (std::int64_t cp : options.cp_degrees) {
    if (N % cp != 0) continue;
    if (options.hf_step()) {  // FSDP2 over data parallelism alone
      if (cp == 1) triples.push_back({N, 1, 1, 1});
      continue;
    }
    for (std::int64_t pp : divisors(N / cp))
      for (std::int64_t tp : divisors(N / (cp * pp))) {
        const std::int64_t dp = N / (tp * pp * cp);
        triples.push_back({dp, tp, pp, cp});
        // A mixture of experts: every ep dividing E and etp dividing the experts' width whose
        // product divides the stage's dp·tp·cp slots.
        if (model.moe())
          for (std::int64_t ep : divisors(model.experts))
            for (std::int64_t etp : divisors(model.expert_intermediate))
              if (ep * etp > 1 && (dp * tp * cp) % (ep * etp) == 0)
                triples.push_back({dp, tp, pp, cp, ep, etp});
      }
  }

  // G must be divisible by a data-parallel degree the model allows (dp·tp·pp = N).
  bool divisible = false;
  std::vector<std::int64_t> allowed_dp;
  for (const Triple& t : triples) {
    ParallelConfig p;
    p.world = N;
    p.dp = t.dp;
    p.tp = t.tp;
    p.pp = t.pp;
    p.cp = t.cp;
    p.ep = t.ep;
    p.etp = t.etp;
    TrainConfig flash = base;  // context parallelism needs flash attention
    flash.attention = Attention::flash;
    // Without sequence parallelism, or with it (a MoE under tp needs it) as the candidates are.
    bool allowed = false;
    for (bool sp : t.tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
      p.sp = sp;
      try {
        p.resolve(true, model, flash);
        allowed = true;
        break;
      } catch (const InputError&) {
      }
    }
    if (!allowed) continue;
    if (G % t.dp == 0) {
      divisible = true;
      break;
    }
    if (std::find(allowed_dp.begin(), allowed_dp.end(), t.dp) == allowed_dp.end())
      allowed_dp.push_back(t.dp);
  }
  if (!divisible) {
    std::sort(allowed_dp.begin(), allowed_dp.end());
    std::string list;
    for (std::int64_t d : allowed_dp) list += (list.empty() ? "" : ", ") + str(d);
    throw InputError("--global-batch " + str(G) + ": not divisible by any data-parallel degree " +
                     model.name + " allows on --gpus " + str(N) + " (" + list +
                     "); the global batch is b·M·dp sequences, so give a multiple of one of them");
  }

  // The estimator, counted and timed; an estimate that throws does not fit.
  auto worst_total = [&](const TrainConfig& t, const ParallelConfig& p,
                         std::string* error) -> std::optional<std::uint64_t> {
    const auto t0 = Clock::now();
    ++res.estimates;
    try {
      const LayoutEstimate e = estimator(model, t, p, options.overheads);
      res.estimate_seconds += seconds_since(t0);
      if (options.host_memory > 0) {
        std::uint64_t host = 0;
        for (const auto& r : e.ranks) host = std::max(host, r.host_bytes);
        if (host > options.host_memory) {
          if (error)
            *error = "host memory: a rank holds " + std::to_string(host) +
                     " bytes on the host, more than --host-memory " +
                     std::to_string(options.host_memory);
          return std::nullopt;
        }
      }
      return e.worst_total();
    } catch (const InputError& e) {
      res.estimate_seconds += seconds_since(t0);
      if (error) *error = e.what();
      return std::nullopt;
    }
  };

  std::vector<PlanCandidate> fitting;
  for (const Triple& tr : triples) {
    // The HF step per rank models one micro-batch: b = G/dp alone.
    const std::vector<std::int64_t> bs = G % tr.dp != 0      ? std::vector<std::int64_t>{}
                                         : options.hf_step() ? std::vector<std::int64_t>{G / tr.dp}
                                                             : divisors(G / tr.dp);
    for (int zero : options.zero_stages) {
      RejectedFamily fam;
      fam.dp = tr.dp;
      fam.tp = tr.tp;
      fam.pp = tr.pp;
      fam.cp = tr.cp;
      fam.ep = tr.ep;
      fam.etp = tr.etp;
      fam.zero = zero;
      bool family_fits = false, enumerated_any = false;
      // ZeRO-3 under per-parameter sharding (FSDP2): no offload (CPUOffloadPolicy unmodelled).
      // Stage 2 under per-parameter sharding is FSDP2's SHARD_GRAD_OP: the parameters sharded
      // at rest, each layer kept gathered from its forward to its backward
      // (reshard_after_forward=False), as the command line reads --fsdp2 --zero 2.
      const bool fsdp2 = (zero == 3 || zero == 2) && options.sharding == Sharding::per_parameter;
      for (Offload off : options.offloads) {
        if (!enumerated(tr.dp * tr.cp, zero, off)) continue;
        if (fsdp2 && off != Offload::none) continue;
        for (bool sp : tr.tp > 1 ? std::vector<bool>{true, false} : std::vector<bool>{false})
          for (const PlanPolicy& pol : options.policies)
            for (bool off_act : options.activation_offload)
              for (Attention at : options.attention)
                for (Optimizer opt : options.optimizers) {
                  if (off_act && tr.pp > 1) continue;    // offload runs without pipelining
                  if (off_act && fsdp2) continue;        // not modelled beside FSDP2's path
                  if (off_act && base.lora()) continue;  // not modelled with LoRA
                  // Selective with flash is the plain step (no s² tensor to drop).
                  if (pol.kind == PlanPolicy::Kind::selective && at != Attention::eager) continue;
                  // Ring attention is flash attention's (ParallelConfig::resolve).
                  if (tr.cp > 1 && at != Attention::flash) continue;
                  TrainConfig train = base;
                  const bool budget_policy = pol.kind == PlanPolicy::Kind::budget;
                  const std::int64_t per_stage = model.layers / tr.pp;
                  // budget: checked at every layer checkpointed (the least memory), then the
                  // fewest first layers per stage for each fitting b.
                  if (!pol.apply(train, model, tr.pp, per_stage, res.budget)) continue;
                  enumerated_any = true;
                  train.attention = at;
                  train.optimizer = opt;
                  train.offload_activations = off_act;
                  ParallelConfig layout;
                  layout.world = N;
                  layout.dp = tr.dp;
                  layout.tp = tr.tp;
                  layout.pp = tr.pp;
                  layout.cp = tr.cp;
                  layout.ep = tr.ep;
                  layout.etp = tr.etp;
                  layout.zero = fsdp2 ? 3 : zero;
                  layout.sharding = fsdp2 ? Sharding::per_parameter : Sharding::flat;
                  layout.reshard_after_forward = !(fsdp2 && zero == 2);
                  layout.sp = sp;
                  layout.offload = off;
                  // The micro-batch sizes the layout checks accept, ascending. The checks depend
                  // on b only through M = G / (dp·b) and its bound: the rest is checked once per
                  // setting (with M = 1), so the loop over b costs no exceptions.
                  std::vector<std::int64_t> valid;
                  res.enumerated += bs.size();
                  fam.layouts += bs.size();
                  try {
                    ParallelConfig p = layout;
                    p.microbatches = 1;
                    train.batch = bs.empty() ? 1 : bs.front();
                    p.resolve(true, model, train);
                  } catch (const InputError& e) {
                    res.invalid += bs.size();
                    fam.invalid += bs.size();
                    if (!bs.empty()) add_unique(fam.messages, refusal(e.what()));
                    continue;
                  }
                  for (std::int64_t b : bs) {
                    if (G / (tr.dp * b) <= kMaxMicrobatches) {
                      valid.push_back(b);
                      continue;
                    }
                    ++res.invalid;
                    ++fam.invalid;
                    add_unique(fam.messages, "not supported: more than " + str(kMaxMicrobatches) +
                                                 " micro-batches per step (--microbatches' bound)");
                  }
                  if (valid.empty()) continue;
                  auto at_b = [&](std::int64_t b, std::int64_t first) {
                    train.batch = b;
                    if (budget_policy) pol.apply(train, model, tr.pp, first, res.budget);
                    layout.microbatches = G / (tr.dp * b);
                    return std::pair<TrainConfig, ParallelConfig>(train, layout);
                  };
                  // Memory is monotone in b (activations grow with b·min(pp, M) = min(pp·b,
                  // G/dp)): the smallest b decides whether anything of this setting fits, and a
                  // binary search finds the largest b that does.
                  std::string error;
                  auto fits = [&](std::int64_t b, std::int64_t first,
                                  std::optional<std::uint64_t>* total) {
                    const auto [t, p] = at_b(b, first);
                    const auto w = worst_total(t, p, &error);
                    if (total) *total = w;
                    return w && *w <= res.budget;
                  };
                  std::optional<std::uint64_t> smallest;
                  if (!fits(valid.front(), per_stage, &smallest)) {
                    res.too_big += valid.size();
                    if (smallest && (!fam.smallest || *smallest < fam.smallest_worst_total)) {
                      const auto [t, p] = at_b(valid.front(), per_stage);
                      fam.smallest_worst_total = *smallest;
                      fam.smallest = PlanCandidate{p, t, step_cost(model, t, p, options.cost), {}};
                    }
                    if (!smallest)
                      add_unique(fam.messages, error.rfind("host memory", 0) == 0
                                                   ? "does not fit --host-memory"
                                                   : "the estimate failed: " + error);
                    continue;
                  }
                  std::size_t lo = 0, hi = valid.size() - 1;
                  while (lo < hi) {
                    const std::size_t mid = (lo + hi + 1) / 2;
                    if (fits(valid[mid], per_stage, nullptr))
                      lo = mid;
                    else
                      hi = mid - 1;
                  }
                  family_fits = true;
                  res.fitting += lo + 1;
                  res.too_big += valid.size() - 1 - lo;
                  for (std::size_t k = 0; k <= lo; ++k) {
                    std::int64_t first = per_stage;
                    if (budget_policy) {
                      // The fewest first layers that fit (memory falls as layers are
                      // checkpointed); none and full themselves are their own policies.
                      std::int64_t a = 0, z = per_stage;
                      while (a < z) {
                        const std::int64_t mid = (a + z) / 2;
                        if (fits(valid[k], mid, nullptr))
                          z = mid;
                        else
                          a = mid + 1;
                      }
                      first = a;
                      if ((first == 0 && has_policy(options, PlanPolicy::Kind::none)) ||
                          (first == per_stage && has_policy(options, PlanPolicy::Kind::full))) {
                        --res.fitting;  // the same layout as that policy's
                        ++res.same_as_none_or_full;
                        continue;
                      }
                    }
                    const auto [t, p] = at_b(valid[k], first);
                    fitting.push_back({p, t, step_cost(model, t, p, options.cost), {}});
                  }
                }
      }
      if (!enumerated_any) continue;
      if (bs.empty())
        add_unique(fam.messages, "does not divide the global batch: --global-batch " + str(G) +
                                     " is not divisible by dp " + str(tr.dp));
      if (!family_fits) res.rejected.push_back(std::move(fam));
    }
  }

  // Fastest first; equal times go to the larger micro-batch, then to the enumeration order.
  std::stable_sort(fitting.begin(), fitting.end(),
                   [](const PlanCandidate& a, const PlanCandidate& b) {
                     if (a.cost.total_seconds != b.cost.total_seconds)
                       return a.cost.total_seconds < b.cost.total_seconds;
                     return a.train.batch > b.train.batch;
                   });
  if (fitting.size() > options.top) fitting.resize(options.top);
  for (PlanCandidate& c : fitting) {
    const auto t0 = Clock::now();
    ++res.estimates;
    c.memory = estimator(model, c.train, c.layout, options.overheads);
    res.estimate_seconds += seconds_since(t0);
  }
  res.candidates = std::move(fitting);
  res.total_seconds = seconds_since(t_start);
  return res;
}

}  // namespace trainmem
