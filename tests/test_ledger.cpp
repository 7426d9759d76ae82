// Ledger arithmetic against a small independent model of the books, plus the error paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "trainmem/ledger/ledger.hpp"
#include "trainmem/probes/cupti_tag_allocator.hpp"
#include "trainmem/probes/probes.hpp"

namespace trainmem {
namespace {

// The reference model: a list of live allocations and plain recomputation from it after
// every event. Deliberately naive (sums over the live list) so it shares no logic with the
// ledger's incremental counters.
struct ModelBooks {
  struct Alloc {
    std::uint64_t bytes;
    int category;
  };
  std::map<std::uint64_t, Alloc> live;  // by ledger tensor id
  std::array<std::uint64_t, kNumCategories> peak{};
  std::uint64_t peak_total = 0;
  std::array<std::uint64_t, kNumCategories> breakdown{};
  std::string peak_tensor;
  std::array<std::uint64_t, kNumPhases> phase_peak{};
  std::vector<int> stack;  // phases as ints
  std::uint64_t act_end_forward = 0;
  std::uint64_t peak_count = 0;
  std::uint64_t events = 0;
  std::vector<std::int64_t> deltas;  // every event, in order
  std::vector<std::uint64_t> totals;

  std::uint64_t live_cat(int c) const {
    std::uint64_t s = 0;
    for (auto& kv : live)
      if (kv.second.category == c) s += kv.second.bytes;
    return s;
  }
  std::uint64_t live_total() const {
    std::uint64_t s = 0;
    for (auto& kv : live) s += kv.second.bytes;
    return s;
  }
  std::set<int> active_phases() const {
    std::set<int> a(stack.begin(), stack.end());
    if (stack.empty()) a.insert(0);  // setup
    return a;
  }
  void observe_phases() {
    const auto t = live_total();
    for (int p : active_phases()) phase_peak[p] = std::max(phase_peak[p], t);
  }
  void on_alloc(std::uint64_t id, std::uint64_t bytes, int c, const std::string& name) {
    live[id] = {bytes, c};
    peak_count = std::max<std::uint64_t>(peak_count, live.size());
    for (int k = 0; k < kNumCategories; ++k) peak[k] = std::max(peak[k], live_cat(k));
    const auto t = live_total();
    if (t > peak_total) {
      peak_total = t;
      for (int k = 0; k < kNumCategories; ++k) breakdown[k] = live_cat(k);
      peak_tensor = name;
    }
    observe_phases();
    ++events;
    deltas.push_back(static_cast<std::int64_t>(bytes));
    totals.push_back(t);
  }
  void on_free(std::uint64_t id) {
    const auto b = live.at(id).bytes;
    live.erase(id);
    ++events;
    deltas.push_back(-static_cast<std::int64_t>(b));
    totals.push_back(live_total());
  }
  void push(int p) {
    stack.push_back(p);
    observe_phases();
  }
  void pop() {
    stack.pop_back();
    observe_phases();
  }
  void begin_step() {
    for (int k = 0; k < kNumCategories; ++k) peak[k] = live_cat(k);
    peak_total = live_total();
    for (int k = 0; k < kNumCategories; ++k) breakdown[k] = live_cat(k);
    peak_tensor.clear();
    const auto act = active_phases();
    for (int p = 0; p < kNumPhases; ++p) phase_peak[p] = act.count(p) ? live_total() : 0;
    act_end_forward = 0;
    peak_count = live.size();
  }
};

void expect_books_equal(const Ledger& l, const ModelBooks& m, const std::string& where) {
  SCOPED_TRACE(where);
  for (Category c : all_categories()) {
    const int k = static_cast<int>(c);
    EXPECT_EQ(l.live(c), m.live_cat(k)) << category_name(c);
    EXPECT_EQ(l.peak(c), m.peak[k]) << category_name(c);
    EXPECT_EQ(l.peak_total().breakdown[k], m.breakdown[k]) << category_name(c);
  }
  EXPECT_EQ(l.live_total(), m.live_total());
  EXPECT_EQ(l.peak_total().bytes, m.peak_total);
  EXPECT_EQ(l.peak_total().tensor, m.peak_tensor);
  for (int p = 0; p < kNumPhases; ++p)
    EXPECT_EQ(l.phase_peak(static_cast<Phase>(p)), m.phase_peak[p])
        << phase_name(static_cast<Phase>(p));
  EXPECT_EQ(l.activations_end_of_forward(), m.act_end_forward);
  EXPECT_EQ(l.live_count(), m.live.size());
  EXPECT_EQ(l.peak_live_count(), m.peak_count);
}

// Random allocate / release / phase push-pop / step / end-of-forward sequences.
void run_random_sequence(unsigned seed, std::size_t timeline_cap) {
  MetaAllocator meta;
  LedgerOptions opt;
  opt.timeline_cap = timeline_cap;
  Ledger ledger(meta, opt);
  ModelBooks model;
  std::mt19937_64 rng(seed);
  std::vector<Tensor> handles;
  std::vector<std::pair<void*, std::uint64_t>> raw;  // raw allocations (ptr, id)
  const Phase phases[] = {Phase::forward, Phase::backward, Phase::recompute, Phase::optimizer,
                          Phase::setup};
  for (int it = 0; it < 3000; ++it) {
    const int op = static_cast<int>(rng() % 100);
    if (op < 40) {
      const int c = static_cast<int>(rng() % kNumCategories);
      const std::int64_t rows = 1 + static_cast<std::int64_t>(rng() % 64);
      const std::int64_t cols = 1 + static_cast<std::int64_t>(rng() % 300);
      const DType dt = (rng() % 2) ? DType::bf16 : DType::f32;
      const std::string name = "t" + std::to_string(it);
      Tensor t = ledger.allocate(name, static_cast<Category>(c), it % 7, {rows, cols}, dt);
      const std::uint64_t expect_bytes =
          static_cast<std::uint64_t>(rows * cols) * (dt == DType::bf16 ? 2u : 4u);
      ASSERT_EQ(t.bytes(), expect_bytes);
      model.on_alloc(t.id(), expect_bytes, c, name);
      handles.push_back(std::move(t));
    } else if (op < 48) {
      const int c = static_cast<int>(rng() % kNumCategories);
      const std::uint64_t bytes = 1 + rng() % 100000;
      std::uint64_t id = 0;
      const std::string name = "raw" + std::to_string(it);
      void* p = ledger.allocate_bytes(bytes, name, static_cast<Category>(c), -1, &id);
      model.on_alloc(id, bytes, c, name);
      raw.emplace_back(p, id);
    } else if (op < 78) {
      if (!handles.empty()) {
        const std::size_t i = rng() % handles.size();
        const auto id = handles[i].id();
        handles.erase(handles.begin() + static_cast<std::ptrdiff_t>(i));  // RAII release
        model.on_free(id);
      } else if (!raw.empty()) {
        ledger.release(raw.back().first);
        model.on_free(raw.back().second);
        raw.pop_back();
      }
    } else if (op < 84) {
      if (!raw.empty()) {
        const std::size_t i = rng() % raw.size();
        ledger.release(raw[i].first);
        model.on_free(raw[i].second);
        raw.erase(raw.begin() + static_cast<std::ptrdiff_t>(i));
      }
    } else if (op < 90) {
      if (model.stack.size() < 4) {
        const Phase p = phases[rng() % 5];
        ledger.push_phase(p);
        model.push(static_cast<int>(p));
      }
    } else if (op < 96) {
      if (!model.stack.empty()) {
        ledger.pop_phase();
        model.pop();
      }
    } else if (op < 98) {
      ledger.mark_end_of_forward();
      model.act_end_forward = model.live_cat(static_cast<int>(Category::activations));
    } else {
      ledger.begin_step(it);
      model.begin_step();
    }
    if (it % 97 == 0) expect_books_equal(ledger, model, "iteration " + std::to_string(it));
    if (::testing::Test::HasFatalFailure()) return;
  }
  expect_books_equal(ledger, model, "end");

  // Timeline: the first `cap` events are kept, the rest counted.
  const std::uint64_t kept = std::min<std::uint64_t>(model.events, timeline_cap);
  ASSERT_EQ(ledger.timeline().size(), kept);
  EXPECT_EQ(ledger.dropped_events(), model.events - kept);
  for (std::size_t i = 0; i < kept; ++i) {
    const auto& e = ledger.timeline()[i];
    EXPECT_EQ(e.seq, i + 1);
    EXPECT_EQ(e.delta, model.deltas[i]) << "event " << i;
    EXPECT_EQ(e.live_total, model.totals[i]) << "event " << i;
    if (i > 0) {
      EXPECT_GE(e.time_ns, ledger.timeline()[i - 1].time_ns);
    }
  }
  // Live tensors: exactly those the model holds.
  auto lt = ledger.live_tensors();
  ASSERT_EQ(lt.size(), model.live.size());
  for (const auto* r : lt) {
    ASSERT_TRUE(model.live.count(r->id)) << r->name;
    EXPECT_EQ(r->bytes, model.live.at(r->id).bytes);
    EXPECT_EQ(static_cast<int>(r->category), model.live.at(r->id).category);
    EXPECT_EQ(r->free_seq, 0u);
  }
  for (auto& [p, id] : raw) ledger.release(p);
}

TEST(LedgerRandom, MatchesIndependentModelUnlimitedTimeline) {
  for (unsigned seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    run_random_sequence(seed, 1u << 20);
  }
}

TEST(LedgerRandom, MatchesIndependentModelCappedTimeline) {
  for (unsigned seed : {4u, 5u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    run_random_sequence(seed, 100);
  }
}

TEST(Ledger, PeakBreakdownIsTheInstantOfThePeak) {
  MetaAllocator meta;
  Ledger l(meta);
  Tensor p = l.allocate("w", Category::params, -1, {1000}, DType::f32);            // 4000
  Tensor a = l.allocate("act", Category::activations, 0, {500}, DType::f32);       // 2000
  Tensor g = l.allocate("grad", Category::gradients, -1, {250}, DType::f32);       // 1000: 7000
  a.reset();                                                                       // 5000
  Tensor o = l.allocate("m", Category::optimizer_states, -1, {1500}, DType::f32);  // 11000
  EXPECT_EQ(l.peak_total().bytes, 11000u);
  EXPECT_EQ(l.peak_total().tensor, "m");
  const auto& b = l.peak_total().breakdown;
  EXPECT_EQ(b[static_cast<int>(Category::params)], 4000u);
  EXPECT_EQ(b[static_cast<int>(Category::activations)], 0u);  // freed before the peak
  EXPECT_EQ(b[static_cast<int>(Category::gradients)], 1000u);
  EXPECT_EQ(b[static_cast<int>(Category::optimizer_states)], 6000u);
  EXPECT_EQ(l.peak(Category::activations), 2000u);  // its own peak is kept
  EXPECT_EQ(l.live(Category::activations), 0u);
  // Reaching the same total again with another mix keeps the first instant.
  o.reset();
  Tensor w = l.allocate("ws", Category::workspace, 0, {1500}, DType::f32);  // 11000 again
  EXPECT_EQ(l.peak_total().bytes, 11000u);
  EXPECT_EQ(l.peak_total().tensor, "m");
  EXPECT_EQ(l.peak_total().breakdown[static_cast<int>(Category::workspace)], 0u);
  EXPECT_EQ(l.peak_total().breakdown[static_cast<int>(Category::optimizer_states)], 6000u);
}

TEST(Ledger, PhasesNestAndEachKeepsItsPeak) {
  MetaAllocator meta;
  Ledger l(meta);
  Tensor w = l.allocate("w", Category::params, -1, {100}, DType::f32);  // 400 in setup
  l.begin_step(1);
  EXPECT_EQ(l.phase_peak(Phase::setup), 400u);
  {
    auto fwd = l.scope(Phase::forward);
    EXPECT_EQ(l.phase(), Phase::forward);
    Tensor a = l.allocate("a", Category::activations, 0, {50}, DType::f32);     // 600
    Tensor keep = l.allocate("k", Category::activations, 0, {25}, DType::f32);  // 700
    a.reset();                                                                  // 500
    l.mark_end_of_forward();
    EXPECT_EQ(l.activations_end_of_forward(), 100u);
    {
      auto bwd = l.scope(Phase::backward);
      {
        auto rec = l.scope(Phase::recompute);  // nested: recompute inside backward
        EXPECT_EQ(l.phase(), Phase::recompute);
        Tensor r = l.allocate("r", Category::activations, 0, {200}, DType::f32);  // 1300
      }
      EXPECT_EQ(l.phase(), Phase::backward);
      Tensor g = l.allocate("g", Category::workspace, 0, {10}, DType::f32);  // 540
    }
  }
  EXPECT_EQ(l.phase(), Phase::setup);
  // Forward was on the stack throughout (recompute nested in backward nested in forward).
  EXPECT_EQ(l.phase_peak(Phase::forward), 1300u);
  EXPECT_EQ(l.phase_peak(Phase::backward), 1300u);
  EXPECT_EQ(l.phase_peak(Phase::recompute), 1300u);
  EXPECT_EQ(l.phase_peak(Phase::optimizer), 0u);  // never entered this step
  EXPECT_EQ(l.phase_peak(Phase::setup), 400u);    // not active while a phase was pushed
  {
    auto opt = l.scope(Phase::optimizer);
    Tensor m = l.allocate("m", Category::optimizer_states, -1, {10}, DType::f32);
  }
  EXPECT_EQ(l.phase_peak(Phase::optimizer), 440u);
  // begin_step resets peaks to what is live now.
  l.begin_step(2);
  EXPECT_EQ(l.step(), 2);
  EXPECT_EQ(l.peak_total().bytes, 400u);
  EXPECT_EQ(l.peak(Category::activations), 0u);
  EXPECT_EQ(l.peak(Category::params), 400u);
  EXPECT_EQ(l.phase_peak(Phase::forward), 0u);
  EXPECT_EQ(l.activations_end_of_forward(), 0u);
  EXPECT_THROW(l.pop_phase(), Error);
}

TEST(Ledger, RecordsKeepShapePhaseStepAndFreeSequence) {
  MetaAllocator meta;
  Ledger l(meta);
  l.begin_step(3);
  l.push_phase(Phase::forward);
  Tensor t =
      l.allocate("model.layers.0.attn.probs", Category::activations, 0, {2, 4, 8, 8}, DType::bf16);
  l.pop_phase();
  ASSERT_EQ(l.tensors().size(), 1u);
  const TensorRecord& r = l.tensors()[0];
  EXPECT_EQ(r.name, "model.layers.0.attn.probs");
  EXPECT_EQ(r.shape, (std::vector<std::int64_t>{2, 4, 8, 8}));
  EXPECT_EQ(r.dtype, DType::bf16);
  EXPECT_EQ(r.bytes, 2u * 4 * 8 * 8 * 2);
  EXPECT_EQ(r.phase, Phase::forward);
  EXPECT_EQ(r.step, 3);
  EXPECT_EQ(r.layer, 0);
  EXPECT_EQ(r.alloc_seq, 1u);
  EXPECT_EQ(r.free_seq, 0u);
  EXPECT_EQ(t.numel(), 2u * 4 * 8 * 8);
  t.reset();
  EXPECT_FALSE(t);
  EXPECT_EQ(l.tensors()[0].free_seq, 2u);
  EXPECT_TRUE(l.live_tensors().empty());
}

TEST(Ledger, MovedTensorReleasesOnce) {
  MetaAllocator meta;
  Ledger l(meta);
  Tensor a = l.allocate("a", Category::workspace, -1, {16}, DType::f32);
  Tensor b = std::move(a);
  EXPECT_FALSE(a);
  EXPECT_EQ(l.live_total(), 64u);
  Tensor c = l.allocate("c", Category::workspace, -1, {8}, DType::f32);
  b = std::move(c);  // releases the 64 bytes b held
  EXPECT_EQ(l.live_total(), 32u);
  b.reset();
  b.reset();  // no-op when empty
  EXPECT_EQ(l.live_total(), 0u);
  EXPECT_EQ(l.timeline().size(), 4u);
}

TEST(Ledger, DoubleReleaseAndForeignPointerThrow) {
  MetaAllocator meta;
  Ledger l(meta);
  void* p = l.allocate_bytes(100, "x", Category::workspace, -1);
  l.release(p);
  try {
    l.release(p);
    FAIL() << "double release not caught";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("release of unknown pointer"), std::string::npos)
        << e.what();
  }
  int on_stack = 0;
  try {
    l.release(&on_stack);
    FAIL() << "foreign pointer not caught";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not allocated by this ledger"), std::string::npos)
        << e.what();
  }
  // A pointer from another ledger is foreign too.
  MetaAllocator meta2;
  Ledger other(meta2);
  void* q = other.allocate_bytes(64, "y", Category::workspace, -1);
  Ledger third(meta);
  EXPECT_THROW(third.release(q), Error);
  EXPECT_EQ(l.live_total(), 0u);  // books unchanged by the failed releases
  EXPECT_EQ(other.live_total(), 64u);
  other.release(q);
}

TEST(Ledger, ZeroSizeAndNegativeDimensionsAreInputErrors) {
  MetaAllocator meta;
  Ledger l(meta);
  try {
    l.allocate("empty", Category::activations, 0, {4, 0}, DType::f32);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'empty'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("zero size"), std::string::npos) << e.what();
  }
  EXPECT_THROW(l.allocate_bytes(0, "z", Category::workspace, -1), InputError);
  EXPECT_THROW(l.allocate("neg", Category::activations, 0, {-1, 4}, DType::f32), InputError);
  EXPECT_THROW(l.allocate("huge", Category::activations, 0, {1LL << 40, 1LL << 40}, DType::f32),
               OverflowError);
  EXPECT_EQ(l.live_total(), 0u);
  EXPECT_TRUE(l.timeline().empty());
}

TEST(Ledger, OutOfMemoryThroughBudgetCarriesTheFacts) {
  MetaAllocator meta;
  BudgetAllocator budget(meta, 10000);
  Ledger l(budget);
  Tensor p = l.allocate("w", Category::params, -1, {1000}, DType::f32);         // 4000
  Tensor a = l.allocate("act0", Category::activations, 0, {1000}, DType::f32);  // 8000
  try {
    Tensor b = l.allocate("layers.1.mlp.up", Category::activations, 1, {1000}, DType::bf16);
    // 2000 more would be exactly 10000: allowed.
    EXPECT_EQ(l.live_total(), 10000u);
    Tensor c = l.allocate("layers.1.mlp.gate", Category::workspace, 1, {1}, DType::f32);
    FAIL() << "budget not enforced";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.requested_bytes, 4u);
    EXPECT_EQ(e.category, "workspace");
    EXPECT_EQ(e.tensor, "layers.1.mlp.gate");
    EXPECT_EQ(e.live_bytes, 10000u);
    const std::string m = e.what();
    EXPECT_NE(m.find("4 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("layers.1.mlp.gate"), std::string::npos) << m;
    EXPECT_NE(m.find("workspace"), std::string::npos) << m;
    EXPECT_NE(m.find("10000 bytes live"), std::string::npos) << m;
    EXPECT_NE(m.find("budget of 10000 bytes"), std::string::npos) << m;
  }
  // The failed allocation left no trace; the tensor allocated inside the try was released.
  EXPECT_EQ(l.live_total(), 8000u);
  EXPECT_EQ(budget.live_bytes(), 8000u);
  EXPECT_EQ(l.live_tensors().size(), 2u);
  // What was alive when it failed stays listed, the one the unwinding freed included (an OOM
  // inside a constructor frees everything it had allocated before the report reads the books).
  const auto& at = l.live_at_last_failure();
  ASSERT_EQ(at.size(), 3u);
  EXPECT_EQ(at[0].name, "w");
  EXPECT_EQ(at[1].name, "act0");
  EXPECT_EQ(at[2].name, "layers.1.mlp.up");
  EXPECT_EQ(at[0].bytes + at[1].bytes + at[2].bytes, 10000u);
  a.reset();
  Tensor d = l.allocate("fits_again", Category::activations, 0, {1500}, DType::f32);
  EXPECT_EQ(budget.live_bytes(), 10000u);
}

// Records what the ledger tells the allocator before each allocation.
class AnnotationRecorder final : public Allocator {
 public:
  void* allocate(std::uint64_t bytes) override {
    calls.push_back({last_category, last_id, bytes});
    return meta.allocate(bytes);
  }
  void deallocate(void* p, std::uint64_t bytes) override { meta.deallocate(p, bytes); }
  const char* name() const override { return "recorder"; }
  void annotate(Category c, std::uint64_t id) override {
    last_category = c;
    last_id = id;
  }
  struct Call {
    Category category;
    std::uint64_t id;
    std::uint64_t bytes;
  };
  std::vector<Call> calls;
  Category last_category = Category::inputs;
  std::uint64_t last_id = 0;
  MetaAllocator meta;
};

TEST(Allocators, LedgerAnnotatesEachAllocationThroughABudget) {
  AnnotationRecorder rec;
  BudgetAllocator budget(rec, 1 << 20);
  Ledger l(budget);
  Tensor a = l.allocate("a", Category::gradients, 0, {10}, DType::f32);
  Tensor b = l.allocate("b", Category::optimizer_states, 0, {3}, DType::bf16);
  ASSERT_EQ(rec.calls.size(), 2u);
  EXPECT_EQ(rec.calls[0].category, Category::gradients);
  EXPECT_EQ(rec.calls[0].id, a.id());
  EXPECT_EQ(rec.calls[0].bytes, 40u);
  EXPECT_EQ(rec.calls[1].category, Category::optimizer_states);
  EXPECT_EQ(rec.calls[1].id, b.id());
  EXPECT_EQ(rec.calls[1].bytes, 6u);
}

// The probes' CUPTI tagging wraps an allocator without changing what it sees: annotations and
// bytes go through, and the id it would push carries the ledger's category and tensor id.
TEST(Allocators, CuptiTagAllocatorForwardsAndEncodesTheLedgersAnnotation) {
  AnnotationRecorder rec;
  CuptiTagAllocator tagged(rec);
  BudgetAllocator budget(tagged, 1 << 20);
  Ledger l(budget);
  EXPECT_STREQ(budget.name(), "recorder");
  Tensor a = l.allocate("a", Category::activations, 3, {7}, DType::bf16);
  ASSERT_EQ(rec.calls.size(), 1u);
  EXPECT_EQ(rec.calls[0].category, Category::activations);
  EXPECT_EQ(rec.calls[0].id, a.id());
  EXPECT_EQ(rec.calls[0].bytes, 14u);
  EXPECT_EQ(tagged.pending_external_id(), 0u);  // used by that allocation

  tagged.annotate(Category::optimizer_states, 41);
  const std::uint64_t id = tagged.pending_external_id();
  EXPECT_EQ(id, (41ull << 8) | (static_cast<std::uint64_t>(Category::optimizer_states) + 1));
  EXPECT_EQ(external_id_category(id), static_cast<int>(Category::optimizer_states));
  EXPECT_EQ(external_id_tensor(id), 41u);
  void* p = tagged.allocate(8);
  EXPECT_EQ(tagged.pending_external_id(), 0u);
  tagged.deallocate(p, 8);
}

TEST(Allocators, HostIsAlignedAndWritable) {
  HostAllocator host;
  Ledger l(host);
  std::vector<Tensor> ts;
  for (std::int64_t n : {1, 3, 255, 256, 257, 10000}) {
    Tensor t = l.allocate("h", Category::workspace, -1, {n}, DType::f32);
    ASSERT_TRUE(t);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 256, 0u);
    float* f = t.as<float>();
    for (std::int64_t i = 0; i < n; ++i) f[i] = static_cast<float>(i);
    EXPECT_EQ(f[n - 1], static_cast<float>(n - 1));
    ts.push_back(std::move(t));
  }
  EXPECT_TRUE(host.touches_memory());
  // A request no machine can satisfy comes back as OutOfMemory, not a crash.
  EXPECT_THROW(l.allocate_bytes(~0ull - 10, "too_big", Category::workspace, -1), OutOfMemory);
}

TEST(Allocators, MetaAddressesAreUniqueAlignedAndDisjoint) {
  MetaAllocator meta;
  EXPECT_FALSE(meta.touches_memory());
  std::vector<std::pair<std::uintptr_t, std::uint64_t>> ranges;
  for (std::uint64_t b : {1ull, 256ull, 257ull, 1ull << 33, 7ull}) {
    auto p = reinterpret_cast<std::uintptr_t>(meta.allocate(b));
    EXPECT_EQ(p % 256, 0u);
    ranges.emplace_back(p, b);
  }
  for (std::size_t i = 0; i < ranges.size(); ++i)
    for (std::size_t j = i + 1; j < ranges.size(); ++j) {
      const bool disjoint = ranges[i].first + ranges[i].second <= ranges[j].first ||
                            ranges[j].first + ranges[j].second <= ranges[i].first;
      EXPECT_TRUE(disjoint) << i << " and " << j;
    }
}

TEST(Names, CategoriesAndPhases) {
  EXPECT_STREQ(category_name(Category::params), "params");
  EXPECT_STREQ(category_name(Category::gradients), "gradients");
  EXPECT_STREQ(category_name(Category::optimizer_states), "optimizer_states");
  EXPECT_STREQ(category_name(Category::activations), "activations");
  EXPECT_STREQ(category_name(Category::workspace), "workspace");
  EXPECT_STREQ(category_name(Category::inputs), "inputs");
  EXPECT_STREQ(phase_name(Phase::setup), "setup");
  EXPECT_STREQ(phase_name(Phase::forward), "forward");
  EXPECT_STREQ(phase_name(Phase::backward), "backward");
  EXPECT_STREQ(phase_name(Phase::recompute), "recompute");
  EXPECT_STREQ(phase_name(Phase::optimizer), "optimizer");
}

}  // namespace
}  // namespace trainmem
