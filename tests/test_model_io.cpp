// Weights, tokens and gradient dumps: HF safetensors loading (values, dtype conversion, shape
// checks), random initialisation, the --tokens file, and the --dump format.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "model_helpers.hpp"
#include "trainmem/base/dtype.hpp"
#include "trainmem/base/safetensors.hpp"
#include "trainmem/model/model_io.hpp"

using namespace trainmem;
using namespace trainmem::test;

namespace {

std::string data(const std::string& leaf) {
  return std::string(TRAINMEM_TEST_DATA_DIR) + "/" + leaf;
}
std::string temp_path(const std::string& leaf) {
  return (std::filesystem::temp_directory_path() /
          ("trainmem_io_" + std::to_string(::getpid()) + "_" + leaf))
      .string();
}

const std::string kWeights = "golden_tiny_gqa_weights.safetensors";

ModelConfig golden_config() {
  return load_hf_config(data("golden_tiny_gqa_config.json"));
}

TrainConfig small_train(DType dt = DType::f32) {
  return train_config(2, 16, dt, Optimizer::adamw, Checkpointing::none, Attention::eager);
}

// Copies the golden weights into a new file, letting `edit` drop or change tensors.
// edit(name, dtype, shape, values) returns false to drop the tensor.
void rewrite_weights(
    const std::string& out,
    const std::function<bool(const std::string&, SafeDType&, std::vector<std::int64_t>&,
                             std::vector<float>&)>& edit) {
  SafeTensorsReader in(data(kWeights));
  struct T {
    std::string name;
    SafeDType dt;
    std::vector<std::int64_t> shape;
    std::vector<float> v;
  };
  std::vector<T> ts;
  for (const auto& t : in.tensors()) {
    T x{t.name, SafeDType::F32, t.shape, in.read_f32(t.name)};
    if (edit(x.name, x.dt, x.shape, x.v)) ts.push_back(std::move(x));
  }
  SafeTensorsWriter w;
  for (const auto& t : ts) w.declare(t.name, t.dt, t.shape);
  w.open(out);
  for (const auto& t : ts) {
    if (t.dt == SafeDType::F32) {
      w.put(t.name, t.v.data());
    } else if (t.dt == SafeDType::BF16) {
      std::vector<std::uint16_t> h(t.v.size());
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = f32_to_bf16(t.v[i]);
      w.put(t.name, h.data());
    } else {
      std::vector<std::int32_t> h(t.v.size(), 1);
      w.put(t.name, h.data());
    }
  }
  w.close();
}

std::string load_error(const std::string& path) {
  ModelRun run(BackendKind::cpu, golden_config(), small_train());
  try {
    run.model->load_weights(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(ModelWeights, LoadsEveryParameterByItsHfName) {
  ModelRun run(BackendKind::cpu, golden_config(), small_train());
  run.model->load_weights(data(kWeights));
  SafeTensorsReader file(data(kWeights));
  for (const auto& p : run.model->parameters())
    EXPECT_EQ(run.model->parameter_values(p.name), file.read_f32(p.name)) << p.name;
}

TEST(ModelWeights, StoredDtypeIsConvertedAndRoundedToTheTrainingDtype) {
  // File in bf16, model in fp16: values are bf16(w) rounded to fp16.
  const std::string path = temp_path("bf16.safetensors");
  rewrite_weights(
      path, [](const std::string&, SafeDType& dt, std::vector<std::int64_t>&, std::vector<float>&) {
        dt = SafeDType::BF16;
        return true;
      });
  ModelRun run(BackendKind::cpu, golden_config(), small_train(DType::f16));
  run.model->load_weights(path);
  SafeTensorsReader file(data(kWeights));
  const auto ref = file.read_f32("model.layers.1.mlp.up_proj.weight");
  const auto got = run.model->parameter_values("model.layers.1.mlp.up_proj.weight");
  ASSERT_EQ(got.size(), ref.size());
  for (std::size_t i = 0; i < ref.size(); ++i)
    ASSERT_EQ(got[i], round_to(DType::f16, bf16_to_f32(f32_to_bf16(ref[i])))) << i;
  std::remove(path.c_str());
}

TEST(ModelWeights, ErrorsNameTheFileAndTheTensor) {
  const std::string path = temp_path("bad.safetensors");
  rewrite_weights(
      path, [](const std::string& n, SafeDType&, std::vector<std::int64_t>&, std::vector<float>&) {
        return n != "model.layers.1.self_attn.k_proj.weight";
      });
  std::string msg = load_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing tensor 'model.layers.1.self_attn.k_proj.weight'"), std::string::npos)
      << msg;

  rewrite_weights(path, [](const std::string& n, SafeDType&, std::vector<std::int64_t>& shape,
                           std::vector<float>&) {
    if (n == "lm_head.weight") std::swap(shape[0], shape[1]);
    return true;
  });
  msg = load_error(path);
  EXPECT_NE(msg.find("'lm_head.weight' has shape [48, 96], the model config needs [96, 48]"),
            std::string::npos)
      << msg;

  rewrite_weights(path, [](const std::string& n, SafeDType& dt, std::vector<std::int64_t>&,
                           std::vector<float>&) {
    if (n == "model.norm.weight") dt = SafeDType::I32;
    return true;
  });
  msg = load_error(path);
  EXPECT_NE(msg.find("'model.norm.weight' has dtype I32"), std::string::npos) << msg;

  std::ofstream(path, std::ios::binary) << "not a safetensors file at all";
  msg = load_error(path);
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a valid safetensors file"), std::string::npos) << msg;
  std::remove(path.c_str());

  msg = load_error(temp_path("missing.safetensors"));
  EXPECT_NE(msg.find("cannot read it: No such file or directory"), std::string::npos) << msg;
}

TEST(ModelWeights, TiedModelIgnoresAnLmHeadInTheFile) {
  ModelConfig m = golden_config();
  m.tied_embeddings = true;
  ModelRun run(BackendKind::cpu, m, small_train());
  run.model->load_weights(data(kWeights));  // has lm_head.weight: not an error
  SafeTensorsReader file(data(kWeights));
  EXPECT_EQ(run.model->parameter_values("model.embed_tokens.weight"),
            file.read_f32("model.embed_tokens.weight"));
  EXPECT_THROW(run.model->parameter("lm_head.weight"), InputError);
}

TEST(ModelWeights, RandomInitIsHfsNormalWithUnitNorms) {
  const ModelConfig m = preset("tiny");
  ModelRun a(BackendKind::cpu, m, small_train());
  ModelRun b(BackendKind::cpu, m, small_train());
  ModelRun c(BackendKind::cpu, m, small_train());
  a.model->init_random(5);
  b.model->init_random(5);
  c.model->init_random(6);
  for (const auto& p : a.model->parameters()) {
    const auto v = a.model->parameter_values(p.name);
    EXPECT_EQ(v, b.model->parameter_values(p.name)) << p.name << ": same seed, same weights";
    if (p.shape.size() == 1) {
      for (float x : v) ASSERT_EQ(x, 1.0f) << p.name;
      continue;
    }
    EXPECT_NE(v, c.model->parameter_values(p.name)) << p.name;
    double sum = 0, sq = 0;
    for (float x : v) {
      sum += x;
      sq += double(x) * x;
    }
    const double n = double(v.size()), mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    // N(0, 0.02^2): the mean's standard error is 0.02/sqrt(n), the sd's 0.02/sqrt(2n): 5 and 6
    // sigma (false alarms ~1e-6 and ~1e-9 per tensor).
    EXPECT_NEAR(mean, 0.0, 5 * 0.02 / std::sqrt(n)) << p.name;
    EXPECT_NEAR(sd, 0.02, 0.02 * 6 / std::sqrt(2 * n)) << p.name;
  }
}

TEST(ModelWeights, Bf16MasterCopyKeepsTheUnroundedValues) {
  // AdamW under bf16 keeps fp32 masters, initialised from the values as loaded (not from the
  // rounded bf16 weights); a step with lr 0 then leaves the weights at round(master).
  OptimizerSettings s = default_optimizer_settings(Optimizer::adamw);
  s.adamw.lr = 0.0f;
  s.adamw.weight_decay = 0.0f;
  ModelRun run(BackendKind::cpu, golden_config(), small_train(DType::bf16), &s);
  run.model->load_weights(data(kWeights));
  run.model->set_tokens(load_tokens_file(data("golden_tiny_gqa_tokens.bin"), 2, 16, 96));
  const std::string name = "model.layers.0.self_attn.o_proj.weight";
  const Parameter& p = run.model->parameter(name);
  SafeTensorsReader file(data(kWeights));
  const auto ref = file.read_f32(name);
  const float* master = run.model->optimizer().master(p.opt_index);  // host memory on cpu
  ASSERT_NE(master, nullptr);
  std::size_t unrounded = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(master[i], ref[i]) << i;
    unrounded += round_to(DType::bf16, ref[i]) != ref[i];
  }
  EXPECT_GT(unrounded, ref.size() / 2);  // the check above could tell the two apart
  run.model->train_step();
  const auto got = run.model->parameter_values(name);
  for (std::size_t i = 0; i < ref.size(); ++i)
    ASSERT_EQ(got[i], round_to(DType::bf16, ref[i])) << i;
}

TEST(ModelTokens, FileSizeAndRangeAreChecked) {
  const std::string path = temp_path("tokens.bin");
  auto write = [&](const std::vector<std::int32_t>& ids) {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 4));
  };
  write({1, 2, 3, 4, 5, 6});
  EXPECT_EQ(load_tokens_file(path, 2, 3, 7), (std::vector<std::int32_t>{1, 2, 3, 4, 5, 6}));
  auto msg_of = [&](std::int64_t b, std::int64_t s, std::int64_t V) -> std::string {
    try {
      load_tokens_file(path, b, s, V);
    } catch (const InputError& e) {
      return e.what();
    }
    return "(no error)";
  };
  std::string msg = msg_of(2, 4, 7);
  EXPECT_NE(msg.find("--tokens " + path), std::string::npos) << msg;
  EXPECT_NE(msg.find("file has 24 bytes, expected batch x seq x 4 = 2 x 4 x 4 = 32"),
            std::string::npos)
      << msg;
  msg = msg_of(2, 3, 6);
  EXPECT_NE(msg.find("token id 6 at position 5 is outside the vocabulary [0, 6)"),
            std::string::npos)
      << msg;
  write({1, -2, 3});
  msg = msg_of(1, 3, 7);
  EXPECT_NE(msg.find("token id -2 at position 1"), std::string::npos) << msg;
  std::ofstream(path, std::ios::binary) << "abc";
  msg = msg_of(1, 1, 7);
  EXPECT_NE(msg.find("3 bytes"), std::string::npos) << msg;
  std::remove(path.c_str());
  msg = msg_of(1, 1, 7);
  EXPECT_NE(msg.find("cannot read it: No such file or directory"), std::string::npos) << msg;

  ModelRun run(BackendKind::cpu, golden_config(), small_train());
  EXPECT_THROW(run.model->set_tokens({1, 2, 3}), InputError);
  std::vector<std::int32_t> ids(32, 0);
  ids[17] = 96;
  try {
    run.model->set_tokens(ids);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("row 1, column 1"), std::string::npos) << e.what();
  }
}

TEST(ModelTokens, RandomTokensAreSeededAndInRange) {
  ModelRun a(BackendKind::cpu, golden_config(), small_train());
  ModelRun b(BackendKind::cpu, golden_config(), small_train());
  a.model->random_tokens(9);
  b.model->random_tokens(9);
  EXPECT_EQ(a.model->tokens(), b.model->tokens());
  b.model->random_tokens(10);
  EXPECT_NE(a.model->tokens(), b.model->tokens());
  std::set<std::int32_t> seen(a.model->tokens().begin(), a.model->tokens().end());
  EXPECT_GE(*seen.begin(), 0);
  EXPECT_LT(*seen.rbegin(), 96);
  EXPECT_GT(seen.size(), 10u);
}

TEST(ModelDump, WritesLossAndEveryGradientInFp32UnderHfNames) {
  for (Optimizer o : {Optimizer::adamw, Optimizer::lomo}) {
    const std::string path = temp_path("dump.safetensors");
    ModelRun run(BackendKind::cpu, golden_config(),
                 train_config(2, 16, DType::bf16, o, Checkpointing::full, Attention::eager));
    run.model->load_weights(data(kWeights));
    run.model->set_tokens(load_tokens_file(data("golden_tiny_gqa_tokens.bin"), 2, 16, 96));
    GradMap captured;
    float loss;
    {
      GradientDump dump(path, *run.model);
      auto cap = dump.capture();
      loss = run.model->train_step([&](const Parameter& p, const std::vector<float>& g) {
        captured[p.name] = g;
        cap(p, g);
      });
      dump.finish(loss);
    }
    SafeTensorsReader file(path);
    EXPECT_EQ(file.at("loss").dtype, SafeDType::F32);
    EXPECT_EQ(file.at("loss").shape, (std::vector<std::int64_t>{1}));
    EXPECT_EQ(file.read_f32("loss")[0], loss);
    EXPECT_EQ(file.tensors().size(), run.model->parameters().size() + 1);
    for (const auto& p : run.model->parameters()) {
      EXPECT_EQ(file.at(p.name).dtype, SafeDType::F32);
      EXPECT_EQ(file.at(p.name).shape, p.shape);
      EXPECT_EQ(file.read_f32(p.name), captured.at(p.name)) << p.name;
    }
    // The bf16 step is close to the fp32 golden (a coarse check that the dump is real data).
    SafeTensorsReader expected(data("golden_tiny_gqa_expected.safetensors"));
    // bf16 run vs the fp32 golden: each op's output rounds to 2^-8 relative; the loss (~4.6)
    // moves by a few such roundings (2^-8·4.6 = 0.018): 0.05 is ~3 of them. A coarse check.
    EXPECT_NEAR(loss, expected.read_f32("loss")[0], 0.05);
    std::remove(path.c_str());
  }
}

TEST(ModelWeights, ShardedCheckpointLoadsEveryShard) {
  const std::filesystem::path dir = temp_path("shards");
  std::filesystem::create_directories(dir);
  SafeTensorsReader in(data(kWeights));
  // Round-robin the tensors over three shards.
  std::vector<SafeTensorsWriter> w(3);
  for (std::size_t k = 0; k < in.tensors().size(); ++k)
    w[k % 3].declare(in.tensors()[k].name, SafeDType::F32, in.tensors()[k].shape);
  for (int s = 0; s < 3; ++s)
    w[s].open((dir / ("model-0000" + std::to_string(s + 1) + "-of-00003.safetensors")).string());
  for (std::size_t k = 0; k < in.tensors().size(); ++k)
    w[k % 3].put(in.tensors()[k].name, in.read_f32(in.tensors()[k].name).data());
  for (auto& x : w) x.close();

  const std::string second = (dir / "model-00002-of-00003.safetensors").string();
  EXPECT_EQ(weight_files(second).size(), 3u);
  EXPECT_EQ(weight_files(data(kWeights)), std::vector<std::string>{data(kWeights)});
  ModelRun run(BackendKind::cpu, golden_config(), small_train());
  run.model->load_weights(second);
  for (const auto& p : run.model->parameters())
    EXPECT_EQ(run.model->parameter_values(p.name), in.read_f32(p.name)) << p.name;

  std::filesystem::remove(dir / "model-00003-of-00003.safetensors");
  const std::string msg = load_error(second);
  EXPECT_NE(msg.find("model-00003-of-00003.safetensors: cannot read it: No such file or directory"),
            std::string::npos)
      << msg;
  std::filesystem::remove_all(dir);
}
