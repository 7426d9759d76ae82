// Tracing a parallel layout rank by rank on meta (include/trainmem/run/run_layout.hpp).
#include "trainmem/run/run_layout.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>

#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/ledger/ledger.hpp"
#include "trainmem/model/model.hpp"
#include "trainmem/model/model_io.hpp"
#include "trainmem/model/sharded_step.hpp"
#include "trainmem/run/timeline.hpp"

namespace trainmem {

bool LayoutTrace::all_match() const {
  for (const auto& r : ranks)
    if (!r.matches) return false;
  for (const auto& r : routed)
    if (!r.analytic_differences.empty()) return false;
  return !ranks.empty();
}

namespace {

// "name: ledger X, <source> Y" for every figure that differs.
std::vector<std::string> differences(const MemoryFigures& got, const MemoryFigures& want,
                                     const char* source) {
  std::vector<std::string> out;
  auto one = [&](const char* name, std::uint64_t g, std::uint64_t w) {
    if (g != w)
      out.push_back(std::string(name) + ": ledger " + std::to_string(g) + ", " + source + " " +
                    std::to_string(w));
  };
  one("params", got.params, want.params);
  one("gradients", got.gradients, want.gradients);
  one("optimizer_states", got.optimizer_states, want.optimizer_states);
  one("activations", got.activations, want.activations);
  one("activations_peak", got.activations_peak, want.activations_peak);
  one("workspace", got.workspace, want.workspace);
  one("inputs", got.inputs, want.inputs);
  one("peak", got.peak, want.peak);
  for (Category c : all_categories())
    one((std::string("peak_breakdown.") + category_name(c)).c_str(),
        got.peak_breakdown[static_cast<int>(c)], want.peak_breakdown[static_cast<int>(c)]);
  return out;
}

// A routed rank's model states (params, gradients, optimizer states, inputs) against the
// analytic, which assumes balanced routing: the routing-dependent figures are taken as equal.
std::vector<std::string> state_differences(const MemoryFigures& got, const MemoryFigures& a) {
  MemoryFigures states = got;
  states.activations = a.activations;
  states.activations_peak = a.activations_peak;
  states.workspace = a.workspace;
  states.sum = a.sum;
  states.peak = a.peak;
  states.peak_breakdown = a.peak_breakdown;
  return differences(states, a, "analytic");
}

void compare(RankTrace& r, const MemoryFigures& want) {
  r.differences = differences(r.ledger, want, "analytic");
  r.matches = r.differences.empty();
}

// A rank's figures as 64-bit words (the gather's payload), and back: rank, stage, the
// communication peak, the ledger's figures, then step seconds, tensors, device and allocator
// words, and (expert parallelism) the routed flag and the figures of the rank's own trace.
constexpr std::size_t kFigureWords = 9 + kNumCategories;
constexpr std::size_t kWords = 3 + kFigureWords;
void put_figures(std::vector<std::uint64_t>& w, const MemoryFigures& f) {
  for (std::uint64_t v : {f.params, f.gradients, f.optimizer_states, f.activations,
                          f.activations_peak, f.workspace, f.inputs, f.sum, f.peak})
    w.push_back(v);
  for (Category c : all_categories()) w.push_back(f.peak_breakdown[int(c)]);
}
MemoryFigures get_figures(const std::uint64_t* v) {
  MemoryFigures f;
  f.params = v[0];
  f.gradients = v[1];
  f.optimizer_states = v[2];
  f.activations = v[3];
  f.activations_peak = v[4];
  f.workspace = v[5];
  f.inputs = v[6];
  f.sum = v[7];
  f.peak = v[8];
  for (Category c : all_categories()) f.peak_breakdown[int(c)] = v[9 + std::size_t(c)];
  return f;
}
std::vector<std::uint64_t> pack(const MeasuredRank& m) {
  std::vector<std::uint64_t> w = {std::uint64_t(m.rank), std::uint64_t(m.stage),
                                  m.communication_peak};
  put_figures(w, m.ledger);
  std::uint64_t secs = 0;
  static_assert(sizeof(double) == sizeof(std::uint64_t), "a double travels as one word");
  std::memcpy(&secs, &m.step_seconds, sizeof secs);
  w.push_back(secs);
  w.push_back(m.tensors_at_peak);
  w.push_back(m.device_sources ? 1 : 0);
  w.push_back(m.device_used_peak);
  w.push_back(m.pool_used_peak);
  w.push_back(m.host_bytes);
  w.push_back(m.allocator_modelled ? 1 : 0);
  w.push_back(m.allocator_allocated_peak);
  w.push_back(m.allocator_reserved_peak);
  w.push_back(m.allocator_run_reserved_peak);
  w.push_back(m.routed ? 1 : 0);
  put_figures(w, m.routed_trace);
  return w;
}
MeasuredRank unpack(const std::uint64_t* w) {
  MeasuredRank m;
  m.rank = int(w[0]);
  m.stage = std::int64_t(w[1]);
  m.communication_peak = w[2];
  m.ledger = get_figures(w + 3);
  std::memcpy(&m.step_seconds, &w[kWords], sizeof m.step_seconds);
  m.tensors_at_peak = w[kWords + 1];
  m.device_sources = w[kWords + 2] != 0;
  m.device_used_peak = w[kWords + 3];
  m.pool_used_peak = w[kWords + 4];
  m.host_bytes = w[kWords + 5];
  m.allocator_modelled = w[kWords + 6] != 0;
  m.allocator_allocated_peak = w[kWords + 7];
  m.allocator_reserved_peak = w[kWords + 8];
  m.allocator_run_reserved_peak = w[kWords + 9];
  m.routed = w[kWords + 10] != 0;
  m.routed_trace = get_figures(w + kWords + 11);
  return m;
}

}  // namespace

LayoutTrace trace_layout(const ModelConfig& model, const TrainConfig& train,
                         const ParallelConfig& layout, const OverheadOptions& overheads, int steps,
                         const std::optional<AllocatorSpec>& allocator, std::int64_t grad_rank) {
  LayoutTrace out;
  out.analytic = estimate_layout_of_rank(model, train, layout, grad_rank, overheads);
  out.steps = steps < 1 ? 1 : steps;
  const auto t0 = std::chrono::steady_clock::now();
  for (const RankEstimate& re : out.analytic.ranks) {
    MetaAllocator alloc;
    std::unique_ptr<ModelledAllocator> modelled;
    if (allocator) {
      AllocatorSpec unlimited = *allocator;
      unlimited.config.device_bytes.reset();
      modelled = std::make_unique<ModelledAllocator>(alloc, unlimited);
    }
    // Only the figures are read: no timeline, no tensor records (a trace of thousands of
    // micro-batches would otherwise keep millions of them, for every candidate of maxbatch).
    LedgerOptions books;
    books.timeline_cap = 0;
    books.keep_tensor_records = false;
    Ledger ledger(modelled ? static_cast<Allocator&>(*modelled) : alloc, books);
    ShardedStep step(model, train, layout, re.stage, ledger, nullptr, grad_rank);
    for (int n = 0; n < out.steps; ++n) {
      if (modelled) modelled->begin_step();
      step.train_step();
    }
    RankTrace r;
    if (modelled) r.allocator_model = modelled->result();
    r.stage = re.stage;
    r.ledger = measured_figures(ledger);
    r.communication_peak = ledger.peak(Category::communication);
    r.tensors_at_peak = ledger.peak_live_count();
    compare(r, re.est.figures);
    out.ranks.push_back(std::move(r));
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

void trace_given_routing(LayoutTrace& lt, const LayoutRouting& routing) {
  const ModelConfig& model = lt.analytic.model;
  const TrainConfig& train = lt.analytic.train;
  const ParallelConfig& layout = lt.analytic.layout;
  lt.routing_source = routing.source;
  lt.routed.clear();
  const LayoutRouting balanced = balanced_layout_routing(model, train, layout);
  const std::int64_t cap = rank_capacity(model, train, layout);
  auto most = [](const ShardedStep::ExpertRows& rows) {  // the most rows an expert set computes
    std::int64_t n = 0;
    for (const auto& kv : rows) n = std::max(n, kv.second.r);
    return n;
  };
  const std::int64_t per_stage = layout.world / layout.pp;
  // Ranks of one stage and expert-parallel index whose experts receive the same rows share a
  // trace (the model states are alike: no ZeRO-3 or FSDP2 under a MoE).
  std::map<std::tuple<std::int64_t, std::int64_t, ShardedStep::ExpertRows>, std::size_t> traced;
  for (std::int64_t r = 0; r < layout.world; ++r) {
    const std::int64_t st = r / per_stage, j = r % per_stage;
    ShardedStep::ExpertRows rows = expert_rows_of(routing, model, layout, r, cap);
    const std::int64_t ep_i = j / layout.etp % layout.ep;
    const auto key = std::make_tuple(st, ep_i, rows);
    if (const auto it = traced.find(key); it != traced.end()) {
      lt.routed[it->second].ranks.push_back(r);
      continue;
    }
    MetaAllocator alloc;
    LedgerOptions books;
    books.timeline_cap = 0;
    books.keep_tensor_records = false;
    Ledger ledger(alloc, books);
    ShardedStep step(model, train, layout, st, ledger, nullptr, j);
    step.set_expert_rows(rows);
    for (int n = 0; n < std::max(lt.steps, 1); ++n) step.train_step();
    RoutedRankTrace t;
    t.ranks = {r};
    t.stage = st;
    t.ep_index = ep_i;
    t.max_rows = most(rows);
    t.balanced_rows = most(expert_rows_of(balanced, model, layout, r, cap));
    t.ledger = measured_figures(ledger);
    t.communication_peak = ledger.peak(Category::communication);
    std::size_t k = 0;
    while (k + 1 < lt.analytic.ranks.size() && lt.analytic.ranks[k].stage != st) ++k;
    t.analytic_differences = state_differences(t.ledger, lt.analytic.ranks[k].est.figures);
    traced.emplace(key, lt.routed.size());
    lt.routed.push_back(std::move(t));
  }
}

bool MeasuredLayout::all_match() const {
  if (ranks.empty() || !predicted.all_match()) return false;
  for (const auto& r : ranks)
    if (!r.matches()) return false;
  return true;
}

std::string rank_path(const std::string& path, int rank) {
  const std::size_t slash = path.find_last_of('/');
  const std::size_t dot = path.find_last_of('.');
  const std::string tag = ".rank" + std::to_string(rank);
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + tag;
  return path.substr(0, dot) + tag + path.substr(dot);
}

namespace {

// The rank's data-, tensor-, context- and pipeline-parallel groups, split from the job's
// collectives in Megatron's order of the ranks: the tensor-parallel index fastest, then context,
// then data, then pipeline: rank = ((stage·dp + dp_rank)·cp + cp_rank)·tp + tp_rank. The
// gradient group ("data": the ranks that sum gradients and share ZeRO's shards) holds the dp·cp
// ranks of the same stage and tensor-parallel index, ordered dp_rank·cp + cp_rank. A layout of
// one group each needs no split: the gradient group is the job's.
struct RankGroups {
  std::int64_t stage = 0;
  std::unique_ptr<Collective> dp_data, dp_host, tp_data, tp_host, pp_host, cp_host;
  // A mixture of experts under expert, expert tensor or tensor parallelism: split from the job
  // by the rank's slot in its stage, j = (dp_rank·cp + cp_rank)·tp + tp_rank (Megatron's order:
  // etp_i = j mod etp, ep_i = (j / etp) mod ep, edp_i = j / (etp·ep)): the etp group (the same
  // j / etp, keyed etp_i), the ep group (the same edp_i and etp_i, keyed ep_i), each on the
  // backend's and host buffers, the expert-data-parallel group (the same j mod (ep·etp), keyed
  // edp_i).
  std::unique_ptr<Collective> ep_data, ep_host, etp_data, etp_host, edp_data;
  Collective* dpd = nullptr;  // the gradient group, on the backend's buffers
  Collective* dph = nullptr;  // the gradient group, on host buffers

  RankGroups(const ParallelConfig& layout, bool moe, int rank, Collective& data, Collective& host) {
    const int tp = int(layout.tp), dp = int(layout.dp), pp = int(layout.pp), cp = int(layout.cp);
    const int tp_rank = rank % tp, cp_rank = (rank / tp) % cp, dp_rank = (rank / (tp * cp)) % dp;
    stage = rank / (tp * cp * dp);
    dpd = &data;
    dph = &host;
    const int ep = int(layout.ep), etp = int(layout.etp),
              j = (dp_rank * cp + cp_rank) * tp + tp_rank;
    const bool experts = ep > 1 || etp > 1 || (moe && tp > 1);
    if (tp == 1 && pp == 1 && cp == 1) {
      if (experts) split_experts(data, host, ep, etp, int(stage), tp * cp * dp, j);
      return;
    }
    const int st = int(stage);
    const int dp_color = st * tp + tp_rank, dp_key = dp_rank * cp + cp_rank;
    const int tp_color = (st * dp + dp_rank) * cp + cp_rank;
    dp_data = data.split(dp_color, dp_key);
    tp_data = data.split(tp_color, tp_rank);
    if (&host != &data) {
      dp_host = host.split(dp_color, dp_key);
      tp_host = host.split(tp_color, tp_rank);
    }
    dpd = dp_data.get();
    dph = dp_host ? dp_host.get() : dpd;
    // The pipeline: stages on host buffers (sends and receives of the cpu backend).
    pp_host = host.split((dp_rank * cp + cp_rank) * tp + tp_rank, st);
    // The context-parallel ring, on host buffers likewise.
    cp_host = host.split((st * dp + dp_rank) * tp + tp_rank, cp_rank);
    if (experts) split_experts(data, host, ep, etp, st, tp * cp * dp, j);
  }
  // Every rank of the job calls it (the splits are collective over the job).
  void split_experts(Collective& data, Collective& host, int ep, int etp, int st, int per_stage,
                     int j) {
    const int etp_i = j % etp, ep_i = j / etp % ep, edp_i = j / (etp * ep);
    if (etp > 1) {
      const int color = st * (per_stage / etp) + j / etp;
      etp_data = data.split(color, etp_i);
      etp_host = &host != &data ? host.split(color, etp_i) : nullptr;
    }
    if (ep > 1) {
      const int color = st * (per_stage / ep) + edp_i * etp + etp_i;
      ep_data = data.split(color, ep_i);
      ep_host = &host != &data ? host.split(color, ep_i) : nullptr;
    }
    edp_data = data.split(st * ep * etp + j % (ep * etp), edp_i);
  }
  // Hands the groups over (to be held past a failure, see MeasuredLayout::held_groups).
  void release_into(std::vector<std::shared_ptr<Collective>>& held) {
    for (auto* g : {&dp_data, &dp_host, &tp_data, &tp_host, &pp_host, &cp_host, &ep_data, &ep_host,
                    &etp_data, &etp_host, &edp_data})
      if (*g) held.push_back(std::move(*g));
  }
};

// cuda: the device sources of this rank's GPU (cudaMemGetInfo and the pool; CUPTI off: one
// rank per process, and NCCL's own allocations carry no category anyway). None elsewhere.
std::unique_ptr<ProbeSet> rank_probes(Backend& backend, Ledger& ledger) {
  if (backend.kind() != BackendKind::cuda) return nullptr;
  ProbeOptions o;
  o.device = cuda_current_device();
  o.allocator = &backend.allocator();
  o.ledger = &ledger;
  o.enable_cupti = false;
  auto probes = std::make_unique<ProbeSet>(o);
  probes->mark("after_context");
  ProbeSet* p = probes.get();
  ledger.set_phase_listener([p](Phase phase, bool entering) {
    if (!entering &&
        (phase == Phase::forward || phase == Phase::backward || phase == Phase::optimizer))
      p->phase_end(phase);
  });
  return probes;
}

// --weights, --tokens: every rank reads the files (the same files on every node); `ex` points
// at what this holds.
struct RankFiles {
  std::vector<std::unique_ptr<SafeTensorsReader>> weights;
  std::vector<std::int32_t> ids;

  RankFiles(const MeasureRequest& rq, ShardedExecution& ex) {
    if (!rq.weights.empty()) try {
        for (const std::string& path : weight_files(rq.weights)) {
          weights.push_back(std::make_unique<SafeTensorsReader>(path));
          ex.weights.push_back(weights.back().get());
        }
      } catch (const InputError& e) {
        throw InputError(weights_error(e));
      }
    if (rq.tokens.empty()) return;
    const std::int64_t rows = rq.layout.dp * rq.layout.microbatches * rq.train.batch;
    try {
      ids = load_tokens_file(rq.tokens, rows, rq.train.seq, rq.model.vocab);
    } catch (const InputError& e) {
      throw InputError(
          std::string(e.what()) + "; with --world-size the file holds the global batch, dp·M·b = " +
          std::to_string(rq.layout.dp) + "·" + std::to_string(rq.layout.microbatches) + "·" +
          std::to_string(rq.train.batch) + " = " + std::to_string(rows) + " rows of --seq ids");
    }
    ex.tokens = &ids;
  }
};

// The rank's books after its steps (or up to its failure) and its device sources.
void read_books(MeasuredRank& mine, MeasuredLayout& out, const Ledger& ledger, ProbeSet* probes,
                const ShardedStep* step) {
  if (probes) {
    const MemGetInfoResult mem = probes->memgetinfo();
    const PoolResult pool = probes->pool();
    mine.device_sources = mem.available;
    mine.device_used_peak = mem.available ? mem.sampler_max_used : 0;
    mine.pool_used_peak = pool.available ? pool.used_high : 0;
    if (!mem.available) out.device_reason = mem.reason;
  }
  mine.ledger = measured_figures(ledger);
  if (out.failure) {  // up to the failure: what the setup reached, even if unwinding freed it
    mine.ledger.params = ledger.peak(Category::params);
    mine.ledger.optimizer_states = ledger.peak(Category::optimizer_states);
    mine.ledger.inputs = ledger.peak(Category::inputs);
  }
  mine.host_bytes = step ? step->host_bytes() : 0;
  mine.communication_peak = ledger.peak(Category::communication);
  mine.tensors_at_peak = ledger.peak_live_count();
}

// Every rank's figures to every rank (words through the host collective), each checked against
// its stage's trace and analytic profile.
void gather_ranks(MeasuredLayout& out, const MeasuredRank& mine, Collective& host,
                  const MeasureRequest& rq) {
  const std::vector<std::uint64_t> words = pack(mine);
  std::vector<std::uint64_t> all(words.size() * std::size_t(host.size()));
  host.all_gather(words.data(), all.data(), words.size() * 2, DType::f32);
  // Per-parameter sharding: the ranks of a stage differ in their owned rows, so a rank other
  // than the gradient group's first is checked against a trace of its own index.
  std::map<std::int64_t, LayoutTrace> of_rank;
  for (int r = 0; r < host.size(); ++r) {
    MeasuredRank m = unpack(all.data() + std::size_t(r) * words.size());
    const LayoutTrace* pred = &out.predicted;
    const std::int64_t tp = rq.layout.tp, cp = rq.layout.cp;
    const std::int64_t g = (m.rank / (tp * cp)) % rq.layout.dp * cp + (m.rank / tp) % cp;
    if (rq.layout.per_parameter() && g != 0) {
      auto it = of_rank.find(g);
      if (it == of_rank.end())
        it = of_rank
                 .emplace(g, trace_layout(rq.model, rq.train, rq.layout, rq.overheads, out.steps,
                                          rq.allocator, g))
                 .first;
      pred = &it->second;
    }
    std::size_t k = 0;
    while (k + 1 < pred->ranks.size() && pred->ranks[k].stage != m.stage) ++k;
    const MemoryFigures& a = pred->analytic.ranks[k].est.figures;
    if (!m.routed) {
      m.trace_differences = differences(m.ledger, pred->ranks[k].ledger, "meta trace");
      m.analytic_differences = differences(m.ledger, a, "analytic");
    } else {  // expert parallelism: the routing-dependent books against the rank's own trace
      m.trace_differences = differences(m.ledger, m.routed_trace, "meta trace given its routing");
      m.analytic_differences = state_differences(m.ledger, a);
    }
    // The same allocations in the same order: the trace's model holds what this rank's did.
    if (m.allocator_modelled && pred->ranks[k].allocator_model) {
      const CachingAllocatorStats& t = pred->ranks[k].allocator_model->step;
      if (m.allocator_reserved_peak != t.reserved.peak)
        m.trace_differences.push_back("allocator reserved peak: measured " +
                                      std::to_string(m.allocator_reserved_peak) + ", meta trace " +
                                      std::to_string(t.reserved.peak));
      if (m.allocator_allocated_peak != t.allocated.peak)
        m.trace_differences.push_back("allocator allocated peak: measured " +
                                      std::to_string(m.allocator_allocated_peak) + ", meta trace " +
                                      std::to_string(t.allocated.peak));
    }
    const std::uint64_t host_want = pred->analytic.ranks[k].host_bytes;
    if (m.host_bytes != host_want)
      m.analytic_differences.push_back("host bytes (--offload): measured " +
                                       std::to_string(m.host_bytes) + ", analytic " +
                                       std::to_string(host_want));
    out.ranks.push_back(std::move(m));
  }
}

// Every rank's choices of the last step to every rank: M·(L/pp)·E words each, its stage's layers
// (zero where one is not a MoE layer), through the host collective.
LayoutRouting gather_routing(const MeasureRequest& rq, const ShardedStep::SourceCounts& mine,
                             Collective& host) {
  const ModelConfig& m = rq.model;
  const std::int64_t M = rq.layout.microbatches, Ls = m.layers / rq.layout.pp, E = m.experts;
  const std::int64_t per_stage = rq.layout.world / rq.layout.pp;
  const std::size_t n = std::size_t(
      checked_product({std::uint64_t(M), std::uint64_t(Ls), std::uint64_t(E)}, "routing words"));
  // Word of (micro-batch, local layer k): (mb·Ls + k)·E.
  auto at = [&](std::int64_t mb, std::int64_t k) { return std::size_t((mb * Ls + k) * E); };
  std::vector<std::uint64_t> words(n, 0), all(n * std::size_t(host.size()));
  const std::int64_t my_first = host.rank() / per_stage * Ls;
  for (const auto& [key, counts] : mine)
    for (std::int64_t e = 0; e < E && std::size_t(e) < counts.size(); ++e)
      words[at(key.first, key.second - my_first) + std::size_t(e)] =
          std::uint64_t(counts[std::size_t(e)]);
  host.all_gather(words.data(), all.data(), n * 2, DType::f32);
  LayoutRouting out;
  out.source = "measured";
  for (std::int64_t r = 0; r < host.size(); ++r) {
    const std::int64_t first = r / per_stage * Ls;
    for (std::int64_t mb = 0; mb < M; ++mb) {
      SourceRouting src{r, mb, {}};
      for (std::int64_t k = 0; k < Ls; ++k) {
        if (!m.is_moe_layer(first + k)) continue;
        const std::uint64_t* w = all.data() + std::size_t(r) * n + at(mb, k);
        src.layers.push_back({first + k, std::vector<std::int64_t>(w, w + E), 0});
      }
      out.sources.push_back(std::move(src));
    }
  }
  return out;
}

}  // namespace

MeasuredLayout measure_layout(const MeasureRequest& rq, Backend& backend, Collective& data,
                              Collective& host) {
  MeasuredLayout out;
  out.backend = backend_name(backend.kind());
  out.collective = data.backend();
  out.steps = rq.steps < 1 ? 1 : rq.steps;
  out.seed = rq.seed;
  out.weights = rq.weights;
  out.tokens = rq.tokens;
  out.predicted =
      trace_layout(rq.model, rq.train, rq.layout, rq.overheads, out.steps, rq.allocator);

  MeasuredRank mine;
  mine.rank = host.rank();
  RankGroups groups(rq.layout, rq.model.moe(), mine.rank, data, host);
  mine.stage = groups.stage;
  std::vector<double> seconds;
  ShardedStep::SourceCounts my_routing;
  {
    std::unique_ptr<ModelledAllocator> modelled;
    std::unique_ptr<BudgetAllocator> budget;
    if (rq.allocator) {
      AllocatorSpec allocator = *rq.allocator;
      allocator.config.device_bytes = rq.device_budget;
      modelled = std::make_unique<ModelledAllocator>(backend.allocator(), allocator);
    } else if (rq.device_budget) {
      budget = std::make_unique<BudgetAllocator>(backend.allocator(), *rq.device_budget);
    }
    Ledger ledger(modelled ? static_cast<Allocator&>(*modelled)
                  : budget ? static_cast<Allocator&>(*budget)
                           : backend.allocator());
    std::unique_ptr<ProbeSet> probes = rank_probes(backend, ledger);
    ShardedExecution ex{backend, *groups.dpd, *groups.dph, rq.seed,
                        default_optimizer_settings(rq.train.optimizer)};
    if (rq.layout.tp > 1) {
      ex.tp = groups.tp_data.get();
      ex.tp_host = groups.tp_host ? groups.tp_host.get() : groups.tp_data.get();
    }
    if (rq.layout.pp > 1) ex.pp = groups.pp_host.get();
    if (rq.layout.cp > 1) ex.cp = groups.cp_host.get();
    if (groups.edp_data) {
      ex.ep = groups.ep_data.get();
      ex.ep_host = groups.ep_host ? groups.ep_host.get() : groups.ep_data.get();
      ex.edp = groups.edp_data.get();
      ex.etp = groups.etp_data.get();
      ex.etp_host = groups.etp_host ? groups.etp_host.get() : groups.etp_data.get();
    }
    const RankFiles files(rq, ex);
    // Kept past an out-of-memory, so that what was alive is still in the books when read.
    std::unique_ptr<ShardedStep> step;
    std::uint64_t step_first_seq = 0;
    int steps_done = 0;
    try {
      step = std::make_unique<ShardedStep>(rq.model, rq.train, rq.layout, mine.stage, ledger, &ex);
      for (int n = 0; n < out.steps; ++n) {
        step_first_seq = ledger.timeline().size() + ledger.dropped_events() + 1;
        const auto t0 = std::chrono::steady_clock::now();
        if (probes) probes->begin_step(n + 1);
        if (modelled) modelled->begin_step();
        out.losses.push_back(step->train_step());
        if (!std::isfinite(out.losses.back()))
          spdlog::warn("rank {}: step {}: the loss is {} (not finite)", mine.rank, n + 1,
                       std::isnan(out.losses.back()) ? "NaN" : "Inf");
        backend.synchronize();
        if (probes) probes->end_step();
        seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        steps_done = n + 1;
      }
    } catch (const OutOfMemory& e) {
      out.failure = failure_of(e, step ? steps_done + 1 : 0, ledger);
      out.failure_error = std::current_exception();
      out.losses.clear();
    }
    if (probes) ledger.set_phase_listener(nullptr);
    read_books(mine, out, ledger, probes.get(), step.get());
    // Expert parallelism (and expert tensor parallelism under a capacity, whose drops make the
    // gathered rows follow the routing): the rank's own trace, given the rows its experts
    // received.
    const bool routed_rows =
        rq.layout.ep > 1 || (rq.layout.etp > 1 && rq.train.capacity_factor > 0);
    if (routed_rows && step && !out.failure) {
      MetaAllocator meta;
      Ledger traced(meta);
      // Its slot in the stage (a MoE under tp: the tensor-parallel index too).
      const std::int64_t g =
          rq.layout.tp > 1 ? mine.rank % (rq.layout.world / rq.layout.pp) : groups.dpd->rank();
      ShardedStep trace(rq.model, rq.train, rq.layout, mine.stage, traced, nullptr, g);
      trace.set_expert_rows(step->expert_rows());
      for (int n = 0; n < out.steps; ++n) trace.train_step();
      mine.routed = true;
      mine.routed_trace = measured_figures(traced);
    }
    if (step && !out.failure) my_routing = step->routed();
    if (modelled) {
      const AllocatorModelResult a = modelled->result();
      mine.allocator_modelled = true;
      mine.allocator_allocated_peak = a.step.allocated.peak;
      mine.allocator_reserved_peak = a.step.reserved.peak;
      mine.allocator_run_reserved_peak = a.run_reserved_peak;
    }
    if (rq.keep_timeline && !ledger.timeline().empty())
      out.timeline = build_timeline(
          ledger.timeline(), ledger.tensors(), step_first_seq, TimeAxis::wall,
          "rank " + std::to_string(mine.rank) + " of " + std::to_string(host.size()) + ", step " +
              std::to_string(out.failure ? out.failure->step : out.steps),
          ledger.dropped_events(), ledger.phase_marks());
  }
  if (out.failure) {  // this rank's partial books alone: the others may never gather
    groups.release_into(out.held_groups);
    out.ranks.push_back(std::move(mine));
    return out;
  }
  std::sort(seconds.begin(), seconds.end());
  mine.step_seconds = seconds[seconds.size() / 2];
  gather_ranks(out, mine, host, rq);
  if (rq.gather_routing && rq.model.moe()) out.routing = gather_routing(rq, my_routing, host);
  return out;
}

MeasuredLayout measure_layout_and_timeline(const MeasureRequest& rq, const std::string& timeline,
                                           Backend& backend, Collective& data, Collective& host) {
  MeasuredLayout ml = measure_layout(rq, backend, data, host);
  if (!ml.timeline) return ml;
  const std::string path = rank_path(timeline, host.rank());
  try {
    write_timeline(path, *ml.timeline);
    spdlog::info("rank {}: wrote {}", host.rank(), path);
  } catch (const std::exception& e) {
    if (!ml.failure) throw;
    spdlog::error("rank {}: the timeline was not written: {}", host.rank(), e.what());
  }
  return ml;
}

}  // namespace trainmem
