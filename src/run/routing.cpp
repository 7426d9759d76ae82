// A mixture of experts' routing as data (include/trainmem/run/routing.hpp).
#include "trainmem/run/routing.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/input_file.hpp"

namespace trainmem {

namespace {

// A routing file read and checked field by field: InputError "--routing PATH: <field>: ...".
struct RoutingDoc {
  std::string who;
  nlohmann::json d;
  const char* whose;  // "this run" or "this layout"
  RoutingDoc(const std::string& path, const char* whose_)
      : who("--routing " + path), whose(whose_) {
    d = parse_json_strict(read_input_file(path, "--routing", kMaxConfigBytes), who);
    if (!d.is_object()) throw fail("the document", "not a JSON object (a --dump-routing file)");
  }
  InputError fail(const std::string& field, const std::string& what) const {
    return InputError(who + ": " + field + ": " + what);
  }
  std::int64_t integer(const nlohmann::json& v, const std::string& field) const {
    if (!v.is_number_integer()) throw fail(field, "not an integer: " + clip(v.dump()));
    return v.get<std::int64_t>();
  }
  // o[key] (at: its path's prefix) must be `want`, the value of `flag`.
  void must_equal(const nlohmann::json& o, const std::string& at, const char* key,
                  std::int64_t want, const std::string& flag) const {
    if (!o.contains(key)) throw fail(at + key, "missing");
    const std::int64_t got = integer(o[key], at + key);
    if (got != want)
      throw fail(at + key, std::to_string(got) + ", but " + whose + " has " + flag + " " +
                               std::to_string(want));
  }
  // The "layers" array of `o` (the document's, or one of its sources'; at: its path's prefix):
  // one entry per layer of `moe_layers` in order, each expert's count in [0, tokens], each
  // layer's sum tokens·K; `bs` names the tokens in messages.
  Routing layers(const nlohmann::json& o, const std::string& prefix,
                 const std::vector<std::int64_t>& moe_layers, const ModelConfig& m,
                 std::int64_t tokens, std::int64_t capacity, const std::string& bs = "b·s") const {
    if (!o.contains("layers") || !o["layers"].is_array())
      throw fail(prefix + "layers", "missing or not an array");
    const nlohmann::json& layers = o["layers"];
    if (layers.size() != moe_layers.size())
      throw fail(prefix + "layers", std::to_string(layers.size()) + " entries, but " +
                                        (prefix.empty() ? m.name : "its stage") + " has " +
                                        std::to_string(moe_layers.size()) + " MoE layers");
    const std::int64_t choices = tokens * m.experts_per_token;
    Routing out;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const std::string at = prefix + "layers[" + std::to_string(l) + "]";
      const nlohmann::json& layer = layers[l];
      if (!layer.is_object() || !layer.contains("layer") || !layer.contains("tokens_per_expert"))
        throw fail(at, "not an object with \"layer\" and \"tokens_per_expert\"");
      if (integer(layer["layer"], at + ".layer") != moe_layers[l])
        throw fail(at + ".layer", clip(layer["layer"].dump()) + ", expected " +
                                      std::to_string(moe_layers[l]) +
                                      " (one entry per MoE layer, in order)");
      const nlohmann::json& counts = layer["tokens_per_expert"];
      if (!counts.is_array() || std::int64_t(counts.size()) != m.experts)
        throw fail(at + ".tokens_per_expert",
                   "not an array of " + std::to_string(m.experts) + " counts (one per expert)");
      std::vector<std::int64_t> row;
      std::int64_t sum = 0;
      for (std::size_t e = 0; e < counts.size(); ++e) {
        const std::int64_t c =
            integer(counts[e], at + ".tokens_per_expert[" + std::to_string(e) + "]");
        if (c < 0 || c > tokens)
          throw fail(at + ".tokens_per_expert[" + std::to_string(e) + "]",
                     std::to_string(c) + " is outside [0, " + bs + " = " + std::to_string(tokens) +
                         "] (a token picks K distinct experts)");
        sum += c;
        row.push_back(c);
      }
      if (sum != choices)
        throw fail(at + ".tokens_per_expert",
                   "sums to " + std::to_string(sum) + ", but " +
                       (prefix.empty() ? bs + "·K" : "this rank's " + bs + "·K") + " = " +
                       std::to_string(choices) + " choices are routed in every layer");
      const std::int64_t dropped = dropped_choices(row, capacity);
      out.push_back({moe_layers[l], std::move(row), dropped});
    }
    return out;
  }
};

}  // namespace

Routing balanced_routing(const ModelConfig& m, const TrainConfig& t) {
  const std::int64_t E = m.experts, choices = t.batch * t.seq * m.experts_per_token;
  std::vector<std::int64_t> counts(std::size_t(E), choices / E);
  for (std::int64_t e = 0; e < choices % E; ++e) ++counts[std::size_t(e)];
  Routing out;
  for (std::int64_t l = 0; l < m.layers; ++l)
    if (m.is_moe_layer(l)) out.push_back({l, counts, dropped_choices(counts, moe_capacity(m, t))});
  return out;
}

Routing read_routing_file(const std::string& path, const ModelConfig& m, const TrainConfig& t) {
  const RoutingDoc doc(path, "this run");
  const nlohmann::json& d = doc.d;
  if (d.contains("sources"))
    throw doc.fail("sources",
                   "a per-rank file (a measured --world-size run's --dump-routing): give "
                   "it to a trace of that layout (--world-size, --pp, --cp, "
                   "--microbatches as it says)");
  doc.must_equal(d, "", "experts", m.experts, m.name + "'s num_local_experts");
  doc.must_equal(d, "", "experts_per_token", m.experts_per_token,
                 m.name + "'s num_experts_per_tok");
  doc.must_equal(d, "", "batch", t.batch, "--batch");
  doc.must_equal(d, "", "seq", t.seq, "--seq");
  std::vector<std::int64_t> moe_layers;
  for (std::int64_t l = 0; l < m.layers; ++l)
    if (m.is_moe_layer(l)) moe_layers.push_back(l);
  return doc.layers(d, "", moe_layers, m, t.batch * t.seq, moe_capacity(m, t));
}

namespace {

std::int64_t ranks_per_stage(const ParallelConfig& p) {
  return p.world / p.pp;
}

// The positions a rank routes: s/cp, and under sequence parallelism its s/(cp·tp) rows.
std::int64_t rank_seq(const ParallelConfig& p, std::int64_t seq) {
  return p.local_seq(seq) / (p.sp ? p.tp : 1);
}
std::string rank_seq_letters(const ParallelConfig& p) {
  const bool sp = p.sp && p.tp > 1;
  return p.cp > 1 ? (sp ? "s/(cp·tp)" : "s/cp") : (sp ? "s/tp" : "s");
}

// The MoE layers of pipeline stage `st` (layers % pp == 0: resolve), ascending.
std::vector<std::int64_t> stage_moe_layers(const ModelConfig& m, const ParallelConfig& p,
                                           std::int64_t st) {
  const std::int64_t Ls = m.layers / p.pp;
  std::vector<std::int64_t> v;
  for (std::int64_t l = st * Ls; l < (st + 1) * Ls; ++l)
    if (m.is_moe_layer(l)) v.push_back(l);
  return v;
}

// `one` (every MoE layer's choices) as every rank's, in every micro-batch: each takes its
// stage's layers.
LayoutRouting every_source(const Routing& one, const ModelConfig& m, const ParallelConfig& p) {
  LayoutRouting out;
  for (std::int64_t r = 0; r < p.world; ++r) {
    const std::vector<std::int64_t> mine = stage_moe_layers(m, p, r / ranks_per_stage(p));
    for (std::int64_t mb = 0; mb < p.microbatches; ++mb) {
      SourceRouting src{r, mb, {}};
      for (const auto& rec : one)
        if (std::find(mine.begin(), mine.end(), rec.layer) != mine.end()) src.layers.push_back(rec);
      out.sources.push_back(std::move(src));
    }
  }
  return out;
}

}  // namespace

LayoutRouting read_layout_routing_file(const std::string& path, const ModelConfig& m,
                                       const TrainConfig& t, const ParallelConfig& layout) {
  const RoutingDoc doc(path, "this layout");
  const nlohmann::json& d = doc.d;
  doc.must_equal(d, "", "experts", m.experts, m.name + "'s num_local_experts");
  doc.must_equal(d, "", "experts_per_token", m.experts_per_token,
                 m.name + "'s num_experts_per_tok");
  doc.must_equal(d, "", "batch", t.batch, "--batch");
  const std::int64_t ls = rank_seq(layout, t.seq), tokens = t.batch * ls;
  // --capacity-factor: each rank's capacity over its own tokens, what it drops.
  const std::int64_t cap = rank_capacity(m, t, layout);
  const std::int64_t per_stage = ranks_per_stage(layout), M = layout.microbatches;
  LayoutRouting out;
  out.source = "file " + path;
  if (!d.contains("sources")) {  // one rank's file (a single-GPU --dump-routing): every source
    if (!d.contains("seq")) throw doc.fail("seq", "missing");
    if (doc.integer(d["seq"], "seq") != ls)
      throw doc.fail("seq",
                     clip(d["seq"].dump()) + ", but a rank of this layout routes " +
                         rank_seq_letters(layout) + " = " + std::to_string(ls) +
                         " positions; a one-rank file is applied to every rank and "
                         "micro-batch, so its seq must be a rank's (or give the per-rank file "
                         "a measured --world-size run's --dump-routing writes)");
    std::vector<std::int64_t> all;
    for (std::int64_t l = 0; l < m.layers; ++l)
      if (m.is_moe_layer(l)) all.push_back(l);
    const Routing one = doc.layers(d, "", all, m, tokens, cap, "b·" + rank_seq_letters(layout));
    LayoutRouting every = every_source(one, m, layout);
    every.source = out.source;
    return every;
  }
  doc.must_equal(d, "", "seq", t.seq, "--seq");
  doc.must_equal(d, "", "world_size", layout.world, "--world-size");
  doc.must_equal(d, "", "pp", layout.pp, "--pp");
  doc.must_equal(d, "", "cp", layout.cp, "--cp");
  doc.must_equal(d, "", "microbatches", M, "--microbatches");
  const nlohmann::json& sources = d["sources"];
  const std::int64_t want = layout.world * M;
  if (!sources.is_array() || std::int64_t(sources.size()) != want)
    throw doc.fail("sources", "not an array of world_size·microbatches = " + std::to_string(want) +
                                  " entries (one per rank and micro-batch)");
  std::vector<char> seen(std::size_t(want), 0);
  for (std::size_t k = 0; k < sources.size(); ++k) {
    const std::string at = "sources[" + std::to_string(k) + "].";
    const nlohmann::json& o = sources[k];
    if (!o.is_object()) throw doc.fail("sources[" + std::to_string(k) + "]", "not an object");
    for (const char* key : {"rank", "micro_batch"})
      if (!o.contains(key)) throw doc.fail(at + key, "missing");
    const std::int64_t r = doc.integer(o["rank"], at + "rank");
    const std::int64_t mb = doc.integer(o["micro_batch"], at + "micro_batch");
    if (r < 0 || r >= layout.world)
      throw doc.fail(at + "rank",
                     std::to_string(r) + " is outside [0, " + std::to_string(layout.world) + ")");
    if (mb < 0 || mb >= M)
      throw doc.fail(at + "micro_batch",
                     std::to_string(mb) + " is outside [0, " + std::to_string(M) + ")");
    char& once = seen[std::size_t(r * M + mb)];
    if (once)
      throw doc.fail(at + "rank", "rank " + std::to_string(r) + ", micro-batch " +
                                      std::to_string(mb) + " is given twice");
    once = 1;
    out.sources.push_back({r, mb,
                           doc.layers(o, at, stage_moe_layers(m, layout, r / per_stage), m, tokens,
                                      cap, "b·" + rank_seq_letters(layout))});
  }
  std::sort(out.sources.begin(), out.sources.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.rank, a.micro_batch) < std::make_pair(b.rank, b.micro_batch);
  });
  return out;
}

LayoutRouting balanced_layout_routing(const ModelConfig& m, const TrainConfig& t,
                                      const ParallelConfig& layout) {
  TrainConfig rank = t;
  rank.seq = rank_seq(layout, t.seq);
  return every_source(balanced_routing(m, rank), m, layout);
}

nlohmann::json layout_routing_json(const ModelConfig& m, const TrainConfig& t,
                                   const ParallelConfig& layout, const LayoutRouting& r, int step) {
  nlohmann::json sources = nlohmann::json::array();
  for (const SourceRouting& src : r.sources) {
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& rec : src.layers)
      layers.push_back({{"layer", rec.layer}, {"tokens_per_expert", rec.tokens_per_expert}});
    sources.push_back({{"rank", src.rank}, {"micro_batch", src.micro_batch}, {"layers", layers}});
  }
  return {{"model", m.name},
          {"batch", t.batch},
          {"seq", t.seq},
          {"experts", m.experts},
          {"experts_per_token", m.experts_per_token},
          {"world_size", layout.world},
          {"pp", layout.pp},
          {"cp", layout.cp},
          {"ep", layout.ep},
          {"etp", layout.etp},
          {"microbatches", layout.microbatches},
          {"step", step},
          {"source", r.source},
          {"sources", sources},
          {"note",
           "the choices each rank's b*seq/cp tokens (b*seq/(cp*tp) under sequence parallelism) "
           "routed to every global expert, per "
           "micro-batch and MoE layer of its stage, in the step's forward; `profile --backend "
           "meta --routing FILE` traces every rank given them, at this ep or another that the "
           "layout allows"}};
}

std::int64_t rank_capacity(const ModelConfig& m, const TrainConfig& t, const ParallelConfig& p) {
  return moe_capacity_of(m, t.capacity_factor,
                         std::int64_t(checked_mul(std::uint64_t(t.batch),
                                                  std::uint64_t(rank_seq(p, t.seq)), "tokens")));
}

ShardedStep::ExpertRows expert_rows_of(const LayoutRouting& r, const ModelConfig& m,
                                       const ParallelConfig& layout, std::int64_t rank,
                                       std::int64_t capacity) {
  const std::int64_t per_stage = ranks_per_stage(layout), st = rank / per_stage;
  const std::int64_t j = rank % per_stage, ep = layout.ep, etp = layout.etp, El = m.experts / ep;
  const std::int64_t ep_i = j / etp % ep, etp_i = j % etp, block = j - j % (ep * etp);
  std::map<std::pair<std::int64_t, std::int64_t>, const SourceRouting*> of;
  for (const SourceRouting& src : r.sources) of[{src.rank, src.micro_batch}] = &src;
  ShardedStep::ExpertRows rows;
  // Every slot of j's block of ep·etp (the same expert-data-parallel index) routes to j's
  // experts; the ep group's (the same etp index) arrive by the all-to-all (a), all of them by
  // the etp gather too (r).
  for (std::int64_t k = 0; k < ep * etp; ++k) {
    const std::int64_t peer = st * per_stage + block + k;
    const bool mine = k % etp == etp_i;
    for (std::int64_t mb = 0; mb < layout.microbatches; ++mb) {
      const auto it = of.find({peer, mb});
      if (it == of.end())
        throw Error("routing per rank: no source for rank " + std::to_string(peer) +
                    ", micro-batch " + std::to_string(mb));
      for (const auto& rec : it->second->layers) {
        ShardedStep::DispatchRows& n = rows[{mb, int(rec.layer)}];
        for (std::int64_t e = ep_i * El; e < (ep_i + 1) * El; ++e) {
          // The source sends the choices its capacity keeps (the file counts them all).
          const std::int64_t c = rec.tokens_per_expert[std::size_t(e)];
          const std::int64_t kept = capacity > 0 ? std::min(c, capacity) : c;
          n.r += kept;
          if (mine) n.a += kept;
        }
      }
    }
  }
  return rows;
}

std::int64_t dropped_choices(const std::vector<std::int64_t>& routed, std::int64_t capacity) {
  if (capacity <= 0) return 0;
  std::int64_t dropped = 0;
  for (std::int64_t c : routed) dropped += c > capacity ? c - capacity : 0;
  return dropped;
}

}  // namespace trainmem
