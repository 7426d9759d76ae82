// The HuggingFace step event by event (include/trainmem/analytic/hf_step.hpp; docs/hf-step.md).
//
// A small simulation of what PyTorch does, written from transformers 5.25's modeling_llama.py
// (and its Mistral, Qwen2 and Qwen3 siblings), autograd's rules and torch.optim.AdamW, and
// checked against the real step's allocation trace (docs/hf-step-measured.md):
//   - every tensor carries a reference count: a Python name, a saved-tensor slot of an autograd
//     node, the autocast cache, a checkpoint frame, the training loop's `out`; the tensor is freed
//     when the count reaches zero, as CPython and the caching allocator free it;
//   - forward ops allocate their outputs in the order the modelling code runs them; a node keeps
//     what autograd saves for it (the per-op rules at the top of analytic_hf.cpp) and releases
//     it when the node has run in backward;
//   - backward runs the nodes in reverse creation order (the engine's order on one device); each
//     allocates its gradient outputs, then drops its incoming gradient and its saved tensors;
//     gradients meeting at a tensor are added in place when the buffer is the only owner and
//     not a view, out of place otherwise (torch/csrc/autograd/input_buffer.cpp);
//   - a parameter's first gradient becomes its `.grad` (AccumulateGrad steals it).
#include "trainmem/analytic/hf_step.hpp"

#include <algorithm>
#include <map>

#include "trainmem/base/checked.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::pure:
      return "pure";
    case Precision::amp:
      return "amp";
    case Precision::mixed:
      return "mixed";
  }
  return "?";
}
std::optional<Precision> parse_precision(const std::string& s) {
  for (auto p : {Precision::pure, Precision::amp, Precision::mixed})
    if (s == precision_name(p)) return p;
  return std::nullopt;
}
const char* adamw_impl_name(AdamwImpl a) {
  switch (a) {
    case AdamwImpl::foreach_:
      return "foreach";
    case AdamwImpl::fused:
      return "fused";
    case AdamwImpl::forloop:
      return "forloop";
  }
  return "?";
}
std::optional<AdamwImpl> parse_adamw_impl(const std::string& s) {
  for (auto a : {AdamwImpl::foreach_, AdamwImpl::fused, AdamwImpl::forloop})
    if (s == adamw_impl_name(a)) return a;
  return std::nullopt;
}
const char* hf_step_phase_name(HfStepPhase p) {
  static const char* const names[kHfStepPhases] = {"forward",   "loss",      "backward",
                                                   "optimizer", "zero_grad", "autocast_exit"};
  return names[static_cast<int>(p)];
}
Category hf_step_category(HfStepKind k) {
  switch (k) {
    case HfStepKind::parameter:
      return Category::params;
    case HfStepKind::gradient:
      return Category::gradients;
    case HfStepKind::optimizer_state:
    case HfStepKind::master_param:
      return Category::optimizer_states;
    case HfStepKind::temporary:
    case HfStepKind::master_grad:  // made for the optimizer step and freed by zero_grad
      return Category::workspace;
    case HfStepKind::input:
      return Category::inputs;
    case HfStepKind::communication:
      return Category::communication;
    case HfStepKind::activation:
    case HfStepKind::autocast_cache:
    case HfStepKind::buffer:
      break;
  }
  return Category::activations;
}

CategoryBytes hf_step_categories(const std::array<std::uint64_t, kHfStepKinds>& by_kind) {
  CategoryBytes c{};
  for (int k = 0; k < kHfStepKinds; ++k)
    c[static_cast<int>(hf_step_category(static_cast<HfStepKind>(k)))] += by_kind[k];
  return c;
}

CategoryBytes hf_step_category_maxima(const HfStep& st) {
  CategoryBytes live = hf_step_categories(st.start_by_kind), most = live;
  for (const HfStepEvent& e : st.events) {
    const HfStepTensor& t = st.tensors[e.tensor];
    std::uint64_t& c = live[static_cast<int>(hf_step_category(t.kind))];
    c = e.alloc ? c + t.bytes : c - t.bytes;
    for (int k = 0; k < kNumCategories; ++k) most[k] = std::max(most[k], live[k]);
  }
  return most;
}

const char* hf_step_kind_name(HfStepKind k) {
  static const char* const names[kHfStepKinds] = {"parameter",    "gradient",     "optimizer_state",
                                                  "activation",   "temporary",    "autocast_cache",
                                                  "master_param", "master_grad",  "input",
                                                  "buffer",       "communication"};
  return names[static_cast<int>(k)];
}

Precision HfOptions::recipe(DType dtype) const {
  if (precision) return *precision;
  return dtype_size(dtype) == 2 ? Precision::mixed : Precision::pure;
}

namespace {

using u64 = std::uint64_t;
using Id = std::uint32_t;
constexpr Id kNone = 0xffffffffu;

// The reference-counted tensors and the event list.
class Sim {
 public:
  explicit Sim(HfStep& st) : st_(st) {}
  HfStepPhase phase = HfStepPhase::forward;
  bool started = false;  // false: tensors alive when the step begins (no event)
  int layer = -1;        // the layer new tensors are booked to

  Id alloc(u64 bytes, const std::string& name, HfStepKind kind = HfStepKind::activation) {
    const Id id = static_cast<Id>(st_.tensors.size());
    st_.tensors.push_back(HfStepTensor{name, layer, bytes, kind});
    refs_.push_back(1);
    view_.push_back(false);
    if (started) {
      st_.events.push_back(HfStepEvent{true, id, phase});
    } else {
      st_.live_at_start = checked_add(st_.live_at_start, bytes, "live bytes");
      st_.start_by_kind[static_cast<int>(kind)] += bytes;
    }
    return id;
  }
  Id ref(Id id) {
    if (id != kNone) ++refs_[id];
    return id;
  }
  void drop(Id id) {
    if (id == kNone) return;
    if (refs_[id] <= 0) throw Error("hf_step: tensor " + st_.tensors[id].name + " freed twice");
    if (--refs_[id] == 0) st_.events.push_back(HfStepEvent{false, id, phase});
  }
  u64 bytes(Id id) const { return st_.tensors[id].bytes; }
  void set_view(Id id, bool v) { view_[id] = v; }
  void set_kind(Id id, HfStepKind k) { st_.tensors[id].kind = k; }

  // Adds gradient `g` into the buffer `buf` (an InputBuffer slot): the first gradient is stored;
  // a later one is added in place when one side is the buffer's only owner and not a view
  // (the other is then freed), out of place otherwise.
  void accumulate(Id& buf, Id g) {
    if (g == kNone) return;
    if (buf == kNone) {
      buf = g;
      return;
    }
    if (refs_[buf] == 1 && !view_[buf]) {
      drop(g);
    } else if (refs_[g] == 1 && !view_[g]) {
      drop(buf);
      buf = g;
    } else {
      const Id sum = alloc(bytes(buf), "grad.sum", HfStepKind::temporary);
      drop(buf);
      drop(g);
      buf = sum;
    }
  }

 private:
  HfStep& st_;
  std::vector<int> refs_;
  std::vector<bool> view_;
};

// The step's sizes. Widths: pw the parameters' (and the residual stream's), aw the matmuls'
// (the 16-bit dtype under autocast, pw otherwise).
struct D {
  u64 b, s, h, i, a, k, d, V, L;
  u64 pw, aw;
  bool amp, sdpa, ckpt, cache, bias, qkn, tied, cpu;
  u64 bs() const { return b * s; }
  u64 tok(u64 n, u64 w) const {
    return checked_mul(checked_mul(b * s, n, "activation"), w, "bytes");
  }
  u64 scores(u64 w) const { return checked_product({b, a, s, s, w}, "attention scores"); }
};

struct Param {
  std::string name;
  u64 elems;
  u64 rows = 0, cols = 0;  // dim 0 and the product of the others (FSDP2 shards dim 0)
  int unit = -1;           // FSDP2 unit: the decoder layer, -1 the root
  Id grad = kNone;         // .grad (or the master gradient's source under mixed)
  Id cast = kNone;         // autocast's cached 16-bit copy
  Id full = kNone;         // FSDP2: the unsharded parameter (its all-gather output)
};

// PyTorch FSDP2's per-parameter sharding over n ranks (docs/distributed.md, "FSDP2"): dim 0 in
// torch.chunk's ceil(rows / n)-row chunks; rank k owns rows(k), the last owners fewer or none;
// every rank's shard is padded to a whole chunk, and a gathered parameter to n chunks.
struct Shard {
  u64 n = 1, k = 0;
  u64 chunk(const Param& p) const { return (p.rows + n - 1) / n; }
  u64 padded_elems(const Param& p) const { return checked_mul(chunk(p), p.cols, "elements"); }
  u64 local_elems(const Param& p) const {
    const u64 c = chunk(p), start = checked_mul(k, c, "rows");
    const u64 rows = start >= p.rows ? 0 : std::min(c, p.rows - start);
    return checked_mul(rows, p.cols, "elements");
  }
  u64 unsharded_elems(const Param& p) const { return checked_mul(n, padded_elems(p), "elements"); }
};

// A linear layer's saved tensors (its input as the mm sees it and, under autocast, the cached
// weight copy), and whether the input was cast.
struct LinSaved {
  Id x = kNone, w = kNone;
  bool cast_input = false;
};
struct NormSaved {
  Id xf = kNone, r = kNone, y = kNone;
  u64 n = 0, rows = 0, win = 0;  // elements, rows, input width
};
struct RopeSaved {
  u64 bytes_in = 0, bytes_out = 0;  // the input's and the output's size
};
// What one decoder layer keeps for backward (kNone where nothing).
struct LayerSaved {
  NormSaved n1, n2, qn, kn;
  LinSaved q, k, v, o, gate, up, down;
  RopeSaved rq, rk;
  // eager attention
  Id krep = kNone, vrep = kNone, qc = kNone, p32 = kNone, p16 = kNone;
  // sdpa
  Id sq = kNone, sk = kNone, sv = kNone, so = kNone, lse = kNone;
  // mlp
  Id gate_out = kNone, silu = kNone, up_out = kNone;
  // what a checkpoint frame holds (its inputs)
  std::vector<Id> frame;
};

class Step {
 public:
  Step(const D& d, Sim& sim, std::vector<Param>& params) : d_(d), sim_(sim), params_(params) {}

  Param& param(const std::string& name) {
    for (auto& p : params_)
      if (p.name == name) return p;
    throw Error("hf_step: no parameter " + name);
  }

  // Autocast's cached 16-bit copy of a weight (one per autocast region), or kNone.
  Id weight_copy(Param& p) {
    if (!d_.amp) return kNone;
    if (p.cast == kNone) {
      p.cast = sim_.alloc(checked_mul(p.elems, d_.aw, "bytes"), "autocast." + p.name,
                          HfStepKind::autocast_cache);
      cached_.push_back(&p);
    }
    return p.cast;
  }
  void autocast_exit() {
    for (Param* p : cached_) {
      sim_.drop(p->cast);
      p->cast = kNone;
    }
    cached_.clear();
  }

  // y = linear(x): x has `in` features per token at width `win`; the output `out` features at aw.
  // `stop`: the checkpoint's recompute has everything it needs once this op's inputs are saved
  // (autograd saves inputs before running the op): no output, kNone returned.
  Id linear(Id x, u64 in, u64 win, const std::string& pname, u64 out, bool keep, LinSaved& sv,
            bool stop = false) {
    Param& w = param(pname + ".weight");
    const Id wc = weight_copy(w);
    Id xin = x;
    sv.cast_input = d_.amp && win != d_.aw;
    if (sv.cast_input)
      xin = sim_.alloc(d_.tok(in, d_.aw), pname + ".input_cast");
    else
      sim_.ref(xin);
    if (d_.bias && d_.amp && has_bias(pname)) weight_copy(param(pname + ".bias"));
    if (keep) {
      sv.x = sim_.ref(xin);
      sv.w = sim_.ref(wc);
    }
    const Id y = stop ? kNone : sim_.alloc(d_.tok(out, d_.aw), pname + ".out");
    sim_.drop(xin);
    return y;
  }
  // A node has run: its incoming gradients and its saved tensors go. Autograd releases saved
  // tensors after the incoming gradients; a checkpointed layer's recomputed tensors are unpacked
  // into the backward function's locals and go before them.
  void node_done(std::initializer_list<Id> incoming, const std::vector<Id>& saved) {
    if (recomputed_)
      for (Id t : saved) sim_.drop(t);
    for (Id t : incoming) sim_.drop(t);
    if (!recomputed_)
      for (Id t : saved) sim_.drop(t);
  }

  // MmBackward (and the casts' ToCopyBackward under autocast): the weight's gradient into
  // .grad, the input's gradient returned (a view: it passes through ViewBackward).
  // `acc`: the input's gradient buffer, which the input's gradient is added into as soon as it
  // exists (before the weight's cast runs its backward); kNone-initialised buffers take it.
  // Without `acc` the gradient is returned.
  Id linear_back(Id g, u64 in, const std::string& pname, LinSaved& sv, Id* acc = nullptr) {
    Param& w = param(pname + ".weight");
    const u64 wel = w.elems;
    Id gw;
    if (d_.amp)
      gw = sim_.alloc(checked_mul(wel, d_.aw, "bytes"), "grad16." + pname, HfStepKind::temporary);
    else
      gw = sim_.alloc(checked_mul(wel, d_.pw, "bytes"), "grad." + pname + ".weight",
                      HfStepKind::gradient);
    if (d_.bias && has_bias(pname)) {
      Param& b = param(pname + ".bias");
      const Id gb = sim_.alloc(checked_mul(b.elems, d_.pw, "bytes"), "grad." + pname + ".bias",
                               HfStepKind::gradient);
      to_grad(b, gb);
    }
    Id gin = sim_.alloc(d_.tok(in, d_.aw), pname + ".grad_input", HfStepKind::temporary);
    // released: the weight (mat2) then the input; unpacked: self (the input) first
    node_done({g}, recomputed_ ? std::vector<Id>{sv.x, sv.w} : std::vector<Id>{sv.w, sv.x});
    sv = LinSaved{kNone, kNone, sv.cast_input};
    if (d_.amp) {
      if (sv.cast_input) {  // the input cast's ToCopyBackward (created after the weight's)
        const Id g32 =
            sim_.alloc(d_.tok(in, d_.pw), pname + ".grad_input.f32", HfStepKind::temporary);
        sim_.drop(gin);
        gin = g32;
      }
      if (acc) {
        sim_.accumulate(*acc, gin);
        gin = kNone;
      }
      const Id g32w = sim_.alloc(checked_mul(wel, d_.pw, "bytes"), "grad." + pname + ".weight",
                                 HfStepKind::gradient);
      sim_.drop(gw);
      gw = g32w;
    }
    to_grad(w, gw);
    if (gin == kNone) return kNone;
    sim_.set_view(gin, !(d_.amp && sv.cast_input));
    if (acc) {
      sim_.accumulate(*acc, gin);
      return kNone;
    }
    return gin;
  }
  bool has_bias(const std::string& pname) const {
    return pname.find("q_proj") != std::string::npos || pname.find("k_proj") != std::string::npos ||
           pname.find("v_proj") != std::string::npos;
  }
  void to_grad(Param& p, Id g) {
    sim_.set_kind(g, HfStepKind::gradient);
    if (p.grad == kNone) {
      p.grad = g;
    } else {
      sim_.drop(g);  // added in place into .grad
    }
  }

  // LlamaRMSNorm (5.25): x = x.to(f32); var = x.pow(2).mean(-1); x = x * rsqrt(var + eps);
  // return weight * x.to(input_dtype).  n elements in `rows` rows, input width win.
  Id rmsnorm(Id x, u64 n, u64 rows, u64 win, const std::string& name, bool keep, NormSaved& sv) {
    sv.n = n;
    sv.rows = rows;
    sv.win = win;
    const Id xf = win == 4 ? sim_.ref(x) : sim_.alloc(checked_mul(n, 4, "bytes"), name + ".x_f32");
    const Id sq = sim_.alloc(checked_mul(n, 4, "bytes"), name + ".pow");
    const Id mean = sim_.alloc(checked_mul(rows, 4, "bytes"), name + ".mean");
    sim_.drop(sq);
    const Id add = sim_.alloc(checked_mul(rows, 4, "bytes"), name + ".var_eps");
    const Id r = sim_.alloc(checked_mul(rows, 4, "bytes"), name + ".rsqrt");
    sim_.drop(add);
    const Id y = sim_.alloc(checked_mul(n, 4, "bytes"), name + ".normed_f32");
    if (keep) {  // pow and the multiply save x, the multiply and rsqrt save rsqrt's output
      sv.xf = sim_.ref(xf);
      sv.r = sim_.ref(r);
    }
    sim_.drop(r);   // a temporary of the expression
    sim_.drop(xf);  // `hidden_states` rebound
    const Id y16 =
        win == 4 ? sim_.ref(y) : sim_.alloc(checked_mul(n, win, "bytes"), name + ".normed");
    const u64 wout = std::max(win, d_.pw);
    const Id out = op(checked_mul(n, wout, "bytes"), name + ".out",
                      wout != win ? checked_mul(n, wout, "bytes") : 0);
    if (keep) sv.y = sim_.ref(y16);  // weight * y saves y
    sim_.drop(y16);
    sim_.drop(y);  // the function returns
    sim_.drop(mean);
    return out;
  }
  // Its backward, adding the gradient for x (width win) into x's gradient buffer `acc`. In fp32
  // both the multiply's and pow's gradients reach x itself and are added there one by one; in
  // 16 bits they meet at x.float() first and reach x through its ToCopyBackward.
  // `frame`: a checkpoint frame freed with this node's last unpack (the layer's input norm).
  void rmsnorm_back(Id g, NormSaved& sv, const std::string& pname, Id& acc,
                    std::vector<Id>* frame = nullptr) {
    const u64 n = sv.n, win = sv.win;
    const u64 wout = std::max(win, d_.pw);
    auto tmp = [&](u64 bytes, const std::string& what) {
      return sim_.alloc(bytes, pname + "." + what, HfStepKind::temporary);
    };
    const u64 n4 = checked_mul(n, 4, "bytes");
    // MulBackward0 (weight * y): grad for y, and grad * y summed into the weight's gradient.
    const Id gy = tmp(checked_mul(n, win, "bytes"), "grad_y");
    const Id prod = tmp(checked_mul(n, wout, "bytes"), "grad_w_prod");
    Param& w = param(pname + ".weight");
    const Id gw = sim_.alloc(checked_mul(w.elems, d_.pw, "bytes"), "grad." + pname + ".weight",
                             HfStepKind::gradient);
    sim_.drop(prod);
    to_grad(w, gw);
    node_done({g}, {sv.y});
    Id cur = gy;
    if (win != 4) {  // ToCopyBackward0 of .to(input_dtype)
      const Id g32 = tmp(n4, "grad_y_f32");
      sim_.drop(cur);
      cur = g32;
    }
    // MulBackward0 (x * rsqrt): grad * x summed for rsqrt, grad * rsqrt for x.
    const Id prod2 = tmp(n4, "grad_r_prod");
    Id gx = tmp(n4, "grad_x_f32");
    const Id gr = tmp(checked_mul(sv.rows, 4, "bytes"), "grad_r");
    sim_.drop(prod2);
    node_done({cur}, {sv.r});
    Id& into = win == 4 ? acc : gx;  // where the x gradients meet
    if (win == 4) {
      sim_.accumulate(acc, gx);
      gx = kNone;
    }
    // RsqrtBackward0, AddBackward0: (rows) sized; MeanBackward1: the expanded gradient.
    const Id gv = tmp(checked_mul(sv.rows, 4, "bytes"), "grad_var");
    sim_.drop(gr);
    const Id gm = tmp(n4, "grad_mean");
    sim_.drop(gv);
    // PowBackward0: grad * 2 * x^1
    const Id p1 = tmp(n4, "pow1");
    const Id p2 = tmp(n4, "pow_mul");
    const Id gp = tmp(n4, "grad_pow");
    sim_.drop(p2);
    sim_.drop(p1);
    node_done({gm}, {sv.xf});
    if (frame) {  // its last saved tensor unpacked: the checkpoint frame goes (RNG state first)
      for (auto it = frame->rbegin(); it != frame->rend(); ++it) sim_.drop(*it);
      frame->clear();
    }
    sim_.accumulate(into, gp);
    sv = NormSaved{kNone, kNone, kNone, sv.n, sv.rows, sv.win};
    if (win != 4) {  // ToCopyBackward0 of x.to(float32)
      const Id g16 = tmp(checked_mul(n, win, "bytes"), "grad_x");
      sim_.drop(gx);
      sim_.accumulate(acc, g16);
    }
  }

  // apply_rotary_pos_emb for one of q, k (input x of `elems` elements at width w_in):
  // x * cos + rotate_half(x) * sin; cos and sin are (1, s, d) tables of width pw.
  Id rope(u64 elems, u64 w_in, const std::string& name, RopeSaved& sv) {
    const u64 wo = std::max(w_in, d_.pw);
    sv.bytes_in = checked_mul(elems, w_in, "bytes");
    sv.bytes_out = checked_mul(elems, wo, "bytes");
    const u64 up = wo != w_in ? sv.bytes_out : 0;
    const Id xc = op(sv.bytes_out, name + ".x_cos", up);
    const Id neg = sim_.alloc(sv.bytes_in / 2, name + ".neg");
    const Id cat = sim_.alloc(sv.bytes_in, name + ".rotate_half");
    sim_.drop(neg);
    const Id rs = op(sv.bytes_out, name + ".rot_sin", up);
    sim_.drop(cat);
    const Id out = sim_.alloc(sv.bytes_out, name + ".embed");
    sim_.drop(xc);
    sim_.drop(rs);
    return out;
  }
  // `cos`, `sin`: the tables' last saved references, released by these nodes (layer 0's q), or
  // kNone.
  Id rope_back(Id g, const RopeSaved& sv, const std::string& name, Id cos = kNone, Id sin = kNone) {
    const bool cast = sv.bytes_out != sv.bytes_in;
    Id gr = sim_.alloc(sv.bytes_out, name + ".grad_rot", HfStepKind::temporary);  // g * sin
    if (cast) {
      const Id c = sim_.alloc(sv.bytes_in, name + ".grad_rot16", HfStepKind::temporary);
      sim_.drop(gr);
      gr = c;
    }
    sim_.drop(sin);
    const Id gneg = sim_.alloc(sv.bytes_in / 2, name + ".grad_neg", HfStepKind::temporary);
    Id gx = sim_.alloc(sv.bytes_in, name + ".grad_slice2", HfStepKind::temporary);
    sim_.drop(gneg);
    const Id gs1 = sim_.alloc(sv.bytes_in, name + ".grad_slice1", HfStepKind::temporary);
    sim_.drop(gr);
    sim_.accumulate(gx, gs1);
    Id gc = sim_.alloc(sv.bytes_out, name + ".grad_cos", HfStepKind::temporary);  // g * cos
    if (cast) {
      const Id c = sim_.alloc(sv.bytes_in, name + ".grad_cos16", HfStepKind::temporary);
      sim_.drop(gc);
      gc = c;
    }
    sim_.drop(g);
    sim_.drop(cos);
    sim_.accumulate(gx, gc);
    return gx;
  }

  // One decoder layer's forward; `keep` false under checkpointing (nothing saved), true
  // otherwise and in the recompute.
  Id layer_forward(int l, Id x, bool keep, bool recompute, LayerSaved& sv) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    sim_.layer = l;
    const u64 h = d_.h, qd = d_.a * d_.d, kd = d_.k * d_.d;
    const Id n1 = rmsnorm(x, d_.tok(h, 1), d_.bs(), d_.pw, p + "input_layernorm", keep, sv.n1);
    Id q = linear(n1, h, d_.pw, p + "self_attn.q_proj", qd, keep, sv.q);
    Id k = linear(n1, h, d_.pw, p + "self_attn.k_proj", kd, keep, sv.k);
    const Id v = linear(n1, h, d_.pw, p + "self_attn.v_proj", kd, keep, sv.v);
    if (d_.qkn) {
      const Id qn =
          rmsnorm(q, d_.tok(qd, 1), d_.bs() * d_.a, d_.aw, p + "self_attn.q_norm", keep, sv.qn);
      sim_.drop(q);
      q = qn;
      const Id kn =
          rmsnorm(k, d_.tok(kd, 1), d_.bs() * d_.k, d_.aw, p + "self_attn.k_norm", keep, sv.kn);
      sim_.drop(k);
      k = kn;
    }
    const u64 wq = d_.qkn ? std::max(d_.aw, d_.pw) : d_.aw;  // q/k width into RoPE
    const Id qe = rope(d_.tok(qd, 1), wq, p + "rope.q", sv.rq);
    const Id ke = rope(d_.tok(kd, 1), wq, p + "rope.k", sv.rk);
    sim_.drop(q);
    sim_.drop(k);
    const u64 wqe = std::max(wq, d_.pw);  // q_embed / k_embed width
    Id key = ke, value = v;
    const bool cache = d_.cache && !d_.ckpt && !recompute;
    if (cache) {
      // DynamicLayer.update: torch.cat onto an empty tensor copies k and v; the cache (in
      // `out`) keeps its reference into the next step, the attention takes another
      key = sim_.alloc(d_.tok(kd, wqe), p + "cache.key");
      value = sim_.alloc(d_.tok(kd, d_.aw), p + "cache.value");
      sim_.drop(ke);
      sim_.drop(v);
      sim_.ref(key);
      sim_.ref(value);
    }
    Id ao;  // o_proj's input
    if (!d_.sdpa)
      ao = eager_attention(key, value, wqe, keep, sv, p);  // q_embed is copied (q_contiguous)
    else
      ao = sdpa_attention(qe, key, value, wqe, keep, sv, p);
    const Id o = linear(ao, qd, d_.aw, p + "self_attn.o_proj", h, keep, sv.o);
    sim_.drop(ao);
    const Id weights = attn_weights_;  // `_` in the decoder layer: alive until it returns
    attn_weights_ = kNone;
    sim_.drop(qe);
    sim_.drop(key);
    sim_.drop(value);
    sim_.drop(n1);  // `hidden_states` rebound to the attention's output
    const Id h1 = add_residual(p + "residual1");
    sim_.drop(o);
    const Id n2 =
        rmsnorm(h1, d_.tok(h, 1), d_.bs(), d_.pw, p + "post_attention_layernorm", keep, sv.n2);
    const u64 I = d_.i;
    // down_proj(act_fn(gate_proj(x)) * up_proj(x)): each product a temporary of the expression
    const Id gate = linear(n2, h, d_.pw, p + "mlp.gate_proj", I, keep, sv.gate);
    const Id act = sim_.alloc(d_.tok(I, d_.aw), p + "mlp.silu");
    if (keep) sv.gate_out = sim_.ref(gate);  // silu saves its input
    sim_.drop(gate);
    const Id up = linear(n2, h, d_.pw, p + "mlp.up_proj", I, keep, sv.up);
    const Id m = sim_.alloc(d_.tok(I, d_.aw), p + "mlp.act_mul");
    if (keep) {  // the product saves both factors
      sv.silu = sim_.ref(act);
      sv.up_out = sim_.ref(up);
    }
    sim_.drop(act);
    sim_.drop(up);
    const Id down = linear(m, I, d_.aw, p + "mlp.down_proj", h, keep, sv.down, recompute);
    if (recompute) {
      // torch.utils.checkpoint stops the replay here (its last saved tensor is packed) and the
      // frames unwind: the layer's locals go
      sim_.drop(n2);
      sim_.drop(h1);
      sim_.drop(m);
      sim_.drop(weights);
      sim_.layer = -1;
      return kNone;
    }
    sim_.drop(m);
    sim_.drop(n2);
    const Id h2 = add_residual(p + "residual2");
    sim_.drop(down);
    sim_.drop(h1);
    sim_.drop(weights);
    sim_.layer = -1;
    return h2;
  }
  // x + o: the residual stream's width (o is cast up inside the op on the CPU).
  Id add_residual(const std::string& name) {
    return op(d_.tok(d_.h, d_.pw), name, d_.aw != d_.pw ? d_.tok(d_.h, d_.pw) : 0);
  }
  // An op's output; on the CPU a mixed-dtype elementwise op first makes an upcast copy of its
  // 16-bit operand (`cpu_temp` bytes), freed once the output exists (a GPU kernel casts in
  // registers).
  Id op(u64 bytes, const std::string& name, u64 cpu_temp) {
    const Id t = d_.cpu && cpu_temp > 0 ? sim_.alloc(cpu_temp, name + ".cpu_upcast") : kNone;
    const Id out = sim_.alloc(bytes, name);
    sim_.drop(t);
    return out;
  }

  // eager_attention_forward: repeat_kv, q @ k^T * scaling + mask, softmax in fp32, .to(q.dtype),
  // @ v, transpose(1, 2).contiguous().
  Id eager_attention(Id key, Id value, u64 wqe, bool keep, LayerSaved& sv, const std::string& p) {
    const u64 full = d_.tok(d_.a * d_.d, 1);  // b·s·a·d elements
    const bool rep = d_.k < d_.a;
    const Id kr =
        rep ? sim_.alloc(checked_mul(full, wqe, "bytes"), p + "attn.repeat_k") : sim_.ref(key);
    const Id vr =
        rep ? sim_.alloc(checked_mul(full, d_.aw, "bytes"), p + "attn.repeat_v") : sim_.ref(value);
    Id qa, ka, kt = kNone;
    if (d_.amp) {
      // autocast casts q and k^T to 16 bits; the q cast keeps q's transposed layout and is
      // copied again for bmm; the k cast is freed once bmm has run.
      qa = sim_.alloc(checked_mul(full, d_.aw, "bytes"), p + "attn.q_cast");
      kt = sim_.alloc(checked_mul(full, d_.aw, "bytes"), p + "attn.k_cast");
      ka = sim_.alloc(checked_mul(full, d_.aw, "bytes"), p + "attn.q_contiguous");
    } else {
      qa = sim_.alloc(checked_mul(full, d_.aw, "bytes"), p + "attn.q_contiguous");
      ka = sim_.ref(kr);
    }
    const Id sc = sim_.alloc(d_.scores(d_.aw), p + "attn.scores");
    if (keep) {
      sv.qc = sim_.ref(qa);
      sv.krep = sim_.ref(ka);
    }
    // matmul's temporaries (what bmm saved stays): the q copy; under autocast the casts
    sim_.drop(kt);
    sim_.drop(qa);
    sim_.drop(ka);
    const Id sc2 = sim_.alloc(d_.scores(d_.aw), p + "attn.scaled");
    sim_.drop(sc);
    const u64 wm = d_.pw;  // the mask's dtype: the embeddings'
    const u64 wadd = std::max(d_.aw, wm);
    const Id sc3 = op(d_.scores(wadd), p + "attn.masked", wadd != d_.aw ? d_.scores(wadd) : 0);
    sim_.drop(sc2);
    // softmax(dtype=float32): the CPU converts a 16-bit input first; CUDA's kernel reads it
    // (half_to_float)
    const Id p32 = op(d_.scores(4), p + "attn.softmax", wadd != 4 ? d_.scores(4) : 0);
    if (keep) sv.p32 = sim_.ref(p32);
    Id weights;  // `attn_weights`, returned to the attention module (freed when it returns)
    Id p16 = kNone;
    if (d_.amp) {
      sim_.drop(sc3);
      weights = p32;  // .to(q.dtype) is fp32 already; matmul's autocast casts a copy
      p16 = sim_.alloc(d_.scores(d_.aw), p + "attn.probs_cast");
    } else {
      weights = wqe == 4 ? sim_.ref(p32) : sim_.alloc(d_.scores(wqe), p + "attn.probs");
      sim_.drop(p32);
      sim_.drop(sc3);
    }
    const Id pv = sim_.alloc(checked_mul(full, d_.aw, "bytes"), p + "attn.pv");
    if (keep) {
      sv.p16 = sim_.ref(p16 != kNone ? p16 : weights);
      sv.vrep = sim_.ref(vr);
    }
    sim_.drop(p16);
    const Id ao = sim_.alloc(checked_mul(full, d_.aw, "bytes"), p + "attn.output");
    sim_.drop(pv);
    sim_.drop(kr);
    sim_.drop(vr);
    attn_weights_ = weights;
    return ao;
  }
  // SDPA's flash kernel: it saves q, k, v, its output and an fp32 logsumexp (b, a, s); GQA
  // without copies. Under autocast q and k (fp32 after RoPE) are cast to 16 bits.
  Id sdpa_attention(Id qe, Id key, Id value, u64 wqe, bool keep, LayerSaved& sv,
                    const std::string& p) {
    Id qa = qe, ka = key;
    if (d_.amp && wqe != d_.aw) {
      ka = sim_.alloc(d_.tok(d_.k * d_.d, d_.aw), p + "attn.k_cast");
      qa = sim_.alloc(d_.tok(d_.a * d_.d, d_.aw), p + "attn.q_cast");
    } else {
      sim_.ref(qa);
      sim_.ref(ka);
    }
    const Id out = sim_.alloc(d_.tok(d_.a * d_.d, d_.aw), p + "attn.sdpa_out");
    const Id lse =
        sim_.alloc(checked_product({d_.b, d_.a, d_.s, 4}, "bytes"), p + "attn.logsumexp");
    if (keep) {
      sv.sq = sim_.ref(qa);
      sv.sk = sim_.ref(ka);
      sv.sv = sim_.ref(value);
      sv.so = sim_.ref(out);
      sv.lse = sim_.ref(lse);
    }
    sim_.drop(lse);
    sim_.drop(qa);
    sim_.drop(ka);
    return out;
  }

  // The layer's backward; g is the gradient of its output (dropped here). Returns the gradient
  // of its input.
  Id layer_backward(int l, Id g, LayerSaved& sv) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    sim_.layer = l;
    recomputed_ = d_.ckpt;
    const u64 h = d_.h, qd = d_.a * d_.d, kd = d_.k * d_.d, I = d_.i;
    // h2 = h1 + down: the gradient goes to both (down's cast back to 16 bits under autocast).
    Id gres = g;  // h1's gradient buffer
    Id gdown = sim_.ref(g);
    if (d_.aw != d_.pw) {
      const Id c = sim_.alloc(d_.tok(h, d_.aw), p + "grad.down_cast", HfStepKind::temporary);
      sim_.drop(gdown);
      gdown = c;
    }
    if (d_.ckpt) recompute(l, sv);
    Id gm = linear_back(gdown, I, p + "mlp.down_proj", sv.down);
    const Id gsilu = sim_.alloc(d_.tok(I, d_.aw), p + "grad.silu", HfStepKind::temporary);
    const Id gup = sim_.alloc(d_.tok(I, d_.aw), p + "grad.up", HfStepKind::temporary);
    node_done({gm}, {sv.up_out, sv.silu});
    Id gn2 = kNone;
    linear_back(gup, h, p + "mlp.up_proj", sv.up, &gn2);
    const Id ggate = sim_.alloc(d_.tok(I, d_.aw), p + "grad.gate", HfStepKind::temporary);
    node_done({gsilu}, {sv.gate_out});
    linear_back(ggate, h, p + "mlp.gate_proj", sv.gate, &gn2);
    rmsnorm_back(gn2, sv.n2, p + "post_attention_layernorm", gres);
    // h1 = x + o
    Id gx = gres;
    Id go = sim_.ref(gres);
    if (d_.aw != d_.pw) {
      const Id c = sim_.alloc(d_.tok(h, d_.aw), p + "grad.o_cast", HfStepKind::temporary);
      sim_.drop(go);
      go = c;
    }
    Id gao = linear_back(go, qd, p + "self_attn.o_proj", sv.o);
    Id gq, gk, gv;
    if (!d_.sdpa)
      eager_back(gao, sv, p, gq, gk, gv);
    else
      sdpa_back(gao, sv, p, gq, gk, gv);
    gk = rope_back(gk, sv.rk, p + "rope.k");
    if (l == 0)
      gq = rope_back(gq, sv.rq, p + "rope.q", tables_[0], tables_[1]);
    else
      gq = rope_back(gq, sv.rq, p + "rope.q");
    if (d_.qkn) {
      Id k_in = kNone, q_in = kNone;
      rmsnorm_back(gk, sv.kn, p + "self_attn.k_norm", k_in);
      rmsnorm_back(gq, sv.qn, p + "self_attn.q_norm", q_in);
      gk = k_in;
      gq = q_in;
    }
    // ViewBackward of each projection's (b, s, heads, d) view: a copy of the transposed gradient.
    auto reshape = [&](Id t, u64 n) {
      const Id c = sim_.alloc(d_.tok(n, d_.aw), p + "grad.view_copy", HfStepKind::temporary);
      sim_.drop(t);
      return c;
    };
    Id gn1 = kNone;
    // SDPA's backward makes v's gradient in the (b, s, heads, d) layout already
    linear_back(d_.sdpa ? gv : reshape(gv, kd), h, p + "self_attn.v_proj", sv.v, &gn1);
    linear_back(reshape(gk, kd), h, p + "self_attn.k_proj", sv.k, &gn1);
    linear_back(reshape(gq, qd), h, p + "self_attn.q_proj", sv.q, &gn1);
    rmsnorm_back(gn1, sv.n1, p + "input_layernorm", gx, &sv.frame);
    recomputed_ = false;
    sim_.layer = -1;
    return gx;
  }
  void eager_back(Id gao, LayerSaved& sv, const std::string& p, Id& gq, Id& gk, Id& gv) {
    const u64 full = d_.tok(d_.a * d_.d, 1);
    const bool rep = d_.k < d_.a;
    const Id c = sim_.alloc(checked_mul(full, d_.aw, "bytes"), p + "grad.attn_out_copy",
                            HfStepKind::temporary);
    sim_.drop(gao);
    // BmmBackward0 (probs @ v)
    Id gvr = sim_.alloc(checked_mul(full, d_.aw, "bytes"), p + "grad.v_rep", HfStepKind::temporary);
    Id gp = sim_.alloc(d_.scores(d_.aw), p + "grad.probs", HfStepKind::temporary);
    node_done({c},
              recomputed_ ? std::vector<Id>{sv.p16, sv.vrep} : std::vector<Id>{sv.vrep, sv.p16});
    if (sv.p16 != sv.p32 || d_.amp) {  // ToCopyBackward0 of the probabilities' cast
      const Id g32 = sim_.alloc(d_.scores(4), p + "grad.probs_f32", HfStepKind::temporary);
      sim_.drop(gp);
      gp = g32;
    }
    const Id gs = sim_.alloc(d_.scores(4), p + "grad.softmax", HfStepKind::temporary);
    node_done({gp}, {sv.p32});
    sv.p32 = sv.p16 = sv.vrep = kNone;
    // the scores' dtype before softmax (softmax(dtype=f32) converts; the mask add promotes)
    const Id g16 = sim_.alloc(d_.scores(d_.aw), p + "grad.scores16", HfStepKind::temporary);
    sim_.drop(gs);
    const Id gsc = sim_.alloc(d_.scores(d_.aw), p + "grad.scaled", HfStepKind::temporary);
    sim_.drop(g16);
    // BmmBackward0 (q @ k^T)
    Id gkr = sim_.alloc(checked_mul(full, d_.aw, "bytes"), p + "grad.k_rep", HfStepKind::temporary);
    Id gqa = sim_.alloc(checked_mul(full, d_.aw, "bytes"), p + "grad.q", HfStepKind::temporary);
    node_done({gsc}, {sv.qc, sv.krep});
    sv.qc = sv.krep = kNone;
    const u64 wqe = sv.rq.bytes_out / d_.tok(d_.a * d_.d, 1);
    if (d_.amp && wqe != d_.aw) {  // the casts of q and k back to fp32
      const Id k32 =
          sim_.alloc(checked_mul(full, wqe, "bytes"), p + "grad.k_f32", HfStepKind::temporary);
      sim_.drop(gkr);
      gkr = k32;
      const Id q32 =
          sim_.alloc(checked_mul(full, wqe, "bytes"), p + "grad.q_f32", HfStepKind::temporary);
      sim_.drop(gqa);
      gqa = q32;
    }
    if (rep) {  // ExpandBackward0 of repeat_kv: sum over the repeats
      const Id v2 = sim_.alloc(d_.tok(d_.k * d_.d, d_.aw), p + "grad.v", HfStepKind::temporary);
      sim_.drop(gvr);
      gvr = v2;
      const Id k2 = sim_.alloc(d_.tok(d_.k * d_.d, wqe), p + "grad.k", HfStepKind::temporary);
      sim_.drop(gkr);
      gkr = k2;
    }
    gq = gqa;
    gk = gkr;
    gv = gvr;
  }
  void sdpa_back(Id gao, LayerSaved& sv, const std::string& p, Id& gq, Id& gk, Id& gv) {
    gq = sim_.alloc(d_.tok(d_.a * d_.d, d_.aw), p + "grad.q", HfStepKind::temporary);
    gk = sim_.alloc(d_.tok(d_.k * d_.d, d_.aw), p + "grad.k", HfStepKind::temporary);
    gv = sim_.alloc(d_.tok(d_.k * d_.d, d_.aw), p + "grad.v", HfStepKind::temporary);
    node_done({gao}, recomputed_ ? std::vector<Id>{sv.sq, sv.sk, sv.so, sv.sv, sv.lse}
                                 : std::vector<Id>{sv.sk, sv.sq, sv.sv, sv.so, sv.lse});
    sv.sk = sv.sq = sv.sv = sv.so = sv.lse = kNone;
    const u64 wqe = sv.rq.bytes_out / d_.tok(d_.a * d_.d, 1);
    if (d_.amp && wqe != d_.aw) {  // the casts' ToCopyBackward, the later-made q cast's first
      const Id q32 = sim_.alloc(d_.tok(d_.a * d_.d, wqe), p + "grad.q_f32", HfStepKind::temporary);
      sim_.drop(gq);
      gq = q32;
      const Id k32 = sim_.alloc(d_.tok(d_.k * d_.d, wqe), p + "grad.k_f32", HfStepKind::temporary);
      sim_.drop(gk);
      gk = k32;
    }
  }

  void recompute(int l, LayerSaved& sv) {
    // the checkpoint re-runs the layer under the forward's autocast state (a fresh cache)
    const Id x = sv.frame.empty() ? kNone : sv.frame[0];  // {input, cos, sin, mask[, rng]}
    std::vector<Id> frame = sv.frame;
    std::vector<Param*> outer = cached_;
    cached_.clear();
    layer_forward(l, x, true, true, sv);
    sv.frame = frame;
    autocast_exit();
    cached_ = outer;
    sim_.layer = l;
  }

  // RoPE's cos and sin: every layer's multiplies save them; layer 0's q nodes release them last
  std::array<Id, 2> tables_{kNone, kNone};
  Id attn_weights_ = kNone;  // eager attention's probabilities, until the module returns
  bool recomputed_ = false;  // in a checkpointed layer's backward

 private:
  const D& d_;
  Sim& sim_;
  std::vector<Param>& params_;
  std::vector<Param*> cached_;
};

// FSDP2's runtime as one rank sees it (torch/distributed/fsdp/_fully_shard/, torch 2.15;
// docs/hf-step.md, "Per rank under FSDP2"), around the step's own tensors. Units: each decoder
// layer and the root.
class Fsdp {
 public:
  // `width`: the gathered parameters' (param_dtype); `rest`: the sharded parameters' and the
  // reductions' (the model's dtype, reduce_dtype).
  Fsdp(Sim& sim, std::vector<Param>& params, const Shard& sh, u64 width, u64 rest, int layers,
       bool reshard, bool cpu)
      : sim_(sim),
        params_(params),
        sh_(sh),
        w_(width),
        rw_(rest),
        layers_(layers),
        reshard_(reshard),
        cpu_(cpu),
        pending_(static_cast<std::size_t>(layers) + 1, kNone),
        grads_(static_cast<std::size_t>(layers) + 1, kNone) {}
  bool on() const { return sh_.n > 1; }

  // Forward. The root's pre-forward (the model call's start) and each layer's: the unit's
  // all-gather output (every parameter padded to n chunks, one flat buffer), then each
  // parameter's own unsharded buffer copied out of it. The flat output is held (for the
  // all-gather streams' event) until the next unit's all-gather has been issued, the last
  // layer's until the root's post-forward.
  void pre_forward(int unit) {
    if (!on()) return;
    const Id f = gather(unit);
    sim_.drop(held_);
    held_ = f;
    copy_out(unit);
  }
  void post_forward(int unit) {  // a layer's: resharded unless reshard_after_forward=False
    if (on() && unit >= 0 && reshard_) reshard(unit);
  }
  void root_post_forward() {
    if (!on()) return;
    sim_.drop(held_);
    held_ = kNone;
  }
  // Backward. The root's pre-backward (at the loss's first node) prefetches the last layer's
  // all-gather; each layer's pre-backward copies its prefetched output out, frees the flat
  // buffer and prefetches the layer below. Without resharding the layers are still gathered.
  void root_pre_backward() {
    if (on() && reshard_ && layers_ > 0) pending_[idx(layers_ - 1)] = gather(layers_ - 1);
  }
  void pre_backward(int unit) {
    if (!on() || !reshard_) return;
    copy_out(unit);
    sim_.drop(pending_[idx(unit)]);
    pending_[idx(unit)] = kNone;
    if (unit > 0) pending_[idx(unit - 1)] = gather(unit - 1);
  }
  // A unit's post-backward: reshard; wait for the previous reduce-scatter (its input freed);
  // the reduce-scatter input (the unsharded gradients, each padded to n chunks: on the CPU
  // _chunk_cat pads a copy of each unevenly split one first); the unsharded .grad tensors
  // dropped; the sharded gradient, one buffer per unit that every parameter's .grad views.
  void post_backward(int unit) {
    if (!on()) return;
    reshard(unit);
    sim_.drop(rs_);
    rs_ = sim_.alloc(rest_bytes(unit_elems(unit)), "fsdp.reduce_scatter_input." + unit_name(unit),
                     HfStepKind::communication);
    if (cpu_) {
      std::vector<Id> pads;
      for (Param& p : params_)
        if (p.unit == unit && p.rows % sh_.n != 0)
          pads.push_back(sim_.alloc(bytes(sh_.unsharded_elems(p)), "fsdp.chunk_cat_pad." + p.name,
                                    HfStepKind::temporary));
      if (w_ != rw_)  // the CPU casts each (padded) gradient to the reduce dtype through a copy
        for (Param& p : params_)
          if (p.unit == unit)
            sim_.drop(sim_.alloc(bytes(sh_.unsharded_elems(p)), "fsdp.chunk_cat_cast." + p.name,
                                 HfStepKind::temporary));
      for (Id t : pads) sim_.drop(t);
    }
    for (Param& p : params_)
      if (p.unit == unit) {
        sim_.drop(p.grad);
        p.grad = kNone;
      }
    grads_[idx(unit)] = sim_.alloc(rest_bytes(unit_elems(unit) / sh_.n),
                                   "fsdp.sharded_grad." + unit_name(unit), HfStepKind::gradient);
  }
  void end_backward() {  // the root's post-backward callback frees the last reduce-scatter input
    sim_.drop(rs_);
    rs_ = kNone;
  }
  // zero_grad(set_to_none=True): a unit's gradient buffer goes with its last parameter's .grad.
  void zero_grad() {
    std::vector<int> left(grads_.size(), 0);
    for (const Param& p : params_) ++left[idx(p.unit)];
    for (const Param& p : params_)
      if (--left[idx(p.unit)] == 0) {
        sim_.drop(grads_[idx(p.unit)]);
        grads_[idx(p.unit)] = kNone;
      }
  }

 private:
  std::size_t idx(int unit) const { return static_cast<std::size_t>(unit < 0 ? layers_ : unit); }
  std::string unit_name(int unit) const {
    return unit < 0 ? std::string("root") : "layers." + std::to_string(unit);
  }
  u64 bytes(u64 elems) const { return checked_mul(elems, w_, "bytes"); }
  u64 rest_bytes(u64 elems) const { return checked_mul(elems, rw_, "bytes"); }
  u64 unit_elems(int unit) const {
    u64 n = 0;
    for (const Param& p : params_)
      if (p.unit == unit) n = checked_add(n, sh_.unsharded_elems(p), "elements");
    return n;
  }
  // With a param_dtype other than the parameters' the shards are first cast into one input
  // buffer, copied into the output's slice and freed.
  Id gather(int unit) {
    const Id in = w_ == rw_ ? kNone
                            : sim_.alloc(bytes(unit_elems(unit) / sh_.n),
                                         "fsdp.all_gather_input." + unit_name(unit),
                                         HfStepKind::communication);
    const Id out = sim_.alloc(bytes(unit_elems(unit)), "fsdp.all_gather." + unit_name(unit),
                              HfStepKind::communication);
    sim_.drop(in);
    return out;
  }
  void copy_out(int unit) {
    for (Param& p : params_)
      if (p.unit == unit)
        p.full = sim_.alloc(bytes(sh_.unsharded_elems(p)), "fsdp.unsharded." + p.name,
                            HfStepKind::communication);
  }
  void reshard(int unit) {
    for (Param& p : params_)
      if (p.unit == unit) {
        sim_.drop(p.full);
        p.full = kNone;
      }
  }

  Sim& sim_;
  std::vector<Param>& params_;
  Shard sh_;
  u64 w_, rw_;
  int layers_;
  bool reshard_, cpu_;
  Id held_ = kNone;  // the forward's last all-gather output
  Id rs_ = kNone;    // the last reduce-scatter input
  std::vector<Id> pending_, grads_;
};

}  // namespace

std::string hf_step_unsupported(const ModelConfig& m, const TrainConfig& t, const HfOptions& hf) {
  const std::string what = "the HF step's event sequence (transformers 5.25) ";
  if (m.family != "llama" && m.family != "mistral" && m.family != "qwen2" && m.family != "qwen3")
    return "--model: " + what +
           "models the llama, mistral, qwen2 and qwen3 families; got "
           "model_type '" +
           m.family + "'";
  if (m.moe()) return "--model: " + what + "does not model a mixture of experts yet";
  if (m.sliding_window > 0) return "--model: " + what + "does not model a sliding window yet";
  // rope_scaling (llama3) changes inv_freq's values, not the step's tensors
  if (hf.era && *hf.era != HfEra::v5_25)
    return "--hf-version: " + what +
           "models transformers 5.25 only (the release "
           "tools/hf_step_events.py measured); got " +
           hf_era_name(*hf.era);
  if (hf.loop != Loop::hf_model_loss) return "--loop: " + what + "models hf-model-loss only";
  if (t.checkpointing == Checkpointing::selective ||
      (t.checkpointing == Checkpointing::full && !t.checkpoint_layers.list.empty() &&
       static_cast<std::int64_t>(t.checkpoint_layers.list.size()) != m.layers))
    return "--checkpointing: " + what + "models none or full (every layer)";
  if (t.optimizer != Optimizer::adamw)
    return "--optimizer: " + what + "models torch.optim.AdamW only";
  if (t.lora()) return "--finetune: " + what + "models a full fine-tune";
  if (dtype_size(t.dtype) != 2 && hf.recipe(t.dtype) != Precision::pure)
    return "--precision " + std::string(precision_name(hf.recipe(t.dtype))) +
           " needs a 16-bit --dtype (bf16 or fp16)";
  return "";
}

HfStep hf_step(const ModelConfig& m, const TrainConfig& t, const HfOptions& hf,
               const HfStepOptions& o) {
  const std::string why = hf_step_unsupported(m, t, hf);
  if (!why.empty()) throw InputError(why);
  if (o.step != 1 && o.step != 2) throw InputError("hf_step: step must be 1 or 2");
  if (o.fsdp_world < 1 || o.fsdp_rank < 0 || o.fsdp_rank >= o.fsdp_world)
    throw InputError("hf_step: FSDP2 rank " + std::to_string(o.fsdp_rank) + " of " +
                     std::to_string(o.fsdp_world) + " ranks");
  if (o.fsdp_world > 1 && hf.recipe(t.dtype) == Precision::amp)
    throw InputError(
        "--precision amp: the HF step under FSDP2 models pure (the model in --dtype, no "
        "MixedPrecisionPolicy) and mixed (an fp32 model under MixedPrecisionPolicy(param_dtype="
        "--dtype, reduce_dtype=float32)), not autocast");
  if (o.fsdp_world > 1 && hf.adamw_impl != AdamwImpl::foreach_)
    throw InputError(std::string("--adamw-impl ") + adamw_impl_name(hf.adamw_impl) +
                     ": the HF step under FSDP2 models foreach AdamW (its default on a GPU)");
  D d{};
  d.b = static_cast<u64>(t.batch);
  d.s = static_cast<u64>(t.seq);
  d.h = static_cast<u64>(m.hidden);
  d.i = static_cast<u64>(m.intermediate);
  d.a = static_cast<u64>(m.heads);
  d.k = static_cast<u64>(m.kv_heads);
  d.d = static_cast<u64>(m.head_dim());
  d.V = static_cast<u64>(m.vocab);
  d.L = static_cast<u64>(m.layers);
  d.amp = hf.recipe(t.dtype) == Precision::amp;
  d.aw = dtype_size(t.dtype);
  d.pw = d.amp ? 4 : d.aw;
  d.sdpa = o.sdpa;
  d.ckpt = t.checkpointing == Checkpointing::full;
  d.cache = hf.use_cache;
  d.bias = m.qkv_bias;
  d.qkn = m.qk_norm;
  d.tied = m.tied_embeddings;
  d.cpu = o.cpu_kernels;

  HfStep st;
  Sim sim(st);
  // model.parameters() in module order, with their dim 0 and FSDP2 unit.
  std::vector<Param> params;
  auto add = [&](const std::string& name, u64 rows, u64 cols, int unit) {
    Param p;
    p.name = name;
    p.rows = rows;
    p.cols = cols;
    p.elems = checked_mul(rows, cols, "parameter elements");
    p.unit = unit;
    params.push_back(p);
  };
  add("model.embed_tokens.weight", d.V, d.h, -1);
  for (u64 l = 0; l < d.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const int u = static_cast<int>(l);
    const u64 qd = d.a * d.d, kd = d.k * d.d;
    add(p + "self_attn.q_proj.weight", qd, d.h, u);
    if (d.bias) add(p + "self_attn.q_proj.bias", qd, 1, u);
    add(p + "self_attn.k_proj.weight", kd, d.h, u);
    if (d.bias) add(p + "self_attn.k_proj.bias", kd, 1, u);
    add(p + "self_attn.v_proj.weight", kd, d.h, u);
    if (d.bias) add(p + "self_attn.v_proj.bias", kd, 1, u);
    add(p + "self_attn.o_proj.weight", d.h, qd, u);
    if (d.qkn) {
      add(p + "self_attn.q_norm.weight", d.d, 1, u);
      add(p + "self_attn.k_norm.weight", d.d, 1, u);
    }
    add(p + "mlp.gate_proj.weight", d.i, d.h, u);
    add(p + "mlp.up_proj.weight", d.i, d.h, u);
    add(p + "mlp.down_proj.weight", d.h, d.i, u);
    add(p + "input_layernorm.weight", d.h, 1, u);
    add(p + "post_attention_layernorm.weight", d.h, 1, u);
  }
  add("model.norm.weight", d.h, 1, -1);
  if (!d.tied) add("lm_head.weight", d.V, d.h, -1);
  const std::string head = d.tied ? "model.embed_tokens" : "lm_head";
  // FSDP2: what this rank holds of each parameter at rest (its padded shard) and of AdamW's
  // states (its own rows, unpadded).
  Shard sh;
  sh.n = static_cast<u64>(o.fsdp_world);
  sh.k = static_cast<u64>(o.fsdp_rank);
  auto at_rest = [&](const Param& p) { return sh.n > 1 ? sh.padded_elems(p) : p.elems; };
  auto owned = [&](const Param& p) { return sh.n > 1 ? sh.local_elems(p) : p.elems; };

  const bool mixed = hf.recipe(t.dtype) == Precision::mixed;
  // mixed under FSDP2 is its MixedPrecisionPolicy(param_dtype=--dtype, reduce_dtype=float32)
  // on an fp32 model: the fp32 parameters are the masters (no copy of their own), gathered in
  // 16 bits; the step computes as the pure recipe does.
  const bool fsdp_mp = sh.n > 1 && mixed;
  const bool masters = mixed && !fsdp_mp;
  const u64 rw = fsdp_mp ? 4 : d.pw;         // the parameters' (and buffers') width at rest
  const u64 sw = mixed || d.amp ? 4 : d.pw;  // AdamW's state (and master) width
  const bool steps_on_device = o.cpu_kernels || hf.adamw_impl == AdamwImpl::fused;
  // What is alive when the step begins.
  for (auto& p : params)
    sim.alloc(checked_mul(at_rest(p), rw, "bytes"), p.name, HfStepKind::parameter);
  if (masters)  // the fp32 masters AdamW updates (alive for the whole run)
    for (auto& p : params)
      sim.alloc(checked_mul(p.elems, 4, "bytes"), "master." + p.name, HfStepKind::master_param);
  // rotary_emb.inv_freq and original_inv_freq, (d/2) each, in the model's dtype
  sim.alloc(checked_mul(d.d / 2, rw, "bytes"), "rotary_emb.inv_freq", HfStepKind::buffer);
  sim.alloc(checked_mul(d.d / 2, rw, "bytes"), "rotary_emb.original_inv_freq", HfStepKind::buffer);
  sim.alloc(d.tok(1, 8), "input_ids", HfStepKind::input);
  sim.alloc(d.tok(1, 8), "labels", HfStepKind::input);
  auto create_state = [&](Param& p) {
    if (steps_on_device) sim.alloc(4, "state.step." + p.name, HfStepKind::optimizer_state);
    sim.alloc(checked_mul(owned(p), sw, "bytes"), "state.exp_avg." + p.name,
              HfStepKind::optimizer_state);
    sim.alloc(checked_mul(owned(p), sw, "bytes"), "state.exp_avg_sq." + p.name,
              HfStepKind::optimizer_state);
  };
  std::vector<Id> prev_out;  // step 1's `out`: logits, the cache, the loss
  const u64 logits_w = d.aw;
  if (o.step == 2) {
    for (auto& p : params) create_state(p);
    prev_out.push_back(sim.alloc(d.tok(d.V, logits_w), "step1.out.logits"));
    if (d.cache && !d.ckpt)
      for (u64 l = 0; l < d.L; ++l) {
        // keys after RoPE (the embeddings' width: fp32 under autocast), values as v_proj made them
        prev_out.push_back(sim.alloc(d.tok(d.k * d.d, d.pw), "step1.out.cache.key"));
        prev_out.push_back(sim.alloc(d.tok(d.k * d.d, d.aw), "step1.out.cache.value"));
      }
    prev_out.push_back(sim.alloc(4, "step1.out.loss"));
  }
  sim.started = true;
  const std::size_t first_step_tensor = st.tensors.size();
  st.first_step_tensor = first_step_tensor;

  Step step(d, sim, params);
  Fsdp fsdp(sim, params, sh, d.pw, rw, static_cast<int>(d.L), o.reshard_after_forward, d.cpu);
  // ---- forward (LlamaModel.forward)
  fsdp.pre_forward(-1);
  const Id emb = sim.alloc(d.tok(d.h, d.pw), "model.embed_tokens.out");
  Id mask = kNone;
  if (!d.sdpa) {  // create_causal_mask (eager): a (b, 1, s, s) additive mask in the model dtype
    const Id le = sim.alloc(checked_mul(d.s, d.s, "bytes"), "causal_mask.bool");
    mask = sim.alloc(checked_product({d.b, d.s, d.s, d.pw}, "bytes"), "causal_mask");
    sim.drop(le);
  }
  // LlamaRotaryEmbedding: fp32 (1, s, d) cos and sin, cast to the embeddings' dtype
  const u64 tab = checked_product({d.s, d.d, 4}, "bytes");
  const Id freqs = sim.alloc(tab / 2, "rope.freqs");
  const Id embr = sim.alloc(tab, "rope.emb");
  const Id c0 = sim.alloc(tab, "rope.cos_raw");
  const Id c1 = sim.alloc(tab, "rope.cos_scaled");
  sim.drop(c0);
  const Id s0 = sim.alloc(tab, "rope.sin_raw");
  const Id s1 = sim.alloc(tab, "rope.sin_scaled");
  sim.drop(s0);
  Id cos = c1, sin = s1;
  if (d.pw != 4) {
    cos = sim.alloc(checked_product({d.s, d.d, d.pw}, "bytes"), "rope.cos");
    sin = sim.alloc(checked_product({d.s, d.d, d.pw}, "bytes"), "rope.sin");
  }
  sim.drop(freqs);
  sim.drop(embr);
  if (d.pw != 4) {
    sim.drop(c1);
    sim.drop(s1);
  }
  // every layer's RoPE multiplies save cos and sin: held until layer 0's RoPE backward
  step.tables_ = {sim.ref(cos), sim.ref(sin)};
  std::vector<LayerSaved> saved(d.L);
  Id hidden = sim.ref(emb);
  for (u64 l = 0; l < d.L; ++l) {
    LayerSaved& sv = saved[l];
    if (d.ckpt) {
      // freed in reverse: the RNG state, the mask, sin, cos, the input
      sv.frame = {sim.ref(hidden), sim.ref(cos), sim.ref(sin), sim.ref(mask)};
      // torch.utils.checkpoint keeps the CPU RNG state (a host tensor on a GPU step)
      if (d.cpu) sv.frame.push_back(sim.alloc(5056, "checkpoint.cpu_rng_state"));
    }
    fsdp.pre_forward(static_cast<int>(l));
    const Id out = step.layer_forward(static_cast<int>(l), hidden, !d.ckpt, false, sv);
    fsdp.post_forward(static_cast<int>(l));
    sim.drop(hidden);
    hidden = out;
  }
  NormSaved fn;
  const Id normed = step.rmsnorm(hidden, d.tok(d.h, 1), d.bs(), d.pw, "model.norm", true, fn);
  sim.drop(hidden);
  sim.drop(emb);
  sim.drop(mask);
  // LlamaForCausalLM: lm_head, then the loss inside the model call
  LinSaved hs;
  const Id logits = step.linear(normed, d.h, d.pw, head, d.V, true, hs);
  sim.phase = HfStepPhase::loss;
  const Id lf = logits_w == 4 ? sim.ref(logits) : sim.alloc(d.tok(d.V, 4), "loss.logits_f32");
  const Id lab = sim.alloc(checked_product({d.b, d.s + 1, 8}, "bytes"), "loss.labels_padded");
  const Id tgt = sim.alloc(d.tok(1, 8), "loss.shift_labels");
  const Id ls = sim.alloc(d.tok(d.V, 4), "loss.log_softmax");
  sim.alloc(4, "loss");  // held by `out` into the next step
  const Id tw = sim.alloc(4, "loss.total_weight");
  sim.drop(lf);
  sim.drop(lab);
  sim.phase = HfStepPhase::forward;
  fsdp.root_post_forward();
  sim.drop(normed);
  sim.drop(cos);
  sim.drop(sin);
  for (Id t : prev_out) sim.drop(t);  // `out` rebound: step 1's output freed
  if (d.amp) {
    sim.phase = HfStepPhase::autocast_exit;
    step.autocast_exit();
  }
  // ---- backward
  sim.phase = HfStepPhase::backward;
  const Id seed = sim.alloc(4, "grad.seed", HfStepKind::temporary);
  fsdp.root_pre_backward();
  const Id g1 = sim.alloc(d.tok(d.V, 4), "grad.nll", HfStepKind::temporary);
  sim.drop(tgt);
  sim.drop(tw);
  sim.drop(seed);
  const Id g2 = sim.alloc(d.tok(d.V, 4), "grad.log_softmax", HfStepKind::temporary);
  sim.drop(g1);
  sim.drop(ls);
  Id gl = g2;
  if (logits_w != 4) {
    gl = sim.alloc(d.tok(d.V, logits_w), "grad.logits", HfStepKind::temporary);
    sim.drop(g2);
  }
  Id gh = step.linear_back(gl, d.h, head, hs);
  {
    Id last = kNone;  // the last layer's output gradient
    step.rmsnorm_back(gh, fn, "model.norm", last);
    gh = last;
  }
  for (u64 l = d.L; l-- > 0;) {
    fsdp.pre_backward(static_cast<int>(l));
    gh = step.layer_backward(static_cast<int>(l), gh, saved[l]);
    fsdp.post_backward(static_cast<int>(l));
  }
  {  // EmbeddingBackward0: a dense (V, h) gradient
    Param& e = step.param("model.embed_tokens.weight");
    const Id ge = sim.alloc(checked_mul(e.elems, d.pw, "bytes"), "grad.model.embed_tokens.weight",
                            HfStepKind::gradient);
    sim.drop(gh);
    step.to_grad(e, ge);
  }
  fsdp.post_backward(-1);
  fsdp.end_backward();
  // ---- optimizer
  sim.phase = HfStepPhase::optimizer;
  // fused AdamW allocates nothing: the phase's one instant is then the live total it begins at
  const std::size_t optimizer_begins = st.events.size();
  std::vector<Id> mgrads;
  if (masters)
    for (auto& p : params)
      mgrads.push_back(sim.alloc(checked_mul(p.elems, 4, "bytes"), "master_grad." + p.name,
                                 HfStepKind::master_grad));
  if (o.step == 1)
    for (auto& p : params) create_state(p);
  if (hf.adamw_impl == AdamwImpl::foreach_) {
    std::vector<Id> sq;
    for (auto& p : params)
      sq.push_back(sim.alloc(checked_mul(owned(p), sw, "bytes"), "adamw.sqrt." + p.name,
                             HfStepKind::temporary));
    for (auto it = sq.rbegin(); it != sq.rend(); ++it) sim.drop(*it);
  } else if (hf.adamw_impl == AdamwImpl::forloop) {
    for (auto& p : params) {
      const Id a = sim.alloc(checked_mul(owned(p), sw, "bytes"), "adamw.sqrt." + p.name,
                             HfStepKind::temporary);
      const Id b = sim.alloc(checked_mul(owned(p), sw, "bytes"), "adamw.denom." + p.name,
                             HfStepKind::temporary);
      sim.drop(a);
      sim.drop(b);
    }
  }
  // ---- zero_grad(set_to_none=True)
  sim.phase = HfStepPhase::zero_grad;
  for (Id g : mgrads) sim.drop(g);
  if (fsdp.on()) {
    fsdp.zero_grad();
  } else {
    for (auto& p : params) {
      sim.drop(p.grad);
      p.grad = kNone;
    }
  }

  // ---- the walk: kinds of forward tensors, the peak, the phase maxima
  std::vector<bool> freed_before_backward(st.tensors.size(), false);
  bool in_backward = false;
  for (const auto& e : st.events) {
    if (e.phase == HfStepPhase::backward) in_backward = true;
    if (!e.alloc && !in_backward) freed_before_backward[e.tensor] = true;
  }
  // (step 1's output, alive when the step began, stays an activation)
  for (std::size_t i = first_step_tensor; i < st.tensors.size(); ++i)
    if (st.tensors[i].kind == HfStepKind::activation && freed_before_backward[i])
      st.tensors[i].kind = HfStepKind::temporary;
  u64 live = st.live_at_start;
  std::array<u64, kHfStepKinds> by = st.start_by_kind;
  bool backward_seen = false;
  u64 by_before_backward = 0;
  st.peak = live;
  st.by_kind_at_peak = by;
  // what is live as the optimizer step begins (its one instant when it allocates nothing)
  u64 live_at_optimizer = live;
  std::array<u64, kHfStepKinds> by_at_optimizer = by;
  for (std::size_t i = 0; i < st.events.size(); ++i) {
    if (i == optimizer_begins) {
      live_at_optimizer = live;
      by_at_optimizer = by;
    }
    const auto& e = st.events[i];
    const auto& t = st.tensors[e.tensor];
    auto& k = by[static_cast<int>(t.kind)];
    if (e.alloc) {
      live += t.bytes;
      k += t.bytes;
    } else {
      live -= t.bytes;
      k -= t.bytes;
    }
    const int ph = static_cast<int>(e.phase);
    if (!st.phase_seen[ph] || live > st.phase_max[ph]) {
      st.phase_max[ph] = live;
      st.phase_by_kind[ph] = by;
    }
    st.phase_seen[ph] = true;
    if (e.phase == HfStepPhase::backward && !backward_seen) {
      backward_seen = true;  // before this event: what the forward left
      st.activations_at_backward = by_before_backward;
    }
    if (!backward_seen) by_before_backward = by[static_cast<int>(HfStepKind::activation)];
    if (live > st.peak) {
      st.peak = live;
      st.peak_event = i;
      st.peak_phase = e.phase;
      st.by_kind_at_peak = by;
    }
  }
  st.live_at_end = live;
  const int opt = static_cast<int>(HfStepPhase::optimizer);
  if (!st.phase_seen[opt]) {
    st.phase_seen[opt] = true;
    st.phase_max[opt] = live_at_optimizer;
    st.phase_by_kind[opt] = by_at_optimizer;
  }
  st.recipe = std::string(
                  "out = model(input_ids, labels=labels); out.loss.backward(); opt.step(); "
                  "opt.zero_grad(set_to_none=True); step ") +
              std::to_string(o.step) + ", " + precision_name(hf.recipe(t.dtype)) + ", AdamW " +
              adamw_impl_name(hf.adamw_impl);
  return st;
}

std::vector<HfStepRankGroup> hf_step_fsdp2_ranks(const ModelConfig& m, const TrainConfig& t,
                                                 const HfOptions& hf, HfStepOptions o) {
  if (o.fsdp_world < 2)
    throw InputError("--world-size: the HF step per rank under FSDP2 needs at least 2 ranks");
  const u64 n = static_cast<u64>(o.fsdp_world);
  // A rank's step depends on its rows of each distinct dim 0 (torch.chunk's split): every
  // parameter's dim 0 is one of these.
  const std::vector<u64> dims = {static_cast<u64>(m.vocab),
                                 static_cast<u64>(m.heads) * static_cast<u64>(m.head_dim()),
                                 static_cast<u64>(m.kv_heads) * static_cast<u64>(m.head_dim()),
                                 static_cast<u64>(m.hidden),
                                 static_cast<u64>(m.intermediate),
                                 static_cast<u64>(m.head_dim())};
  auto key_of = [&](u64 k) {
    Shard sh;
    sh.n = n;
    sh.k = k;
    std::vector<u64> key;
    for (u64 r : dims) {
      Param p;
      p.rows = r;
      p.cols = 1;
      key.push_back(sh.local_elems(p));
    }
    return key;
  };
  // Where a rank's rows of some dim change: after the ranks of whole chunks (r / c of them) and
  // after the one with the remainder.
  std::vector<u64> starts = {0};
  for (u64 r : dims) {
    const u64 c = (r + n - 1) / n;
    for (u64 b : {r / c, r / c + 1})
      if (b < n) starts.push_back(b);
  }
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  std::vector<HfStepRankGroup> groups;
  std::vector<u64> last_key;
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const u64 end = i + 1 < starts.size() ? starts[i + 1] : n;  // exclusive
    std::vector<u64> key = key_of(starts[i]);
    if (!groups.empty() && key == last_key) {
      groups.back().last = static_cast<int>(end - 1);
      continue;
    }
    o.fsdp_rank = static_cast<int>(starts[i]);
    groups.push_back(HfStepRankGroup{static_cast<int>(starts[i]), static_cast<int>(end - 1),
                                     hf_step(m, t, hf, o)});
    last_key = std::move(key);
  }
  return groups;
}

}  // namespace trainmem
