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
  const bool dense_mlp = m.moe_layer_count() < m.layers;  // a layer with gate/up/down_proj
  u64 largest = std::max({
      checked_mul(V, h, "embed_tokens"),  // embed_tokens; lm_head (tied or not) is the same size
      dense_mlp ? checked_mul(h, i, "mlp") : 0,  // gate_proj, up_proj, down_proj
      checked_mul(h, qd, "q_proj"),              // q_proj, o_proj
      checked_mul(h, kd, "k_proj"),              // k_proj, v_proj
      h,                                         // input_layernorm, post_attention_layernorm, norm
  });
  if (m.moe()) {
    // A mixture of experts as transformers 5 builds it: the experts module owns gate_up_proj
    // (E, 2m, h) and down_proj (E, h, m) directly, the router (E, h), the shared expert's
    // projections (m_s, h) each.
    const u64 E = u(m.experts), me = u(m.expert_intermediate);
    largest =
        std::max({largest, checked_product({E, 3, me, h}, "experts"), checked_mul(E, h, "router"),
                  checked_mul(u(m.shared_expert_intermediate), h, "shared expert")});
  }
  return largest;
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
  if (par.ep > 1 || par.etp > 1) {
    r.why_not = "ep " + num(par.ep) + " × etp " + num(par.etp) +
                ": the estimators take the total parameter count and the GPU count only; a rank "
                "holds E/ep of the experts, m/etp of each one's width";
    return r;
  }
  if (par.tp > 1 || par.pp > 1) {
    r.why_not = "tp " + num(par.tp) + " × pp " + num(par.pp) +
                ": the estimators take the total parameter count and the GPU count only, with "
                "no tensor- or pipeline-parallel degree";
    return r;
  }
  if (model.moe() && par.zero == 3)
    r.notes.push_back(
        "a mixture of experts at ep 1: DeepSpeed's own MoE layer refuses stage 3 "
        "(engine.py _configure_zero_optimizer: \"MoE not supported with Stage 3\"); a "
        "HuggingFace MoE runs as a dense model, its experts partitioned over all the ranks; "
        "largest_layer_params " +
        num(static_cast<std::int64_t>(deepspeed_largest_layer_params(model))) +
        " (a layer's experts count as one module: transformers 5 keeps gate_up_proj and "
        "down_proj on it)");
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
  r.activations_counted = true;
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

// ---- mbridge (ISEEKYAN/mbridge memory_estimator, docs/distributed-references.md "mbridge")

namespace trainmem {
namespace {

u64 sum_of(std::initializer_list<u64> xs, const char* what) {
  u64 total = 0;
  for (u64 x : xs) total = checked_add(total, x, what);
  return total;
}

const char* kMbridge =
    "ISEEKYAN/mbridge memory_estimator/estimate_013.py: report_memory_usage_one_pp_rank over "
    "moe_mem_estimator/gpt_model.py and layers.py (num_parameter, num_activation)";

// One pipeline rank as the estimator sees it: parameters (routed experts apart), activation
// elements of one micro-batch by part, and what its report adds up.
struct MbridgeRank {
  u64 P = 0, P_sparse = 0;
  double pre = 0, layers = 0, final_norm = 0, post = 0, between = 0, first_layer = 0;
  u64 L_r = 0, n = 0;
  double acts = 0;  // A_r: elements, already / cp
  double wgo = 0;   // weight_grad_optim bytes
};

MbridgeRank mbridge_rank(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& p,
                         std::int64_t r) {
  const u64 h = u(m.hidden), a = u(m.heads), g = u(m.kv_heads), d = u(m.head_dim());
  const u64 tp = u(p.tp), pp = u(p.pp), cp = u(p.cp), ep = u(p.ep), etp = u(p.etp);
  const u64 V = u(m.vocab), b = u(t.batch), s = u(t.seq);
  const bool first = r == 0, last = r + 1 == p.pp;
  const bool selective = t.checkpointing == Checkpointing::selective;
  MbridgeRank x;
  // Parameters (GPTModel.num_parameter): VocabParallelEmbedding (V/tp)·h, no padding.
  const u64 Vt = V / tp;
  if (first) x.P = checked_add(x.P, checked_mul(Vt, h, "mbridge params"));
  const u64 qkv_out = checked_product({a + 2 * g, d}, "mbridge params") / tp;
  const u64 attn = sum_of({checked_mul(qkv_out, h), m.qkv_bias ? qkv_out : 0,
                           checked_mul(h, checked_mul(a, d) / tp), m.qk_norm ? 2 * d : 0},
                          "mbridge params");
  // Sequence parallelism is on whenever tp > 1 (the web UI); it divides the norms and the
  // bias-dropout-adds only. MoE tokens: s // tp · etp.
  const double s_sp = tp > 1 ? f(s) / f(tp) : f(s);
  const u64 s_moe = s / tp * etp, T = checked_mul(b, s_moe);
  const u64 Ls = u(m.layers) / pp;
  x.L_r = Ls;
  for (u64 l = u(r) * Ls; l < (u(r) + 1) * Ls; ++l) {
    const bool moe = m.is_moe_layer(std::int64_t(l));
    u64 params = attn;
    double act = 4.0 * f(checked_product({b, s, checked_mul(a, d) / tp}, "mbridge acts"));
    if (!selective)  // TEDotProductAttention: 2·b·s·(g/tp)·d, doubled under cp
      act += f(checked_product({2, b, s, g / tp, d}, "mbridge acts")) * (cp > 1 ? 2.0 : 1.0);
    if (moe) {
      const u64 mw = u(m.expert_intermediate), E = u(m.experts), K = u(m.experts_per_token);
      const u64 ms = u(m.shared_expert_intermediate);
      // Router: 0 parameters (TopKRouter.num_parameter). Experts: E/ep of fc1 h × 2m/etp and
      // fc2 m/etp × h. Shared expert: an MLP of width ms over tp. Pre-MLP norm: h.
      const u64 experts = checked_product({E / ep, h, 3 * (mw / etp)}, "mbridge params");
      x.P_sparse = checked_add(x.P_sparse, experts);
      params = sum_of({params, experts, checked_product({3, ms / tp, h}), h}, "mbridge params");
      const u64 rows = checked_mul(s_moe, K);  // int(s'·K) per sample
      act += 2.0 * f(checked_mul(T, h)) + f(checked_product({K, T, h}, "mbridge acts"));
      act += f(checked_product({b, rows, 2 * (mw / etp)}, "mbridge acts")) +
             f(checked_product({b, rows, 2 * (mw / etp)}, "mbridge acts")) / 2.0;
      act += f(checked_product({b, s_moe, 2 * ms / tp})) +
             f(checked_product({b, s_moe, 2 * ms / tp})) / 2.0;
      act += f(checked_mul(b, h)) * s_sp;  // pre_mlp_layernorm
    } else {
      const u64 ffn = u(m.intermediate);
      params = checked_add(params, checked_product({3, ffn / tp, h}, "mbridge params"));
      act += f(checked_product({b, s, 2 * (ffn / tp)}, "mbridge acts")) +
             f(checked_product({b, s, 2 * (ffn / tp)}, "mbridge acts")) / 2.0;
    }
    act += 2.0 * f(checked_mul(b, h)) * s_sp;  // self_attn_bda + mlp_bda
    if (l == u(r) * Ls) x.first_layer = act;
    x.layers += act;
    x.P = checked_add(x.P, params, "mbridge params");
  }
  const double bsh = f(checked_product({b, s, h}, "mbridge acts"));
  if (first) x.pre = bsh;
  if (last) {
    x.P = sum_of({x.P, h, checked_mul(Vt, h)}, "mbridge params");  // final norm, output layer
    x.final_norm = bsh;
    x.post = 3.0 * f(checked_product({b, s, Vt}, "mbridge acts"));  // logits + fp32 softmax
  }
  x.between = bsh;
  x.n = pp - u(r);  // in-flight micro-batches, whatever M
  const double chunk = x.pre + x.layers + x.final_norm + x.post;
  double A;
  if (t.checkpointing == Checkpointing::full) {
    const double common = x.pre + x.between * f(x.L_r) * f(x.n);
    A = std::max(common + x.post, common + x.first_layer);
  } else {
    A = (chunk - x.post) * f(x.n) + x.post;
  }
  x.acts = A / f(cp);
  // Bytes: 18, or 6 + 12/dp/cp (dense) and 6 + 12/(world/pp/ep/etp) (routed experts).
  const bool distopt = p.zero >= 1;
  const double B_dense = distopt ? 6.0 + 12.0 / f(u(p.dp)) / f(cp) : 18.0;
  if (ep * etp > 1) {
    const double edp = f(u(p.world)) / f(pp) / f(ep) / f(etp);
    const double B_moe = distopt ? 6.0 + 12.0 / edp : 18.0;
    x.wgo = f(x.P - x.P_sparse) * B_dense + f(x.P_sparse) * B_moe;
  } else {
    x.wgo = f(x.P) * B_dense;
  }
  return x;
}

}  // namespace

ReferenceRank mbridge_reference(const ModelConfig& model, const TrainConfig& train,
                                const ParallelConfig& par) {
  model.validate();
  if (par.tp < 1 || par.pp < 1 || par.dp < 1 || par.cp < 1 || par.ep < 1 || par.etp < 1)
    throw InputError("mbridge reference: the layout's degrees must be >= 1");
  ReferenceRank r;
  r.profile = "mbridge";
  r.source = kMbridge;
  if (train.lora()) {
    r.why_not = kFullFineTuneOnly;
    return r;
  }
  if (par.offload != Offload::none) {
    r.why_not = std::string("offload ") + offload_name(par.offload) +
                ": the estimator has no CPU-offload term";
    return r;
  }
  if (model.vocab % par.tp != 0) {
    r.why_not = "vocab " + num(model.vocab) + " is not divisible by tp " + num(par.tp) +
                ": the estimator splits the vocabulary unpadded and asserts it";
    return r;
  }
  r.covers = true;
  r.activations_counted = true;
  std::vector<MbridgeRank> ranks;
  for (std::int64_t k = 0; k < par.pp; ++k) ranks.push_back(mbridge_rank(model, train, par, k));
  const MbridgeRank& x = ranks.front();
  const bool split = par.ep * par.etp > 1;
  const bool distopt = par.zero >= 1;
  const u64 wgo = nearest(x.wgo);
  const u64 acts = nearest(2.0 * x.acts);
  const u64 total = nearest(x.wgo + 2.0 * x.acts);
  if (split) {
    r.terms.push_back(
        {"weights, gradients, optimizer: dense",
         nearest(f(x.P - x.P_sparse) * (distopt ? 6.0 + 12.0 / f(u(par.dp)) / f(u(par.cp)) : 18.0)),
         std::string("(P − P_experts)·") + (distopt ? "(6 + 12/dp/cp)" : "18"), false});
    r.terms.push_back({"weights, gradients, optimizer: routed experts", 0,
                       std::string("P_experts·") + (distopt ? "(6 + 12/(world/pp/ep/etp))" : "18"),
                       false});
    settle(r.terms, 1, wgo);
  } else {
    r.terms.push_back({"weights, gradients and optimizer", wgo,
                       std::string("P·") + (distopt ? "(6 + 12/dp/cp)" : "18"), false});
  }
  const std::size_t first_act = r.terms.size();
  const std::string per = par.cp > 1 ? "·2 B/cp" : "·2 B";
  if (train.checkpointing == Checkpointing::full) {
    r.terms.push_back(
        {"activations: layer inputs (full recompute)", 0, "(b·s·h + b·s·h·L_r·n)" + per, false});
    r.terms.push_back({"activations: one layer recomputed, or the output",
                       nearest(2.0 * std::max(x.post, x.first_layer) / f(u(par.cp))),
                       "max(first layer, 3·b·s·V/tp)" + per, false});
  } else {
    r.terms.push_back(
        {"activations: transformer layers (n micro-batches)", 0, "Σ layers·n" + per, false});
    r.terms.push_back({"activations: embedding output",
                       nearest(2.0 * x.pre * f(x.n) / f(u(par.cp))), "b·s·h·n" + per, false});
    if (par.pp == 1)
      r.terms.push_back({"activations: final norm, logits and fp32 softmax",
                         nearest(2.0 * (x.final_norm * f(x.n) + x.post) / f(u(par.cp))),
                         "(b·s·h·n + 3·b·s·V/tp)" + per, false});
  }
  settle(r.terms, first_act, total);
  r.activations = acts;
  r.gpu_total = total;
  // Notes: the rank, the parameters as counted, the mapping of our flags, what is left out.
  std::string every;
  double worst = 0;
  for (std::size_t k = 0; k < ranks.size(); ++k) {
    const double tk = ranks[k].wgo + 2.0 * ranks[k].acts;
    worst = std::max(worst, tk);
    every += (k ? ", " : "") + std::string("rank ") + num(std::int64_t(k)) + " " +
             num(nearest(tk)) + " B";
  }
  r.notes.push_back("pipeline rank 0 of " + num(par.pp) + " (" + every +
                    "); its web UI's \"Total\" is the largest, " + num(nearest(worst)) +
                    " B, plus an overhead it adds (10 GiB by default) for the CUDA context, NCCL "
                    "and fragmentation");
  r.notes.push_back(
      "P = " + num(x.P) + " parameters on the rank" +
      (model.moe() ? ", P_experts = " + num(x.P_sparse) +
                         " of them routed experts (E/ep per layer, widths /etp)"
                   : std::string()) +
      ": the router's E·h per MoE layer counted as 0 (TopKRouter.num_parameter), the input norms "
      "and a dense layer's pre-MLP norm not counted (fused into TE's linear), the vocabulary "
      "unpadded, the output layer counted even when tied" +
      (model.shared_expert_intermediate > 0 ? ", the shared expert's gate not counted" : ""));
  r.notes.push_back(
      std::string(distopt ? "--zero " + num(std::int64_t(par.zero)) +
                                " mapped to use_distributed_optimizer: "
                          : "no distributed optimizer: 18 B a parameter; ") +
      (distopt
           ? "6 + 12/(dp·cp) bytes a dense parameter" +
                 std::string(
                     split ? " and 6 + 12/(world/(pp·ep·etp)) a routed expert's (ep·etp > 1)" : "")
           : std::string()) +
      "; bf16 params, fp32 grads and Adam's fp32 states assumed, as written");
  r.notes.push_back(
      "activations at 2 B an element whatever the dtype; n = pp − pp_rank = " + num(x.n) +
      " micro-batches in flight whatever --microbatches; sequence parallelism on whenever tp > 1 "
      "(its web UI), dividing the norms and bias-dropout-adds only; flash attention's "
      "2·b·s·(g/tp)·d (doubled under cp), no a·s² score term; a MoE layer's tokens s//tp·etp, "
      "routed evenly (K rows each, no dispatch buffers); every term / cp");
  r.notes.push_back(
      std::string("checkpointing ") + checkpointing_name(train) +
      (train.checkpointing == Checkpointing::full
           ? " = recompute_granularity full, method uniform, 1 layer: the layer inputs of n "
             "micro-batches plus the larger of one layer's activations and the output's"
       : train.checkpointing == Checkpointing::selective
           ? " = recompute_granularity selective with no recompute_modules: only core attention is "
             "dropped"
           : " = recompute_granularity none"));
  r.notes.push_back(
      "not counted: communication buffers (the all-to-all included), workspaces, the optimizer "
      "step's temporaries, the CUDA context, allocator reserve and fragmentation");
  return r;
}

}  // namespace trainmem
