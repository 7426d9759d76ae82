// The parallel layout: names, parsing and the checks that a layout divides the model
// (include/trainmem/base/parallel.hpp; the rules are explained in docs/distributed.md).
#include "trainmem/base/parallel.hpp"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "trainmem/base/error.hpp"

namespace trainmem {

const char* offload_name(Offload o) {
  switch (o) {
    case Offload::none:
      return "none";
    case Offload::optimizer:
      return "optimizer";
    case Offload::optimizer_params:
      return "optimizer+params";
  }
  return "?";
}

std::optional<Offload> parse_offload(const std::string& s) {
  for (Offload o : {Offload::none, Offload::optimizer, Offload::optimizer_params})
    if (s == offload_name(o)) return o;
  return std::nullopt;
}

const char* sharding_name(Sharding s) {
  return s == Sharding::per_parameter ? "per-parameter" : "flat";
}

std::optional<Sharding> parse_sharding(const std::string& s) {
  for (Sharding v : {Sharding::flat, Sharding::per_parameter})
    if (s == sharding_name(v)) return v;
  return std::nullopt;
}

std::uint64_t shard_chunk_rows(std::uint64_t rows, std::uint64_t n) {
  return rows / n + (rows % n != 0 ? 1 : 0);
}

std::uint64_t shard_owned_rows(std::uint64_t rows, std::uint64_t n, std::uint64_t k) {
  const std::uint64_t c = shard_chunk_rows(rows, n);
  // k·c > rows exactly when rank k starts past the last row (k < n, so k·c < rows + n).
  return k * c >= rows ? 0 : std::min(c, rows - k * c);
}

std::optional<int> parse_zero(const std::string& s) {
  if (s == "0" || s == "NO_SHARD") return 0;
  if (s == "1") return 1;
  if (s == "2" || s == "SHARD_GRAD_OP") return 2;
  if (s == "3" || s == "FULL_SHARD") return 3;
  return std::nullopt;
}

namespace {

std::string str(std::int64_t v) {
  return std::to_string(v);
}

// `what` (named by its config.json field) must be divisible by --tp.
void check_tp_divides(std::int64_t value, const char* field, std::int64_t tp) {
  if (value % tp != 0)
    throw InputError("--tp " + str(tp) + ": the model's " + field + " (" + str(value) +
                     ") is not divisible by it; tensor parallelism splits " + field +
                     " evenly over the ranks, so --tp must divide it");
}

}  // namespace

void ParallelConfig::resolve(bool dp_given, const ModelConfig& model, const TrainConfig& train) {
  if (world < 1) throw InputError("--world-size must be at least 1, got " + str(world));
  if (tp < 1) throw InputError("--tp must be at least 1, got " + str(tp));
  if (pp < 1) throw InputError("--pp must be at least 1, got " + str(pp));
  if (cp < 1) throw InputError("--cp must be at least 1, got " + str(cp));
  if (ep < 1) throw InputError("--ep must be at least 1, got " + str(ep));
  if (etp < 1) throw InputError("--etp must be at least 1, got " + str(etp));
  // The product of the degrees, or nullopt past 64 bits (then it exceeds any world size).
  const auto mul = [](std::optional<std::int64_t> x,
                      std::int64_t y) -> std::optional<std::int64_t> {
    if (!x || *x > std::numeric_limits<std::int64_t>::max() / y) return std::nullopt;
    return *x * y;
  };
  const std::optional<std::int64_t> tpc = mul(mul(mul(1, tp), pp), cp);
  const std::string cp_text = cp > 1 ? " × --cp" : "";
  const auto text = [](std::optional<std::int64_t> v) {
    return v ? str(*v) : std::string("more than 2^63");
  };
  if (dp_given) {
    if (dp < 1) throw InputError("--dp must be at least 1, got " + str(dp));
    const std::optional<std::int64_t> all = mul(tpc, dp);
    if (!all || *all != world)
      throw InputError("--world-size " + str(world) + " must equal --dp × --tp × --pp" + cp_text +
                       " = " + str(dp) + " × " + str(tp) + " × " + str(pp) +
                       (cp > 1 ? " × " + str(cp) : "") + " = " + text(all));
  } else {
    if (!tpc || world % *tpc != 0)
      throw InputError("--world-size " + str(world) + " is not divisible by --tp × --pp" + cp_text +
                       " = " + text(tpc) + "; the data-parallel degree is N / (tp·pp" +
                       (cp > 1 ? "·cp)" : ")"));
    dp = world / *tpc;
  }
  if (zero < 0 || zero > 3) throw InputError("--zero must be 0, 1, 2 or 3, got " + str(zero));
  // The trace walks every micro-batch of the schedule: the bound keeps its run time bounded.
  if (microbatches < 1 || microbatches > kMaxMicrobatches)
    throw InputError("--microbatches must be from 1 to " + str(kMaxMicrobatches) + ", got " +
                     str(microbatches));
  if (prefetch < 0) throw InputError("--prefetch must be 0 or more, got " + str(prefetch));
  if (reduce_bucket == 0) throw InputError("--reduce-bucket must be at least 1 element");
  if (tp > 1) {
    check_tp_divides(model.heads, "num_attention_heads", tp);
    check_tp_divides(model.kv_heads, "num_key_value_heads", tp);
    check_tp_divides(model.intermediate, "intermediate_size", tp);
    check_tp_divides(model.vocab, "vocab_size", tp);
    // Qwen2-MoE's shared expert: a dense SwiGLU split like the MLP (gate/up by rows, down by
    // columns).
    if (model.moe() && model.shared_expert_intermediate > 0)
      check_tp_divides(model.shared_expert_intermediate, "shared_expert_intermediate_size", tp);
  }
  if (model.layers % pp != 0)
    throw InputError("--pp " + str(pp) + ": the model's num_hidden_layers (" + str(model.layers) +
                     ") is not divisible by it; every stage holds the same number of layers");
  if (sp && tp == 1)
    throw InputError(
        "--sp needs --tp 2 or more: sequence parallelism shards the sequence "
        "inside the tensor-parallel group");
  if (sp && cp == 1 && train.seq % tp != 0)
    throw InputError("--sp with --tp " + str(tp) + ": --seq " + str(train.seq) +
                     " must be divisible by --tp (each rank keeps s/tp rows)");
  if (zero >= 2 && pp > 1)
    throw InputError("--zero " + str(zero) + " with --pp " + str(pp) +
                     ": pipeline parallelism is supported with --zero 0 or 1 only (as "
                     "DeepSpeed's pipeline engine)");
  if (zero > 0 && dp * cp == 1)
    throw InputError("--zero " + str(zero) +
                     " needs data parallelism (--dp 2 or more, or --cp 2 or more): ZeRO shards "
                     "over the data- and context-parallel ranks, and here dp·cp = 1");
  if (cp > 1) {
    // Load-balanced chunks (Megatron): the sequence in 2·cp chunks, rank r holding chunks r and
    // 2·cp-1-r, so that every rank has the same causal work.
    // (cp divides the world size here, so 2·cp overflows only past 2^62: tested without it.)
    if (train.seq % cp != 0 || (train.seq / cp) % 2 != 0)
      throw InputError("--cp " + str(cp) + ": --seq " + str(train.seq) +
                       " must be divisible by 2·cp" +
                       (cp <= (std::int64_t{1} << 61) ? " = " + str(2 * cp) : std::string()) +
                       " (each rank holds two chunks of s/(2·cp) tokens, load-balanced for the "
                       "causal mask)");
    if (sp && (train.seq / cp) % tp != 0)
      throw InputError("--sp with --cp " + str(cp) + " and --tp " + str(tp) + ": --seq " +
                       str(train.seq) + " / cp must be divisible by --tp (each rank keeps " +
                       "s/(cp·tp) rows)");
    if (train.attention != Attention::flash)
      throw InputError("--cp " + str(cp) +
                       " needs --attention flash: ring attention exchanges key/value blocks and "
                       "merges their outputs by log-sum-exp, as flash attention does (an eager "
                       "(s/cp, s) score matrix is not modelled)");
  }
  if (offload == Offload::optimizer && zero < 1)
    throw InputError(
        "--offload optimizer needs --zero 1, 2 or 3 (the offloaded optimizer "
        "states are the rank's shard)");
  if (offload == Offload::optimizer_params && zero != 3)
    throw InputError(
        "--offload optimizer+params needs --zero 3 (only ZeRO-3 shards the "
        "parameters)");
  if (offload != Offload::none && train.optimizer != Optimizer::adamw &&
      train.optimizer != Optimizer::sgd)
    throw InputError("--offload " + std::string(offload_name(offload)) +
                     " needs --optimizer adamw or sgd");
  if (pp > 1 && train.offload_activations)
    throw InputError(
        "--offload-activations with --pp " + str(pp) +
        ": activation offload is modelled without pipeline parallelism (one stage per rank "
        "and one micro-batch in flight); use --pp 1");
  if (world > 1 && bnb_optimizer(train.optimizer))
    throw InputError(std::string("--optimizer ") + optimizer_name(train.optimizer) +
                     ": the sharded step shards AdamW's and SGD's fp32 states; bitsandbytes' "
                     "optimizers with --world-size above 1 are not modelled yet");
  if (world > 1 && train.optimizer == Optimizer::lomo)
    throw InputError(
        "--optimizer lomo: the sharded step supports adamw and sgd; LOMO with "
        "--world-size above 1 is not modelled");
  if (!reshard_after_forward && !per_parameter())
    throw InputError(
        "reshard_after_forward=False is FSDP2's (--fsdp2 --zero SHARD_GRAD_OP); the flat "
        "vector's ZeRO-2 keeps the parameters whole instead");
  if (per_parameter()) {
    if (zero != 3)
      throw InputError("--sharding per-parameter with --zero " + str(zero) +
                       ": per-parameter sharding is FSDP2's fully_shard, which shards the "
                       "parameters too; it needs --zero 3 (FULL_SHARD) (--fsdp2 sets both)");
    if (offload != Offload::none)
      throw InputError("--sharding per-parameter with --offload " +
                       std::string(offload_name(offload)) +
                       ": FSDP2's CPUOffloadPolicy is not modelled yet; use --offload none");
    if (train.lora())
      throw InputError(
          "--sharding per-parameter with --finetune: LoRA under FSDP2 is not modelled yet; "
          "LoRA per rank shards as DeepSpeed does (--sharding flat)");
    if (train.offload_activations)
      throw InputError(
          "--sharding per-parameter with --offload-activations: activation offload beside "
          "FSDP2's gradient path is not modelled yet; use --sharding flat");
  }
  check_lora_layout(*this, train);
  check_moe_layout(*this, model, train);
}

void check_moe_layout(const ParallelConfig& p, const ModelConfig& m, const TrainConfig& t) {
  const bool expert_flags = p.ep > 1 || p.etp > 1;
  const std::string flag = p.ep > 1 ? "--ep " + str(p.ep) : "--etp " + str(p.etp);
  if (expert_flags && !m.moe())
    throw InputError(flag + ": " + m.name +
                     " is not a mixture of experts (it has no routed experts to place); expert "
                     "parallelism needs a MoE model (model_type mixtral, qwen2_moe, qwen3_moe)");
  if (!m.moe()) return;
  const std::string expert_key = m.family == "mixtral" ? "num_local_experts" : "num_experts";
  if (m.experts % p.ep != 0)
    throw InputError("--ep " + str(p.ep) + ": the model's " + expert_key + " (" + str(m.experts) +
                     ") is not divisible by it; expert parallelism places E/ep whole experts on "
                     "each rank");
  const std::string width_key =
      m.family == "mixtral" ? "intermediate_size" : "moe_intermediate_size";
  if (m.expert_intermediate % p.etp != 0)
    throw InputError("--etp " + str(p.etp) + ": the model's " + width_key + " (" +
                     str(m.expert_intermediate) +
                     ") is not divisible by it; expert tensor parallelism splits each expert's "
                     "width evenly");
  // dp·tp·cp is at most the world size (resolve), so the products below stay in 64 bits.
  const std::int64_t stage_ranks = p.dp * p.tp * p.cp;
  if (expert_flags &&
      (p.ep > stage_ranks || p.etp > stage_ranks || stage_ranks % (p.ep * p.etp) != 0))
    throw InputError(
        "--ep " + str(p.ep) + " × --etp " + str(p.etp) +
        (p.ep <= stage_ranks && p.etp <= stage_ranks ? " = " + str(p.ep * p.etp) : std::string()) +
        " does not divide the " + str(stage_ranks) + " ranks of a pipeline stage (--world-size " +
        str(p.world) + " / --pp " + str(p.pp) +
        " = dp·tp·cp); the expert-data-parallel degree is dp·tp·cp/(ep·etp)");
  if (!p.distributed()) return;
  const std::string what = " with a mixture of experts (" + m.name + ")";
  auto not_yet = [&](const std::string& flags, const std::string& why) {
    throw InputError(
        flags + what + ": " + why +
        " is not modelled yet; the per-rank step models "
        "a MoE model with data, pipeline, context, tensor (with --sp), expert (--ep) and expert "
        "tensor (--etp) parallelism, ZeRO 0-3 (flat) and --offload (docs/distributed.md, \"Mixture "
        "of experts "
        "per "
        "rank\")");
  };
  if (p.tp > 1 && !p.sp)
    throw InputError("--tp " + str(p.tp) + what +
                     " needs --sp: each tensor-parallel rank routes its own s/tp rows (Megatron: "
                     "\"When using expert parallelism and tensor parallelism, sequence "
                     "parallelism must be used\")");
  if (p.per_parameter())
    not_yet("--sharding per-parameter (--fsdp2)",
            "FSDP2 of the experts (a fully_shard of their own over the expert-data-parallel "
            "mesh, as torchtitan's apply_fsdp; use --zero 3, flat)");
  if (m.output_router_logits && (p.pp > 1 || p.tp > 1 || p.cp > 1))
    not_yet(
        "output_router_logits with --pp " + str(p.pp) + " --tp " + str(p.tp) + " --cp " + str(p.cp),
        "the load-balancing loss of a rank's part of a model or sequence (pipeline stages "
        "hold different layers' counts; Megatron sums the counts over the tp·cp group; over "
        "each rank's own tokens, as HF under DDP, it is modelled at pp = tp = cp = 1)");
}

void check_lora_layout(const ParallelConfig& p, const TrainConfig& train) {
  if (!p.distributed() || !train.lora()) return;
  const std::string ft = train.quant4()   ? "--finetune qlora"
                         : train.quant8() ? "--finetune lora --quant int8"
                                          : "--finetune lora";
  if (train.quantized() && p.tp > 1)
    throw InputError(ft + " with --tp " + str(p.tp) +
                     ": each rank would quantize its own slice of a weight, in blocks (rows) that "
                     "are not the whole weight's; a quantized base per rank is modelled with dp, "
                     "pp and cp (--tp 1)");
  if (p.zero == 3 && train.quantized())
    throw InputError(ft +
                     " with --zero 3: a quantized base is stored whole on every rank; ZeRO-3 "
                     "with LoRA is modelled on a 16-bit base (--finetune lora)");
  if (p.zero == 3 && p.offload == Offload::optimizer_params)
    throw InputError(ft +
                     " with --offload optimizer+params: the frozen base's shard stays on the "
                     "device, which is not modelled; use --offload optimizer");
  if (p.sp)
    throw InputError(ft +
                     " with --sp: the adapters of o_proj and down_proj add their (b, s, r) rows "
                     "to the sequence-split residual, which is not modelled; use --tp without "
                     "--sp");
  if (p.tp > 1 && train.lora_dropped())
    throw InputError("--lora-dropout with --tp " + str(p.tp) +
                     ": every tensor-parallel rank would draw its own mask of a shared input; "
                     "LoRA dropout under tensor parallelism is not modelled");
}

std::string ParallelConfig::describe() const {
  std::string out = "dp " + str(dp) + " × tp " + str(tp) + " × pp " + str(pp);
  if (cp > 1) out += " × cp " + str(cp);
  if (ep > 1 || etp > 1)
    out += " × ep " + str(ep) + " × etp " + str(etp) + " (edp " + str(edp()) + ")";
  out += ", ZeRO-" + str(zero);
  if (per_parameter())
    out += reshard_after_forward ? " per-parameter (FSDP2)"
                                 : " per-parameter (FSDP2, reshard_after_forward=False)";
  if (sp) out += ", sp";
  if (pp > 1) out += ", M " + str(microbatches);
  if (offload != Offload::none) out += ", offload " + std::string(offload_name(offload));
  return out;
}

}  // namespace trainmem
