// The published distributed-memory estimators as reference profiles (include/trainmem/
// dist_refs.hpp, docs/distributed-references.md). Each function follows its source's Python
// expression by expression, in the same order, so that the doubles here equal the floats there:
//   * Python int arithmetic is exact: integer sub-expressions are computed with checked 64-bit
//     arithmetic and converted to double where Python would mix them with a float (both round
//     to nearest, so the conversion agrees).
//   * int / int in Python is the correctly rounded quotient; here both operands are below 2^53
//     for any model that fits in memory (18·P < 2^53 up to P ≈ 5·10^14), so the IEEE division
//     of the converted operands is that same quotient.
//   * DeepSpeed truncates with int() where its source does; its functions return those ints,
//     which are the bytes reported here (its printout divides them by 2^30 and shows two
//     decimals). Megatron returns float bytes (printed as MB, /2^20, two decimals); they are
//     rounded here to the nearest byte.
#include "trainmem/analytic/dist_refs.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

using u64 = std::uint64_t;

u64 u(std::int64_t v) {
  return static_cast<u64>(v);
}
double f(u64 v) {
  return static_cast<double>(v);
}
// Python's int(x) for a non-negative float: truncation.
u64 py_int(double x) {
  return static_cast<u64>(std::trunc(x));
}
// Megatron's float bytes, to the nearest byte.
u64 nearest(double x) {
  return static_cast<u64>(std::llround(x));
}

std::string num(u64 v) {
  return std::to_string(v);
}
std::string num(std::int64_t v) {
  return std::to_string(v);
}

// Adds the GPU terms' rounding residual to the term at `index` so that the terms add up to the
// total the estimator computes (used by Megatron, whose components are rounded one by one).
void settle(std::vector<ReferenceTerm>& terms, std::size_t index, u64 total) {
  u64 sum = 0;
  for (std::size_t k = 0; k < terms.size(); ++k)
    if (!terms[k].host && k != index) sum = checked_add(sum, terms[k].bytes, "reference terms");
  terms[index].bytes = total >= sum ? total - sum : 0;
}

const char* kDeepSpeedZero2 =
    "microsoft/DeepSpeed deepspeed/runtime/zero/stage_1_and_2.py: "
    "estimate_zero2_model_states_mem_needs (additional_buffer_factor 1.5)";
const char* kDeepSpeedZero3 =
    "microsoft/DeepSpeed deepspeed/runtime/zero/stage3.py: estimate_zero3_model_states_mem_needs "
    "(zero_init=1, additional_buffer_factor 1.5); largest_layer_params as model_to_params";
const char* kMegatron =
    "NVIDIA/Megatron-LM megatron/training/theoretical_memory_usage.py: "
    "compute_weight_and_optimizer_memory + ";

void deepspeed_common_notes(ReferenceRank& r, const TrainConfig& train, const ParallelConfig& par) {
  r.notes.push_back(
      "model states only: no activations, no logits, no inputs, no allocator reserve or "
      "fragmentation, no CUDA context, no NCCL buffers");
  r.notes.push_back("no communication buckets: reduce_bucket_size " + num(par.reduce_bucket) +
                    " elements (and allgather_bucket_size, 5e8 by default) are not in the "
                    "formula" +
                    (par.overlap_comm ? " (nor the second reduce bucket of overlap_comm)" : ""));
  r.notes.push_back(
      "written for 16-bit mixed-precision training with Adam (fp32 master params and m, v); "
      "stage_1_and_2.py's comment splits ZeRO-2's 18 in 18P/N as 2 (16-bit grads) + 4 (fp32 "
      "grads) + 4 (fp32 params) + 8 (Adam m, v); docs/code-docs/source/memory.rst splits "
      "ZeRO-3's as 16 (fp32 params, grads, m, v) + 2 (16-bit params)");
  if (train.dtype == DType::f32)
    r.notes.push_back(
        "this run trains in fp32; the estimator has no dtype argument and its formula is applied "
        "as written (16-bit params and grads, fp32 master copy)");
  if (train.optimizer != Optimizer::adamw)
    r.notes.push_back(std::string("this run uses ") + optimizer_name(train.optimizer) +
                      "; the estimator has no optimizer argument and its formula (Adam's two "
                      "fp32 states) is applied as written");
}

}  // namespace

std::uint64_t deepspeed_largest_layer_params(const ModelConfig& m) {
  m.validate();
  const u64 V = u(m.vocab), h = u(m.hidden), i = u(m.intermediate), kd = u(m.kv_dim());
  const u64 qd = checked_mul(u(m.heads), u(m.head_dim()), "q_proj");
  // model_to_params: for m in model.modules(): sum(p.numel() for p in
  // m.parameters(recurse=False)); containers (the model, each decoder layer, self_attn, mlp)
  // own no direct parameters, so the candidates are the leaf modules.
  const u64 candidates[] = {
      checked_mul(V, h, "embed_tokens"),  // embed_tokens; lm_head (tied or not) is the same size
      checked_mul(h, i, "mlp"),           // gate_proj, up_proj, down_proj
      checked_mul(h, qd, "q_proj"),       // q_proj, o_proj
      checked_mul(h, kd, "k_proj"),       // k_proj, v_proj
      h,                                  // input_layernorm, post_attention_layernorm, norm
  };
  return *std::max_element(std::begin(candidates), std::end(candidates));
}

std::uint64_t megatron_padded_vocab(const ModelConfig& m, std::int64_t tp) {
  if (tp < 1) throw InputError("megatron reference: --tp must be at least 1");
  // _vocab_size_with_padding: multiple = make_vocab_size_divisible_by (128) * tp;
  // int(math.ceil(V / multiple) * multiple). V / multiple is exact below 2^53.
  const u64 multiple = checked_mul(128, u(tp), "padded vocab");
  const u64 V = u(m.vocab);
  return checked_mul((V + multiple - 1) / multiple, multiple, "padded vocab");
}

// LoRA per rank: neither estimator has a frozen base (every parameter has a gradient and states).
constexpr const char* kFullFineTuneOnly =
    "--finetune lora: the estimator models a full fine-tune (a gradient and optimizer states for "
    "every parameter); only the adapters train here";

ReferenceRank deepspeed_reference(const ModelConfig& model, const TrainConfig& train,
                                  const ParallelConfig& par, std::int64_t gpus_per_node) {
  model.validate();
  if (gpus_per_node < 1)
    throw InputError("deepspeed reference: GPUs per node must be at least 1, got " +
                     num(gpus_per_node));
  ReferenceRank r;
  r.profile = "deepspeed";
  r.source = par.zero == 3 ? kDeepSpeedZero3 : kDeepSpeedZero2;
  deepspeed_common_notes(r, train, par);

  if (train.lora()) {
    r.why_not = kFullFineTuneOnly;
    return r;
  }
  if (par.zero < 2) {
    r.why_not = "ZeRO-" + num(static_cast<std::int64_t>(par.zero)) +
                ": DeepSpeed publishes estimators for ZeRO-2 "
                "(estimate_zero2_model_states_mem_needs) and ZeRO-3 "
                "(estimate_zero3_model_states_mem_needs) only";
    return r;
  }
  if (par.ep > 1) {
    r.why_not = "ep " + num(par.ep) +
                ": the estimators take the total parameter count and the GPU count only; a rank "
                "holds E/ep of the experts";
    return r;
  }
  if (par.tp > 1 || par.pp > 1) {
    r.why_not = "tp " + num(par.tp) + " × pp " + num(par.pp) +
                ": the estimators take the total parameter count and the GPU count only, with "
                "no tensor- or pipeline-parallel degree";
    return r;
  }
  if (par.zero == 2 && par.offload == Offload::optimizer_params) {
    r.why_not =
        "offload optimizer+params with ZeRO-2: ZeRO-2 offloads the optimizer only "
        "(estimate_zero2_model_states_mem_needs has cpu_offload, no parameter offload)";
    return r;
  }
  // The ZeRO group: the dp·cp ranks that shard the states (context-parallel ranks hold the same
  // parameters, as DeepSpeed's sequence-parallel ranks do).
  const std::int64_t N = par.grad_ranks();
  if (N < 1) throw InputError("deepspeed reference: --dp must be at least 1");
  // DeepSpeed's (num_gpus_per_node, num_nodes) whose product is the ZeRO group.
  const std::int64_t per_node = std::min(N, gpus_per_node);
  if (N % per_node != 0) {
    r.why_not = std::string(par.cp > 1 ? "dp·cp " : "dp ") + num(N) +
                " is not a whole number of nodes of " + num(gpus_per_node) +
                " GPUs (the estimators take num_gpus_per_node × num_nodes)";
    return r;
  }
  const std::int64_t nodes = N / per_node;
  r.covers = true;
  const u64 P = model.param_count();
  const u64 n = u(per_node);
  r.notes.push_back("P = " + num(P) + " (tied weights once, as model_to_params), N = " +
                    (par.cp > 1 ? "dp·cp" : "dp") + " = " + num(N) + " = " + num(per_node) +
                    " GPUs per node × " + num(nodes) + (nodes > 1 ? " nodes" : " node"));
  r.notes.push_back(
      "the CPU figure is per node (\"per CPU\" in DeepSpeed's table), with "
      "additional_buffer_factor 1.5");
  const double factor = 1.5;  // additional_buffer_factor default

  if (par.zero == 2) {
    if (par.offload == Offload::optimizer) {
      // gpu_mem = 2 * total_params
      // cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
      const u64 gpu = checked_mul(2, P, "deepspeed gpu_mem");
      const u64 mult = std::max<u64>(checked_mul(4, u(N)), 16);
      const u64 cpu = py_int(f(checked_mul(P, mult, "deepspeed cpu_mem")) * factor);
      r.terms.push_back({"16-bit params (every rank)", gpu, "2P", false});
      r.terms.push_back(
          {"CPU: offloaded optimizer and gradients", cpu, "int(P·max(4N, 16)·1.5)", true});
      r.gpu_total = gpu;
      r.host_total = cpu;
      r.notes.push_back(
          "offload optimizer (ZeRO-2): the GPU keeps only the 16-bit params; no gradient "
          "partition or bucket is counted on the GPU");
    } else {
      // gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
      // cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
      const u64 params16 = checked_mul(2, P, "deepspeed gpu_mem");
      const u64 sharded = py_int(f(checked_mul(18, P, "deepspeed gpu_mem")) / f(u(N)));
      const u64 cpu = py_int(f(checked_product({P, 4, n}, "deepspeed cpu_mem")) * factor);
      r.terms.push_back({"16-bit params (every rank)", params16, "2P", false});
      r.terms.push_back({"gradients and optimizer states, sharded", sharded,
                         "int(18P/N): 16-bit grads 2 + fp32 grads 4 + fp32 params 4 + Adam 8",
                         false});
      r.terms.push_back({"CPU: per node", cpu, "int(P·4·n·1.5)", true});
      r.gpu_total = checked_add(params16, sharded, "deepspeed gpu_mem");
      r.host_total = cpu;
      r.notes.push_back(
          "changed from 4P + 16P/N to 2P + 18P/N in 2024; docs/code-docs/source/memory.rst "
          "still shows the old formula");
    }
    return r;
  }

  // ZeRO-3. largest_layer_memory = 4 * largest_layer_params (16-bit params and grads of the
  // gathered layer); gpus_factor = 1 / num_nodes. The estimator prints zero_init=1 and =0;
  // the GPU figure is the same for both, the CPU figure of zero_init=1 is host_total.
  const u64 Lmax = deepspeed_largest_layer_params(model);
  const u64 LL = checked_mul(4, Lmax, "largest_layer_memory");
  const double gpus_factor = 1.0 / f(u(nodes));
  r.notes.push_back("Lmax = " + num(Lmax) +
                    " = the largest module's own parameters (embed_tokens / lm_head V·h for "
                    "LLaMA when V·h > h·i), not a decoder layer");
  r.terms.push_back({"gathered largest layer (16-bit params + grads)", LL, "4·Lmax", false});
  // cpu_mem with zero_init=0: total_params * max(4 * num_gpus_per_node, k * gpus_factor) * f;
  // Python's max keeps the int 4n unless k/nodes is larger.
  auto cpu_no_init = [&](double k) {
    const double other = k * gpus_factor;
    const double four_n = f(checked_mul(4, n));
    if (four_n >= other) return py_int(f(checked_product({P, 4, n}, "deepspeed cpu_mem")) * factor);
    return py_int(f(P) * other * factor);
  };
  u64 cpu = 0, cpu_alt = 0;
  if (par.offload == Offload::optimizer_params) {
    // gpu_mem = largest_layer_memory; cpu_mem = total_params * 18 * gpus_factor * factor
    cpu = py_int(f(checked_mul(P, 18, "deepspeed cpu_mem")) * gpus_factor * factor);
    cpu_alt = cpu_no_init(18);
    r.gpu_total = LL;
    r.terms.push_back({"CPU: offloaded params, gradients and optimizer states (per node)", cpu,
                       "int(P·18/nodes·1.5)", true});
  } else if (par.offload == Offload::optimizer) {
    // gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
    // cpu_mem = total_params * 16 * gpus_factor * factor
    const u64 shard = py_int(f(checked_mul(2, P, "deepspeed gpu_mem")) / f(u(N)));
    cpu = py_int(f(checked_mul(P, 16, "deepspeed cpu_mem")) * gpus_factor * factor);
    cpu_alt = cpu_no_init(16);
    r.terms.push_back({"16-bit params, sharded", shard, "int(2P/N)", false});
    r.terms.push_back({"CPU: offloaded gradients and optimizer states (per node)", cpu,
                       "int(P·16/nodes·1.5)", true});
    r.gpu_total = checked_add(LL, shard, "deepspeed gpu_mem");
  } else {
    // gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
    // cpu_mem = largest_layer_params * 4 * num_gpus_per_node * factor
    const u64 shard = py_int(f(checked_mul(18, P, "deepspeed gpu_mem")) / f(u(N)));
    cpu = py_int(f(checked_product({Lmax, 4, n}, "deepspeed cpu_mem")) * factor);
    cpu_alt = py_int(f(checked_product({P, 4, n}, "deepspeed cpu_mem")) * factor);
    r.terms.push_back({"model states, sharded", shard,
                       "int(18P/N); memory.rst: fp32 params, grads, m, v 16 + 16-bit params 2",
                       false});
    r.terms.push_back({"CPU: per node (zero_init=1)", cpu, "int(Lmax·4·n·1.5)", true});
    r.gpu_total = checked_add(LL, shard, "deepspeed gpu_mem");
  }
  r.host_total = cpu;
  r.notes.push_back("CPU with zero_init=0 (the table's other row): " + num(cpu_alt) + " bytes");
  r.notes.push_back(
      "no prefetch bucket (stage3_prefetch_bucket_size), no second gathered layer in flight, no "
      "stage3_max_live_parameters, no persistent small parameters "
      "(stage3_param_persistence_threshold): one gathered layer only");
  return r;
}

namespace {

// Megatron-LM's compute_weight_and_optimizer_memory (no MTP, no MLA): the parameters on the most
// loaded shard (the first stage's rank) and their bytes. A mixture of experts as NVIDIA/
// Megatron-LM PR #4687 ("take into account expert parallelism correctly") splits it: the routed
// experts apart, over etp·ep, with their own expert-data-parallel degree.
struct MegatronWeights {
  double p_shard = 0;    // parameters: tp-sharded + replicated, on the most loaded shard
  double p_expert = 0;   // the routed experts on it (0 for a dense model)
  std::int64_t edp = 1;  // world // (etp·ep·pp)
  double bytes = 0;  // p_shard × 18, or × (6 + 12/dp) with the distributed optimizer; + experts'
};

MegatronWeights megatron_weights(const ModelConfig& model, const ParallelConfig& par, u64 Vp) {
  const u64 h = u(model.hidden), a = u(model.heads), g = u(model.kv_heads);
  const u64 ffn = u(model.intermediate);  // ffn_hidden_size: the SwiGLU width (fc1 is h × 2·ffn)
  const u64 L = u(model.layers);
  const u64 kv_channels = u(model.head_dim());
  const u64 tp = u(par.tp), pp = u(par.pp), dp = u(par.dp);
  const bool untie = !model.tied_embeddings;
  const u64 query_projection_size = checked_mul(kv_channels, a);
  const double ratio = f(query_projection_size) / f(h);
  const double gated_linear_multiplier = 3.0 / 2.0;  // args.swiglu
  const u64 norm_size = 1;                           // RMSNorm
  // self_attn_term = 2 * h * h * ((1 + g / a) * ratio)
  const double self_attn_term =
      f(checked_product({2, h, h}, "attention params")) * ((1.0 + f(g) / f(a)) * ratio);
  const u64 embedding_size = checked_mul(h, Vp, "embedding params");
  const u64 final_layernorm = norm_size * h;
  const double attention_params = self_attn_term;
  // dense_mlp_params = 2 * h * ffn * gated_linear_multiplier
  const double dense_mlp_params =
      f(checked_product({2, h, ffn}, "mlp params")) * gated_linear_multiplier;
  const u64 layernorm_params = 2 * h * norm_size;
  // A mixture of experts (PR #4687): L_moe layers of attention + shared expert (tp-sharded),
  // layernorms + router h·E + shared expert gate h (replicated), routed experts
  // 2·h·moe_ffn·E·1.5 (over etp·ep); the L − L_moe dense layers as before. Our layer rule
  // (ModelConfig::is_moe_layer) is passed as moe_layer_freq's list form.
  const u64 L_moe = u(model.moe_layer_count()), L_dense = L - L_moe;
  const u64 E = u(model.experts), moe_ffn = u(model.expert_intermediate);
  const u64 shared_ffn = u(model.shared_expert_intermediate);
  const double shared_expert_params =
      f(checked_product({2, h, shared_ffn}, "shared expert params")) * gated_linear_multiplier;
  const double routed_expert_params =
      f(checked_product({2, h, moe_ffn, E}, "expert params")) * gated_linear_multiplier;
  const u64 router_params = checked_mul(h, E, "router params");  // add_bias_linear false
  const u64 shared_expert_gate_params = shared_ffn > 0 ? h : 0;  // moe_shared_expert_gate
  const double tp_sharded_in_block = (attention_params + dense_mlp_params) * f(L_dense) +
                                     (attention_params + shared_expert_params) * f(L_moe);
  const u64 per_moe_layer = checked_add(checked_add(layernorm_params, router_params),
                                        shared_expert_gate_params, "norm params");
  const u64 replicated_in_block =
      checked_add(checked_add(checked_mul(layernorm_params, L_dense),
                              checked_mul(per_moe_layer, L_moe), "norm params"),
                  final_layernorm, "norm params");
  const double expert_in_block = routed_expert_params * f(L_moe);
  // tp_sharded_params_on_most_loaded_shard = ((tp_sharded / pp) + mtp(0) + embedding) / tp
  double tp_sharded_on_shard = ((tp_sharded_in_block / f(pp)) + f(embedding_size)) / f(tp);
  const double replicated_on_shard = f(replicated_in_block) / f(pp);
  const double expert_on_shard = expert_in_block / f(pp) / f(u(par.etp) * u(par.ep));
  if (untie && pp == 1) tp_sharded_on_shard += f(embedding_size) / f(tp);
  // num_bytes_per_parameter(dp): 18, or 6 + 12/dp with the distributed optimizer.
  auto bytes_per_param = [&](u64 n) { return par.zero >= 1 ? 6.0 + (12.0 / f(n)) : 18.0; };
  MegatronWeights w;
  w.p_shard = tp_sharded_on_shard + replicated_on_shard;
  w.p_expert = expert_on_shard;
  w.edp = par.world / (par.etp * par.ep * par.pp);  // expert_data_parallel_size
  w.bytes = (tp_sharded_on_shard + replicated_on_shard) * bytes_per_param(dp) +
            expert_on_shard * bytes_per_param(u(w.edp));
  return w;
}

// report_theoretical_memory's activation branch: compute_activation_memory (sequence parallel
// with selective recompute) or compute_activation_memory_without_sp, with its parts.
struct MegatronActivations {
  double total = 0, layers = 0, ids = 0, dropout = 0, output = 0;
  std::string layers_formula, output_formula;
};

MegatronActivations megatron_activations(const ModelConfig& model, const TrainConfig& train,
                                         const ParallelConfig& par, bool sp_branch, u64 Vp) {
  const u64 h = u(model.hidden);
  const u64 ffn = u(model.intermediate);
  const u64 L = u(model.layers);
  const u64 tp = u(par.tp), pp = u(par.pp), M = u(par.microbatches);
  const u64 s = u(train.seq), b = u(train.batch);
  const u64 sb = checked_mul(s, b, "activations");
  const u64 sbh = checked_mul(sb, h, "activations");
  // Python's min(1, M / pp) keeps the int 1 unless M / pp is smaller; either way a factor.
  const bool pipelined = pp > 1;  // virtual_pipeline_model_parallel_size is None
  const double schedule = pipelined ? std::min(1.0, f(M) / f(pp)) : 1.0;
  const u64 ids = checked_product({8, s, b, pp}, "activations");  // input to embedding
  const u64 dropout = checked_mul(sbh, pp, "activations");        // embedding dropout
  MegatronActivations out;
  if (sp_branch) {
    // compute_activation_memory: tp_sharded = (18·sbh + 4·sb·ffn)·L + 8·s·b·pp + sbh·pp,
    // × schedule, + sbh·4·(1 + Vp/h) when pp == 1, all / tp.
    const u64 dense_layer =
        checked_add(checked_mul(18, sbh), checked_product({4, sb, ffn}), "activations");
    const u64 layers = checked_mul(dense_layer, L, "activations");
    const u64 tp_sharded_int = checked_add(checked_add(layers, ids), dropout, "activations");
    double tp_sharded = f(tp_sharded_int) * schedule;
    double output = 0;
    if (pp == 1) {
      output = f(checked_mul(sbh, 4)) * (1.0 + (f(Vp) / f(h)));
      tp_sharded += output;
    }
    out.total = tp_sharded / f(tp);
    out.layers = f(layers) * schedule / f(tp);
    out.ids = f(ids) * schedule / f(tp);
    out.dropout = f(dropout) * schedule / f(tp);
    out.output = output / f(tp);
    out.layers_formula =
        "sbh·(18 + 4·ffn/h)·L" + std::string(pipelined ? "·min(1, M/pp)" : "") + "/tp";
    out.output_formula = "4·sbh·(1 + Vp/h)/tp";
  } else {
    // compute_activation_memory_without_sp: (sbh·(10 + 24/tp)·L + 8·s·b·pp + sbh·pp) ×
    // schedule, + 2·(s·b·Vp/tp + sbh) when pp == 1, all × 1.05 (no final / tp).
    const double per_layer = f(sbh) * (10.0 + (24.0 / f(tp)));
    const double layers = per_layer * f(L);
    double total = layers;
    total += f(ids);
    total += f(dropout);
    if (pipelined) total *= schedule;
    double output = 0;
    if (pp == 1) {
      double logits = f(checked_mul(sb, Vp, "logits"));
      logits /= f(tp);
      output = (logits + f(sbh)) * 2.0;
      total += output;
    }
    const double overhead = 1.05;
    out.total = total * overhead;
    out.layers = layers * schedule * overhead;
    out.ids = f(ids) * schedule * overhead;
    out.dropout = f(dropout) * schedule * overhead;
    out.output = output * overhead;
    out.layers_formula =
        "sbh·(10 + 24/tp)·L" + std::string(pipelined ? "·min(1, M/pp)" : "") + "·1.05";
    out.output_formula = "2·(s·b·Vp/tp + sbh)·1.05";
  }
  return out;
}

// The notes of the Megatron reference: the mapping of our flags and what it leaves out.
void megatron_notes(ReferenceRank& r, const ModelConfig& model, const TrainConfig& train,
                    const ParallelConfig& par, bool sp_branch, u64 Vp, double p_shard) {
  const u64 ffn = u(model.intermediate);
  const u64 pp = u(par.pp), M = u(par.microbatches);
  r.notes.push_back("P_shard = " + num(nearest(p_shard)) +
                    " parameters on the first stage's rank; " + "Vp = " + num(Vp) + " (vocab " +
                    num(u(model.vocab)) +
                    " padded to a multiple of 128·tp); ffn_hidden_size = intermediate " + num(ffn) +
                    " with --swiglu (fc1 h × 2·ffn, fc2 ffn × h: 2·h·ffn·1.5)");
  r.notes.push_back(
      "the 18 (or 6 + 12/dp) bytes per parameter assume bf16 params, fp32 main grads, fp32 main "
      "params and Adam; applied as written");
  if (par.zero >= 1)
    r.notes.push_back("--zero " + num(static_cast<std::int64_t>(par.zero)) +
                      " mapped to --use-distributed-optimizer (main params and Adam states "
                      "sharded over dp; the fp32 gradient buffer stays whole" +
                      (par.zero >= 2 ? ", so ZeRO-2/3's gradient and parameter sharding is not "
                                       "in the formula)"
                                     : ")"));
  if (train.dtype == DType::f32)
    r.notes.push_back(
        "this run trains in fp32; Megatron's formulas are for 16-bit training and are applied "
        "as written");
  if (train.optimizer != Optimizer::adamw)
    r.notes.push_back(std::string("this run uses ") + optimizer_name(train.optimizer) +
                      "; the estimator has no optimizer argument (Adam is assumed)");
  if (sp_branch)
    r.notes.push_back(
        "activations: sequence parallelism with selective recompute (Korthikanti Table 2: "
        "sbh(18 + 4·ffn/h) per layer, no a·s² score term), all / tp");
  else
    r.notes.push_back(
        std::string("activations: the without-SP formula (") +
        (par.sp ? "sequence parallelism without selective recompute" : "no sequence parallelism") +
        "): per layer sbh(10 + 24/tp), Korthikanti Table 2's tensor-parallel + selective "
        "recompute row, so no a·s² score term either; embedding terms not / tp; × 1.05");
  if (train.checkpointing == Checkpointing::full)
    r.notes.push_back("checkpointing " + checkpointing_name(train) +
                      " = --recompute-granularity full: the estimator has no full-recompute "
                      "term and prices activations as if every layer kept them");
  if (pp > 1)
    r.notes.push_back("first pipeline stage: L/pp layers × min(pp, M) = " + num(std::min(pp, M)) +
                      " micro-batches in flight (written as L·min(1, M/pp)); the 1F1B schedule, "
                      "no interleaving (virtual stages = 1); no output-layer term off the last "
                      "stage");
  if (par.cp > 1)
    r.notes.push_back(
        "--cp " + num(par.cp) +
        ": the estimator has no context-parallel term, so its activations are the whole "
        "sequence's (s = " +
        num(train.seq) +
        " tokens per rank, where a rank holds s/cp = " + num(par.local_seq(train.seq)) +
        "), and its distributed optimizer divides by data_parallel_size = dp = " + num(par.dp) +
        " (Megatron shards over the dp·cp ranks); applied as written");
  r.notes.push_back(
      "not counted: communication buffers, NCCL, CUDA context, allocator reserve and "
      "fragmentation, the optimizer step's temporaries (without SP only the × 1.05 stands for "
      "them); no context-parallel term");
}

}  // namespace

ReferenceRank megatron_reference(const ModelConfig& model, const TrainConfig& train,
                                 const ParallelConfig& par, bool selective_recompute) {
  model.validate();
  selective_recompute |= train.checkpointing == Checkpointing::selective;
  if (selective_recompute && train.checkpointing == Checkpointing::full)
    throw InputError(
        "megatron reference: selective recompute and --checkpointing full are exclusive "
        "(Megatron's --recompute-granularity takes one value)");
  if (par.tp < 1 || par.pp < 1 || par.dp < 1 || par.microbatches < 1)
    throw InputError("megatron reference: --dp, --tp, --pp and --microbatches must be >= 1");
  ReferenceRank r;
  r.profile = "megatron";
  const bool sp_branch = par.sp && selective_recompute;
  r.source = std::string(kMegatron) +
             (sp_branch ? "compute_activation_memory" : "compute_activation_memory_without_sp") +
             " (chosen as report_theoretical_memory does)";
  if (train.lora()) {
    r.why_not = kFullFineTuneOnly;
    return r;
  }
  if (par.offload != Offload::none) {
    r.why_not = std::string("offload ") + offload_name(par.offload) +
                ": theoretical_memory_usage.py has no CPU-offload term";
    return r;
  }
  r.covers = true;

  const u64 Vp = megatron_padded_vocab(model, par.tp);
  const bool untie = !model.tied_embeddings;
  const bool distributed_optimizer = par.zero >= 1;
  const bool pipelined = par.pp > 1;
  const MegatronWeights mw = megatron_weights(model, par, Vp);
  const MegatronActivations ma = megatron_activations(model, train, par, sp_branch, Vp);

  const u64 weights = nearest(mw.bytes);
  const u64 acts = nearest(ma.total);
  const std::string sched = pipelined ? "·min(1, M/pp)" : "";
  const std::string last = sp_branch ? "/tp" : "·1.05";
  const std::string bpp = distributed_optimizer ? "(6 + 12/dp)" : "18";
  if (!model.moe())
    r.terms.push_back({"weights and optimizer (most loaded shard)", weights,
                       "P_shard·" + bpp + ", P_shard = ((2h²(1 + g/a) + 3h·ffn)·L/pp + Vp·h" +
                           (untie && !pipelined ? " + Vp·h (untied output)" : "") +
                           ")/tp + (2h·L + h)/pp",
                       false});
  else
    r.terms.push_back(
        {"weights and optimizer (most loaded shard)", weights,
         "P_shard·" + bpp + " + P_experts·" +
             (distributed_optimizer ? "(6 + 12/edp)" : std::string("18")) +
             ", P_shard = (((2h²(1 + g/a) + 3h·ffn)·L_dense + (2h²(1 + g/a) + 3h·m_s)·L_moe)/pp" +
             " + Vp·h" + (untie && !pipelined ? " + Vp·h (untied output)" : "") +
             ")/tp + (2h·L + (h·E + gate)·L_moe + h)/pp, P_experts = "
             "3h·moe_ffn·E·L_moe/(pp·etp·ep)",
         false});
  r.terms.push_back(
      {"activations: transformer layers", nearest(ma.layers), ma.layers_formula, false});
  r.terms.push_back({"activations: input ids (pp micro-batches)", nearest(ma.ids),
                     "8·s·b·pp" + sched + last, false});
  r.terms.push_back({"activations: embedding dropout (pp micro-batches)", nearest(ma.dropout),
                     "sbh·pp" + sched + last, false});
  if (!pipelined)
    r.terms.push_back({"activations: output layer and cross-entropy", nearest(ma.output),
                       ma.output_formula, false});
  settle(r.terms, 1, checked_add(weights, acts, "megatron total"));
  r.activations = acts;
  r.gpu_total = checked_add(weights, acts, "megatron total");
  megatron_notes(r, model, train, par, sp_branch, Vp, mw.p_shard);
  if (model.moe())
    r.notes.push_back(
        "a mixture of experts, split as NVIDIA/Megatron-LM PR #4687 does: P_experts = " +
        num(nearest(mw.p_expert)) + " routed-expert parameters on the rank (" +
        num(model.moe_layer_count()) + " MoE layers of " + num(model.experts) +
        " experts, over etp·ep = " + num(par.etp * par.ep) + "), at " +
        (par.zero >= 1 ? "6 + 12/edp" : std::string("18")) +
        " bytes with edp = world/(etp·ep·pp) = " + num(mw.edp) +
        "; the router (h·E per MoE layer) and the shared expert's gate replicated; its activation "
        "formulas have no MoE term (every layer priced as a dense one of width ffn = "
        "intermediate), so the routed rows trainmem counts (b·s·K of h and of m per MoE layer, "
        "the dispatch buffers) are not in it");
  return r;
}

}  // namespace trainmem
