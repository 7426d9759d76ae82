// End to end: `trainmem diff A B` as a user runs it. native against hf-eager, each tensor's Δ
// against bytes written here from docs/formulas.md; saved reports against the profiles they
// were saved from; a report against itself; different models and shapes; a measured ledger
// against native per category; the formats; bad input (exit 2 naming the file or the flag and
// what is wrong).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "test_cli_e2e_helpers.hpp"

namespace trainmem::e2e {
namespace {

bool has(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// Writes `text` to a fresh temporary file and returns its path.
std::string file_with(const std::string& leaf, const std::string& text) {
  const std::string path = temp_path(leaf);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// Saves `trainmem <args> --format json` to a temporary file.
std::string saved(const std::string& leaf, const std::string& args) {
  const Result r = trainmem(args + " --format json");
  EXPECT_EQ(r.code, 0) << args << "\n" << r.err;
  return file_with(leaf, r.out);
}

// The text table of the tensors (after its heading): the header, then each row up to the
// first empty line (rules of '-' dropped). Cells of a row: split_columns (an empty "A -> B"
// cell merges, the cells before it do not move).
std::vector<std::string> tensor_rows(const std::string& text) {
  std::vector<std::string> out;
  const auto at = text.find("\nGroup", text.find("Tensors by group"));
  if (at == std::string::npos) return out;
  std::istringstream in(text.substr(at + 1));
  std::string line;
  while (std::getline(in, line) && !line.empty())
    if (line.find_first_not_of('-') != std::string::npos) out.push_back(line);
  return out;
}

using Bytes = std::map<std::string, std::uint64_t>;  // "group/name" -> bytes of one instance

// LLaMA-7B, b 8, s 512, fp16 (w = 2), eager, no checkpointing: the two profiles' tensor lists
// from docs/formulas.md ("Profile native", "Profile hf-eager").
struct Llama7b {
  std::uint64_t b = 8, s = 512, h = 4096, i = 11008, a = 32, d = 128, L = 32, V = 32000;
  std::uint64_t sbh = s * b * h, sbi = s * b * i, as2b = a * s * s * b, sb = s * b;
  Bytes native() const {
    Bytes m;
    for (const char* n : {"xn1", "q", "k", "v", "attn_out", "h_mid", "xn2", "out"})
      m[std::string("layer/") + n] = 2 * sbh;
    m["layer/rstd1"] = m["layer/rstd2"] = 4 * sb;
    m["layer/probs"] = 2 * as2b;
    m["layer/gate"] = m["layer/up"] = m["layer/act"] = 2 * sbi;
    m["embedding/embed_out"] = 2 * sbh;
    m["head/final_norm_out"] = 2 * sbh;
    m["head/final_rstd"] = m["head/ce_lse"] = 4 * sb;
    m["head/logits"] = 2 * sb * V;
    m["inputs/tokens"] = m["inputs/targets"] = 4 * sb;
    return m;
  }
  Bytes hf_eager() const {
    Bytes m;
    auto norm = [&](const std::string& p, const std::string& input) {
      m[p + "." + input] = 2 * sbh;
      m[p + ".x_f32"] = m[p + ".x_squared_f32"] = m[p + ".x_normed_f32"] = 4 * sbh;
      m[p + ".rsqrt"] = 4 * sb;
      m[p + ".out"] = 2 * sbh;
    };
    norm("layer/input_layernorm", "x");
    norm("layer/post_attention_layernorm", "h_mid");
    m["layer/rope.cos"] = m["layer/rope.sin"] = 2 * s * d;
    for (const char* n : {"q_embed_copy", "k_embed_copy", "v_copy", "attn_output"})
      m[std::string("layer/") + n] = 2 * sbh;
    m["layer/scores_masked"] = m["layer/probs"] = 2 * as2b;
    m["layer/softmax_f32"] = 4 * as2b;
    m["layer/finfo_min"] = 4;
    for (const char* n : {"mlp.gate", "mlp.silu", "mlp.up", "mlp.prod"})
      m[std::string("layer/") + n] = 2 * sbi;
    norm("head/norm", "x");
    m["head/loss.log_softmax"] = 2 * b * (s - 1) * V;
    m["head/loss.shift_labels"] = 8 * b * (s - 1);
    m["head/loss.total_weight"] = 2;
    // The loop (4.30, hf-model-loss): the caller holds the returned fp16 logits.
    m["loop/loop.logits"] = 2 * b * s * V;
    m["inputs/input_ids"] = m["inputs/labels"] = 8 * sb;
    return m;
  }
  // Activations: every group but inputs, a layer entry L times.
  std::uint64_t activations(const Bytes& m) const {
    std::uint64_t t = 0;
    for (const auto& [k, v] : m)
      if (k.rfind("inputs/", 0) != 0) t += k.rfind("layer/", 0) == 0 ? L * v : v;
    return t;
  }
};

const std::string kLlama = "--model llama-7b --batch 8 --seq 512 --dtype fp16";

TEST(CliE2EDiff, NativeAgainstHfEagerEachTensorsDeltaIsTheFormulasDifference) {
  const Llama7b m;
  const Bytes na = m.native(), hf = m.hf_eager();
  const Result r = trainmem("diff native hf-eager " + kLlama + " --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  EXPECT_EQ(j["schema"], "trainmem/1");
  EXPECT_EQ(j["granularity"], "tensor");
  EXPECT_TRUE(j["same_model"].get<bool>());
  EXPECT_TRUE(j["same_shape"].get<bool>());

  std::set<std::string> keys;
  for (const auto& [k, v] : na) keys.insert(k);
  for (const auto& [k, v] : hf) keys.insert(k);
  std::set<std::string> seen;
  for (const auto& row : j["tensors"]) {
    const std::string group = row["group"], key = group + "/" + row["name"].get<std::string>();
    SCOPED_TRACE(key);
    ASSERT_TRUE(keys.count(key)) << "a row the formulas do not list";
    seen.insert(key);
    const std::uint64_t count = group == "layer" ? m.L : 1;
    const std::uint64_t a = na.count(key) ? count * na.at(key) : 0;
    const std::uint64_t b = hf.count(key) ? count * hf.at(key) : 0;
    EXPECT_EQ(row["a_bytes"].get<std::uint64_t>(), a);
    EXPECT_EQ(row["b_bytes"].get<std::uint64_t>(), b);
    EXPECT_EQ(row["delta"].get<std::int64_t>(),
              static_cast<std::int64_t>(b) - static_cast<std::int64_t>(a));
    EXPECT_EQ(row["a"].is_null(), !na.count(key));
    EXPECT_EQ(row["b"].is_null(), !hf.count(key));
  }
  EXPECT_EQ(seen, keys) << "rows missing from the diff";

  // Categories: activations per the formulas, and as docs/formulas.md's worked example says.
  std::map<std::string, std::int64_t> delta;
  for (const auto& c : j["categories"]) delta[c["category"]] = c["delta"].get<std::int64_t>();
  EXPECT_EQ(m.activations(na), 21872279552u);
  // hf-eager: the saved tensors (50,736,984,130) and the loop's returned fp16 logits
  // (2·b·s·V = 262,144,000).
  EXPECT_EQ(m.activations(hf), 50736984130u + 262144000u);
  EXPECT_EQ(delta["activations"], 50736984130 + 262144000 - 21872279552);
  EXPECT_EQ(delta["params"], 0);
  EXPECT_EQ(delta["gradients"], 0);
  EXPECT_EQ(delta["optimizer_states"], 0);
  EXPECT_EQ(delta["inputs"], 16 * 4096 - 8 * 4096);

  // Per layer: 16·sbh + 6·sbi + 2·as²b + 8·sb against 40·sbh + 8·sbi + 8·as²b + 8·sb + 4·s·d + 4.
  const json& pd = j["per_layer"]["delta"];
  EXPECT_EQ(pd["sbh"].get<double>(), 24);
  EXPECT_EQ(pd["sbi"].get<double>(), 2);
  EXPECT_EQ(pd["as2b"].get<double>(), 6);
  EXPECT_EQ(pd["sb"].get<double>(), 0);
  EXPECT_EQ(pd["other_bytes"].get<std::int64_t>(), 4 * 512 * 128 + 4);
  EXPECT_EQ(j["per_layer"]["change"], "+24·sbh +2·sbi +6·as²b +262,148 B");

  // Groups: each the sum of its rows, sorted by |Δ|.
  std::int64_t last = INT64_MAX;
  for (const auto& g : j["groups"]) {
    const std::int64_t d = g["delta"].get<std::int64_t>();
    EXPECT_LE(std::llabs(d), last) << g.dump();
    last = std::llabs(d);
    std::int64_t sum = 0;
    for (const auto& row : j["tensors"])
      if (row["group"] == g["group"]) sum += row["delta"].get<std::int64_t>();
    EXPECT_EQ(d, sum) << g.dump();
  }

  // The text form: the per-layer change, the largest row first, its coefficient and reason.
  const Result t = trainmem("diff native hf-eager " + kLlama);
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_TRUE(has(t.out, "Δ = +24·sbh +2·sbi +6·as²b +262,148 B")) << t.out;
  const auto rows = tensor_rows(t.out);
  ASSERT_GE(rows.size(), 3u) << t.out;
  const auto first = split_columns(rows[1]);
  ASSERT_GE(first.size(), 8u) << rows[1];
  EXPECT_EQ(first[0], "layer");
  EXPECT_EQ(first[1], "softmax_f32");  // 4·as²b per layer: 8 GiB over 32 layers
  EXPECT_EQ(first[4], "+8.00");
  EXPECT_EQ(first[5], "+4·as²b");
  EXPECT_EQ(first[6], "only in B");
  EXPECT_EQ(first[7], "the fp32 probabilities before the cast back");
  // probs is kept by both, 2·as²b each: unchanged, so not listed.
  EXPECT_FALSE(has(t.out, "layer      probs ")) << t.out;
  EXPECT_TRUE(has(t.out, "1 of 58 tensors are the same on both sides")) << t.out;
}

TEST(CliE2EDiff, SavedReportsDiffLikeTheProfilesTheyWereSavedFrom) {
  const std::string flags = "--model tiny-awkward --batch 3 --seq 20 --dtype fp16";
  const std::string a = saved("diff_native.json", "estimate --profile native " + flags);
  const std::string b = saved("diff_hf.json", "estimate --profile hf-eager " + flags);
  const Result live = trainmem("diff native hf-eager " + flags + " --format json");
  const Result files = trainmem("diff '" + a + "' '" + b + "' --format json");
  const Result mixed = trainmem("diff '" + a + "' hf-eager " + flags + " --format json");
  for (const Result* r : {&live, &files, &mixed}) ASSERT_EQ(r->code, 0) << r->err;
  for (const char* k : {"categories", "groups", "tensors", "per_layer", "differences"}) {
    EXPECT_EQ(files.j()[k], live.j()[k]) << k;
    EXPECT_EQ(mixed.j()[k], live.j()[k]) << k;
  }
  EXPECT_EQ(files.j()["a"]["file"], a);
  EXPECT_TRUE(live.j()["a"]["file"].is_null());
  EXPECT_EQ(files.j()["b"]["profile"], "hf-eager");
  // The text reports differ only in their first three lines (what each side is).
  const Result lt = trainmem("diff native hf-eager " + flags);
  const Result ft = trainmem("diff '" + a + "' '" + b + "'");
  auto body = [](const std::string& s) {
    std::size_t at = 0;
    for (int n = 0; n < 3; ++n) at = s.find('\n', at) + 1;
    return s.substr(at);
  };
  EXPECT_EQ(body(ft.out), body(lt.out));
}

TEST(CliE2EDiff, AReportAgainstItselfIsAllZeros) {
  const std::string f = saved("diff_self.json", "estimate --model tiny-gqa --checkpointing full");
  for (const char* p : {"native", "hf-eager", "megatron", "zero"}) {
    SCOPED_TRACE(p);
    const Result r = trainmem("diff '" + f + "' '" + f + "' --profile " + p + " --format json");
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = r.j();
    EXPECT_FALSE(j["tensors"].empty());
    for (const char* list : {"categories", "groups", "tensors"})
      for (const auto& x : j[list]) EXPECT_EQ(x["delta"], 0) << x.dump();
    for (const auto& x : j["tensors"]) {
      EXPECT_EQ(x["coefficient_change"], "0") << x.dump();
      EXPECT_EQ(x["change"], "") << x.dump();
      EXPECT_EQ(x["a"], x["b"]);
    }
    EXPECT_EQ(j["per_layer"]["change"], "0");
    const Result t = trainmem("diff '" + f + "' '" + f + "' --profile " + p);
    EXPECT_TRUE(
        has(t.out, "No tensor differs (" + std::to_string(j["tensors"].size()) + " compared)."))
        << t.out;
    // --all lists every tensor, each with Δ 0.
    const Result all = trainmem("diff '" + f + "' '" + f + "' --profile " + p + " --all");
    const auto rows = tensor_rows(all.out);
    EXPECT_EQ(rows.size(), j["tensors"].size() + 1) << all.out;
    for (std::size_t n = 1; n < rows.size(); ++n) EXPECT_EQ(split_columns(rows[n])[4], "0");
  }
}

TEST(CliE2EDiff, DifferentModelsAndShapesAreComparedAndTheHeaderSaysSo) {
  const std::string x = saved("diff_x.json", "estimate --profile native --model tiny --batch 2");
  const std::string y =
      saved("diff_y.json", "estimate --profile native --model small-256 --batch 4 --seq 64");
  const Result r = trainmem("diff '" + x + "' '" + y + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(has(r.out, "Note: A and B are different models (name: tiny vs small-256; ")) << r.out;
  EXPECT_TRUE(has(r.out, "Note: A and B have different shapes (batch: 2 vs 4; seq: 512 vs 64)"))
      << r.out;
  const json j = trainmem("diff '" + x + "' '" + y + "' --format json").j();
  EXPECT_FALSE(j["same_model"].get<bool>());
  EXPECT_FALSE(j["same_shape"].get<bool>());
  const json ex = json::parse(slurp(x)), ey = json::parse(slurp(y));
  for (const auto& c : j["categories"]) {
    const std::string k = c["category"];
    EXPECT_EQ(c["delta"].get<std::int64_t>(), ey["analytic"]["native"][k].get<std::int64_t>() -
                                                  ex["analytic"]["native"][k].get<std::int64_t>())
        << k;
  }
  // The same model and shape: no note.
  const Result same = trainmem("diff '" + x + "' '" + x + "'");
  EXPECT_FALSE(has(same.out, "Note:")) << same.out;
}

TEST(CliE2EDiff, ProfileOptionsOverrideTheCommonFlags) {
  // Checkpointing keeps one layer input per layer (w·sbh) instead of the whole layer.
  const Result r = trainmem(
      "diff native native:checkpointing=full --model tiny --batch 2 --seq 32 --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  EXPECT_EQ(j["differences"]["setup"], json::array({"checkpointing: none vs full"}));
  const json& model = j["a"]["model"];
  const std::uint64_t L = model["layers"], h = model["hidden"], b = 2, s = 32, w = 2;
  const std::uint64_t layer = native_layer_bytes(model, b, s, w, true);
  int found = 0;
  for (const auto& c : j["categories"]) {
    if (c["category"] != "activations") continue;
    ++found;
    EXPECT_EQ(c["delta"].get<std::int64_t>(),
              static_cast<std::int64_t>(L * w * s * b * h) - static_cast<std::int64_t>(L * layer));
  }
  EXPECT_EQ(found, 1);
  const Result t = trainmem("diff native native:checkpointing=full --model tiny --seq 32");
  EXPECT_TRUE(has(t.out, "Setup differs: checkpointing: none vs full")) << t.out;
  // Another dtype is another shape: listed as such.
  const json f = trainmem("diff hf-eager hf-eager:dtype=fp32 --model tiny --format json").j();
  EXPECT_EQ(f["differences"]["shape"], json::array({"dtype: bf16 vs fp32"}));
}

TEST(CliE2EDiff, HfErasAreSideOptions) {
  // transformers 4.30 keeps RMSNorm's weight·y in fp32 where 4.28/4.29 keep it in 16 bits:
  // +2 bytes per element at each of the layer's two norms and at the final norm, so
  // +4·sbh per layer and +(4L + 2)·sbh in all (docs/formulas.md, the eras).
  const Result r = trainmem(
      "diff hf-eager:hf=4.29 hf-eager:hf=4.30 --model tiny --batch 2 --seq 32 --dtype fp16 "
      "--format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  const json& model = j["a"]["model"];
  const std::uint64_t L = model["layers"], h = model["hidden"], b = 2, s = 32;
  EXPECT_EQ(j["per_layer"]["delta"]["sbh"].get<double>(), 4.0);
  EXPECT_EQ(j["per_layer"]["change"], "+4\u00b7sbh");
  int found = 0;
  for (const auto& c : j["categories"])
    if (c["category"] == "activations") {
      ++found;
      EXPECT_EQ(c["delta"].get<std::uint64_t>(), (4 * L + 2) * s * b * h);
    }
  EXPECT_EQ(found, 1);
  // The same flag checks as --hf-version: an unknown release names the option and the eras.
  const Result bad = trainmem("diff hf-eager:hf=3.0 native --model tiny");
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(has(bad.err, "diff A (hf-eager:hf=3.0)")) << bad.err;
  EXPECT_TRUE(has(bad.err, "4.28")) << bad.err;
}

TEST(CliE2EDiff, AMeasuredLedgerAgainstNativeIsComparedPerCategory) {
  const std::string p =
      saved("diff_profile.json", "profile --model tiny --batch 2 --seq 16 --backend meta");
  const Result r = trainmem("diff '" + p +
                            ":profile=measured' native --model tiny --batch 2 "
                            "--seq 16 --format json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = r.j();
  EXPECT_EQ(j["granularity"], "category");
  EXPECT_TRUE(j["tensors"].empty());
  EXPECT_TRUE(j["per_layer"].is_null());
  // The ledger equals the native profile byte for byte.
  for (const auto& c : j["categories"]) EXPECT_EQ(c["delta"], 0) << c.dump();
  const Result t = trainmem("diff '" + p +
                            ":profile=measured' native --model tiny --batch 2 "
                            "--seq 16");
  EXPECT_TRUE(has(t.out, "Note: compared per category only: A (measured from " + p +
                             ") holds no per-tensor list"))
      << t.out;
  EXPECT_FALSE(has(t.out, "Tensors by group")) << t.out;
}

TEST(CliE2EDiff, MarkdownCsvAndOutputCarryTheSameFigures) {
  const std::string flags = " --model tiny --seq 16";
  const json j = trainmem("diff zero megatron" + flags + " --format json").j();
  const Result md = trainmem("diff zero megatron" + flags + " --format markdown");
  ASSERT_EQ(md.code, 0) << md.err;
  const auto tables = parse_markdown_tables(md.out);
  ASSERT_EQ(tables.size(), 4u) << md.out;  // categories, coefficients, groups, tensors
  EXPECT_EQ(tables[0].size(), j["categories"].size() + 1);
  EXPECT_EQ(tables[0][4][0], "activations");
  EXPECT_TRUE(has(md.out, "### trainmem diff: A = zero, B = megatron")) << md.out;
  // The sides as a list (consecutive lines would run together in one Markdown paragraph).
  EXPECT_TRUE(has(md.out, "\n- A: zero (")) << md.out;
  EXPECT_TRUE(has(md.out, "\n- B: megatron (")) << md.out;

  const Result csv = trainmem("diff zero megatron" + flags + " --format csv");
  ASSERT_EQ(csv.code, 0) << csv.err;
  const auto rows = parse_csv(csv.out);
  ASSERT_EQ(rows.size(), 1 + j["categories"].size() + j["tensors"].size());
  EXPECT_EQ(rows[0][0], "kind");
  for (std::size_t n = 0; n < j["tensors"].size(); ++n) {
    const auto& row = rows[1 + j["categories"].size() + n];
    EXPECT_EQ(row[0], "tensor");
    EXPECT_EQ(row[2], j["tensors"][n]["name"]);
    EXPECT_EQ(row[7], std::to_string(j["tensors"][n]["delta"].get<std::int64_t>()));
  }

  const std::string out = temp_path("diff_out.txt");
  const Result to_file = trainmem("diff zero megatron" + flags + " --output '" + out + "'");
  ASSERT_EQ(to_file.code, 0) << to_file.err;
  EXPECT_TRUE(to_file.out.empty());
  EXPECT_EQ(slurp(out), trainmem("diff zero megatron" + flags).out);
  std::remove(out.c_str());
}

struct BadInput {
  std::string args;
  std::vector<std::string> message;  // every piece must appear on stderr
};

TEST(CliE2EDiff, BadInputNamesTheFileOrFlagAndWhatIsWrong) {
  const std::string not_json = file_with("diff_not.json", "hello, world\n");
  const std::string not_ours = file_with("diff_not_ours.json", "{\"loss\": 1.5}\n");
  const std::string array = file_with("diff_array.json", "[1, 2]\n");
  const std::string other = file_with("diff_other.json", "{\"schema\": \"other/2\"}\n");
  const std::string maxbatch =
      saved("diff_maxbatch.json", "maxbatch --model tiny --seq 16 --budget 1GiB --overhead 0");
  const std::string all = saved("diff_all.json", "estimate --model tiny --seq 16");
  const std::string runs = saved("diff_runs.json", "estimate --model tiny --optimizer all");
  json broken = json::parse(slurp(all));
  broken["analytic"]["hf-eager"]["tensors"][1].erase("term");
  const std::string missing = file_with("diff_missing.json", broken.dump());
  const std::string dir = temp_path("diff_dir");
  std::filesystem::create_directories(dir);

  const BadInput cases[] = {
      {"diff /nonexistent/old.json native",
       {"trainmem: error: diff A: cannot read /nonexistent/old.json: No such file or directory"}},
      {"diff native '" + dir + "'", {"diff B: " + dir + " is a directory"}},
      {"diff '" + not_json + "' native",
       {"diff A: " + not_json + ": not valid JSON at byte 1: parse error at line 1, column 1"}},
      {"diff '" + not_ours + "' native",
       {"diff A: " + not_ours + " is not a trainmem report: no \"schema\" key"}},
      {"diff '" + array + "' native", {"is not a trainmem report: the document is a JSON array"}},
      {"diff '" + other + "' native", {"its schema is \"other/2\", not \"trainmem/1\""}},
      {"diff '" + maxbatch + "' native", {"diff A: " + maxbatch + " holds no run with analytic"}},
      {"diff '" + missing + "' native --profile hf-eager",
       {"diff A: " + missing + ": analytic.hf-eager.tensors[1]: missing \"term\""}},
      {"diff natve native",
       {"diff A: 'natve' is neither a profile (native, hf-eager, megatron, zero, hf-sdpa, hf-peft) "
        "nor a file"}},
      {"diff native hf-eger", {"diff B: 'hf-eger' is neither a profile"}},
      {"diff native native:dtype=fp8", {"diff B: dtype=fp8; allowed: bf16, fp16, fp32"}},
      {"diff native native:seed=4",
       {"diff B: 'seed' is not an option of a profile side; allowed: model=", "checkpointing=",
        "hf="}},
      {"diff native native:hf=4.29",
       {"diff B (native:hf=4.29): hf= applies to hf-eager and hf-sdpa only"}},
      {"diff native native:batch=0", {"diff B: batch=0 is not an integer >= 1"}},
      {"diff native zero:rank=8",
       {"diff B (zero:rank=8): rank= applies to hf-peft and native only"}},
      {"diff native native:rank=8",
       {"diff B (native:rank=8): rank= needs finetune=lora|qlora (or --finetune lora|qlora)"}},
      {"diff native native:finetune=lora,prepare=off",
       {"diff B (native:finetune=lora,prepare=off): prepare= applies to hf-peft only"}},
      {"diff hf-sdpa hf-peft", {"diff B (hf-peft): hf-peft needs finetune=lora|qlora"}},
      {"diff hf-sdpa hf-peft:finetune=dora", {"diff B: finetune=dora; allowed: lora, qlora"}},
      {"diff hf-sdpa hf-peft:finetune=lora,quant=int4",
       {"diff B: quant=int4; allowed: none, nf4, fp4"}},
      {"diff hf-sdpa hf-peft:finetune=lora,quant=nf4", {"--quant nf4"}},
      {"diff hf-sdpa hf-peft:finetune=lora,optimizer=adam", {"diff B: optimizer=adam; allowed"}},
      {"diff '" + all + "':dtype=fp32 native", {"'dtype' is not an option of a report side"}},
      {"diff '" + all + "' '" + all + "'",
       {"diff A: " + all +
        " holds the profiles hf-eager, megatron, native, zero; choose one "
        "with " +
        all + ":profile=NAME or --profile NAME"}},
      {"diff '" + all + "':profile=flash native", {"the run holds no profile 'flash'"}},
      {"diff '" + runs + "' native",
       {"diff A: " + runs + " holds 3 runs (1: adamw, checkpointing none", "3: lomo", ":run=N"}},
      {"diff '" + runs + "':run=4 native", {"run=4 is not one of its 3 runs"}},
      {"diff native hf-eager --profile native,zero",
       {"--profile: diff takes one profile name here"}},
      {"diff native", {"B is required"}},
      {"diff native hf-eager --format yaml", {"--format: unknown format 'yaml'"}},
  };
  for (const auto& c : cases) {
    const Result r = trainmem(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.err;
    for (const auto& m : c.message) EXPECT_TRUE(has(r.err, m)) << c.args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args << " wrote a report: " << r.out;
  }
  // A report whose file cannot be read (root reads any file: only checked as another user).
  if (::geteuid() != 0) {
    const std::string locked = file_with("diff_locked.json", slurp(all));
    ::chmod(locked.c_str(), 0);
    const Result r = trainmem("diff '" + locked + "' native");
    EXPECT_EQ(r.code, 2);
    EXPECT_TRUE(has(r.err, "diff A: cannot read " + locked + ": Permission denied")) << r.err;
  }
}

}  // namespace
}  // namespace trainmem::e2e
