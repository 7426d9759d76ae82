// One rank's sharded training step: every tensor the rank
// allocate (its share of the parameters, the ZeRO shards, the activations of its pipeline
// stage's micro-batches in the 1F1B order, the collective buffers) goes through the ledger in
// the order of docs/distributed.md ("The sharded step"); collectives are ops that allocate their
// buffers and move no data. The per-rank analytic profile (analytic_rank.hpp) must equal the
// ledger's figures byte for byte.
//
// Traced (meta, no execution): collectives are ops that allocate their buffers and move no
// data. Measured (a ShardedExecution on a computing backend, docs/distributed.md "Measured
// runs"): the same walk allocates the same tensors in the same order and runs the rank's real
// arithmetic between the allocations, with real collectives over the data-parallel group, so
// the rank's measured ledger is the meta trace by construction and the per-rank analytic
// profile checks it. Measured runs support data parallelism (dp >= 1, ZeRO 0-3, several
// micro-batches, AdamW or SGD, --offload), tensor parallelism with or without sp (Megatron's
// column/row-parallel layers, vocabulary-parallel embedding, head and cross-entropy), and
// pipeline parallelism (1F1B, activations and their gradients sent between stages through host
// memory, tied embeddings kept equal across the first and last stage); InputError otherwise.
//
// Names: parameters use their HuggingFace names with the rank's shapes (q_proj (a/t·d, h), ...);
// the ZeRO flat tensors are `params.shard`, `grads.shard`, `shard.master`, `shard.exp_avg`,
// `shard.exp_avg_sq`; collective buffers (category communication) are `reduce_bucket`,
// `gathered.<unit>`, and under sp `<tensor>.gathered` / `<tensor>.partial`. Per-parameter
// sharding (FSDP2) adds `all_gather.<unit>` (forward copy-outs), `reduce_scatter.<unit>`, the
// unsharded `<param>.grad` and each unit's sharded gradient `grads.<unit>` (no reduce bucket, no
// grads.shard); its root unit is `gathered.root`.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainmem/backends/backend.hpp"
#include "trainmem/base/config.hpp"
#include "trainmem/base/parallel.hpp"
#include "trainmem/base/safetensors.hpp"
#include "trainmem/comm/collective.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/optimizer.hpp"

namespace trainmem {

// What a measured rank runs with. Weights are LlamaModel::init_random(seed)'s, parameter by
// parameter, or the rank's elements of the whole model's tensors in `weights` (--weights: HF
// names and shapes, as LlamaModel::load_weights reads them); the global batch is
// random_token_ids(seed, dp·M·b·s, V) (model.hpp), or `tokens` (--tokens: dp·M·b·s ids), in rows
// of s, and rank r's micro-batch m is rows (r·M + m)·b ... +b: the step of a single-rank
// LlamaModel of batch dp·M·b, split. Under context parallelism r is the data-parallel index and
// the rank holds the positions of its two chunks of each row (SeqPositions::of_rank).
struct ShardedExecution {
  Backend& backend;  // computes; its allocator is the ledger's
  Collective& data;  // the gradient group (size dp·cp), on the backend's buffers
  Collective& host;  // the same ranks on host buffers (the loss, parameter read-back)
  std::uint64_t seed = 0;
  OptimizerSettings optimizer;
  // Tensor parallelism (layout tp > 1): the rank's tensor-parallel group on the backend's
  // buffers and on host buffers; its rank is the rank's tensor-parallel index.
  Collective* tp = nullptr;
  Collective* tp_host = nullptr;
  // Pipeline parallelism (layout pp > 1): the rank's pipeline group on host buffers (MPI on
  // every backend: the messages are staged in host memory), its rank the stage.
  Collective* pp = nullptr;
  // Context parallelism (layout cp > 1): the ring of the rank's context-parallel group on host
  // buffers (the cpu backend), its rank the context-parallel index. `data` and `host` are then
  // the gradient group of dp·cp ranks, ordered dp_index·cp + cp_index.
  Collective* cp = nullptr;
  // Expert parallelism (layout ep > 1; docs/distributed.md, "Expert parallelism"): the rank's
  // ep group (its rank the expert-parallel index) on the backend's buffers (the rows'
  // all-to-all) and on host buffers (the counts), and its expert-data-parallel group on the
  // backend's buffers (the experts' gradients and ZeRO's expert shards; its rank the index
  // j/(ep·etp), j the rank's slot in its stage). A MoE under tp needs the expert-data-parallel
  // group at ep 1 too (the stage's ranks: the experts' gradients are summed over the
  // tensor-parallel ranks). Expert tensor parallelism (etp > 1; docs/distributed.md, "Expert tensor
  // parallelism"): the etp group (the etp consecutive slots that split each of the same experts'
  // width; its rank the index j mod etp) on the backend's buffers (the rows' gather, the partial
  // outputs' scatter) and on host buffers (the counts). The ep group is then the slots of the same
  // etp and expert-data-parallel indices, and the expert-data-parallel group the slots of the same
  // j mod (ep·etp), its rank j / (ep·etp).
  Collective* ep = nullptr;
  Collective* ep_host = nullptr;
  Collective* edp = nullptr;
  Collective* etp = nullptr;
  Collective* etp_host = nullptr;
  // The whole model's weights (empty: random of `seed`): each parameter by its HF name (a tied
  // lm_head reads model.embed_tokens.weight), in the single-rank model's shape; InputError naming
  // --weights, the file and the tensor when one is missing, has another shape or no float dtype.
  std::vector<const SafeTensorsReader*> weights{};
  // The global batch, dp·M·b·s ids in [0, V) (nullptr: random of `seed`); InputError naming
  // --tokens otherwise.
  const std::vector<std::int32_t>* tokens = nullptr;
};

class ShardedStep {
 public:
  // Allocates the setup of pipeline stage `stage` of `layout` (resolved) in phase setup.
  // With `exec` (measured), the rank is exec->data.rank() of the data-parallel group, and
  // the weights and states are initialised.
  // Traced (no `exec`), the rank is `grad_rank` of the gradient group: under per-parameter
  // sharding its optimizer states hold the rows it owns, under expert parallelism its experts
  // receive their rows (other layouts: every rank alike). For a MoE under tp, `grad_rank` is the
  // rank's slot in its stage, gradient index · tp + tensor-parallel index.
  ShardedStep(const ModelConfig& model, const TrainConfig& train, const ParallelConfig& layout,
              std::int64_t stage, Ledger& ledger, const ShardedExecution* exec = nullptr,
              std::int64_t grad_rank = 0);
  ~ShardedStep();
  ShardedStep(const ShardedStep&) = delete;
  ShardedStep& operator=(const ShardedStep&) = delete;

  // Expert parallelism: the rows each MoE layer's experts received in the last step, by
  // (micro-batch, global layer): a measured run's routing. A trace given them (before its steps)
  // allocates those rows in place of balanced routing's, so that it reproduces the measured
  // rank's books.
  // `a`: the rows the ep all-to-all brings the rank; `r`: the rows its experts compute (the a of
  // every rank of its etp group; r = a at etp 1).
  struct DispatchRows {
    std::int64_t a = 0, r = 0;
    bool operator==(const DispatchRows& o) const { return a == o.a && r == o.r; }
    bool operator!=(const DispatchRows& o) const { return !(*this == o); }
    bool operator<(const DispatchRows& o) const { return a != o.a ? a < o.a : r < o.r; }
  };
  using ExpertRows = std::map<std::pair<std::int64_t, int>, DispatchRows>;
  const ExpertRows& expert_rows() const;
  void set_expert_rows(ExpertRows rows);
  // A measured run of a mixture of experts: the choices this rank's own tokens routed to every
  // global expert in the last step's forward, by (micro-batch, global layer) (routing per rank,
  // LayoutRouting; empty in a trace).
  using SourceCounts = std::map<std::pair<std::int64_t, int>, std::vector<std::int64_t>>;
  const SourceCounts& routed() const;

  // One optimizer step: ledger.begin_step, the stage's micro-batches in 1F1B order (the end of
  // forward is marked after the forward that precedes the first backward), the optimizer.
  // Returns the mean loss of the global batch (every rank the same; NaN when traced).
  float train_step();

  // Measured runs, called by every rank (ZeRO-3 gathers the shards): the current values of
  // the parameter with this HF name, as fp32.
  std::vector<float> parameter_values(const std::string& hf_name);
  // --offload (measured): the bytes the rank keeps in host memory (optimizer states, the fp32
  // gradient shard, under optimizer+params the parameter shard); 0 otherwise.
  std::uint64_t host_bytes() const;
  // The HF names of the rank's parameters, in setup order.
  std::vector<std::string> parameter_names() const;
  // Whether the parameter is a frozen quantized weight (4-bit or int8; parameter_values refuses
  // it, as LlamaModel's does).
  bool is_quantized(const std::string& hf_name) const;
  // Where each of the rank's elements of a parameter sits in the whole parameter (row-major, the
  // single-rank model's shape): the identity without tensor parallelism.
  std::vector<std::uint64_t> parameter_elements(const std::string& hf_name) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainmem
