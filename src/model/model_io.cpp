// Model file I/O (see include/trainmem/model/model_io.hpp): loading the weights of HF safetensors
// checkpoints (sharded or not) into a LlamaModel, the --tokens reader and the --dump writer.
#include "trainmem/model/model_io.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <regex>
#include <set>

#include "trainmem/base/checked.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/input_file.hpp"

namespace trainmem {

namespace {

constexpr std::uint64_t kChunkElems = 1ull << 20;  // host staging chunk for weights

}  // namespace

// ------------------------------------------------------------------------------ weights

std::string weights_error(const InputError& e) {
  const std::string m = e.what();
  return m.rfind("--weights", 0) == 0 ? m : "--weights: " + m;
}

std::vector<std::string> weight_files(const std::string& path) {
  // HF shards: <stem>-00001-of-00003.safetensors names all three files.
  static const std::regex shard(R"((.*)-(\d{5})-of-(\d{5})\.safetensors)");
  std::smatch m;
  if (!std::regex_match(path, m, shard)) return {path};
  const int total = std::stoi(m[3].str());
  if (total < 1) return {path};
  std::vector<std::string> files;
  char buf[48];
  for (int k = 1; k <= total; ++k) {
    std::snprintf(buf, sizeof buf, "-%05d-of-%05d.safetensors", k, total);
    files.push_back(m[1].str() + buf);
  }
  return files;
}

void LlamaModel::load_weights(const std::string& path) {
  const auto files = weight_files(path);
  if (files.size() > 1)
    spdlog::info("--weights {}: reading the {} shards of this checkpoint", path, files.size());
  std::vector<std::unique_ptr<SafeTensorsReader>> readers;
  for (const auto& f : files) readers.push_back(std::make_unique<SafeTensorsReader>(f));
  std::vector<const SafeTensorsReader*> ptrs;
  for (const auto& r : readers) ptrs.push_back(r.get());
  load_weights(ptrs);
}

void LlamaModel::load_weights(const SafeTensorsReader& file) {
  load_weights(std::vector<const SafeTensorsReader*>{&file});
}

void LlamaModel::load_weights(const std::vector<const SafeTensorsReader*>& files) {
  if (files.empty()) throw Error("model: load_weights without a file");
  const std::string label =
      files.size() == 1
          ? files[0]->path()
          : files[0]->path() + " (and " + std::to_string(files.size() - 1) + " more shards)";
  // Check everything before touching any weight.
  std::vector<const SafeTensorsReader*> source(params_.size(), nullptr);
  for (std::size_t pi = 0; pi < params_.size(); ++pi) {
    const auto& p = params_[pi];
    const SafeTensorInfo* t = nullptr;
    for (const auto* f : files)
      if ((t = f->find(p.name))) {
        source[pi] = f;
        break;
      }
    if (!t && p.name.find(".lora_") != std::string::npos) continue;  // initialised below
    if (!t)
      throw InputError("--weights " + label + ": missing tensor '" + p.name +
                       "' (needed by model " + cfg_.name + ")");
    const std::string where = "--weights " + source[pi]->path() + ": tensor '" + p.name + "'";
    if (t->shape != p.shape)
      throw InputError(where + " has shape " + t->shape_string() + ", the model config needs " +
                       shape_string(p.shape));
    if (!safe_dtype_is_float(t->dtype))
      throw InputError(where + " has dtype " + safe_dtype_name(t->dtype) +
                       ", expected a floating dtype");
  }
  std::set<std::string> used;
  for (const auto& p : params_) used.insert(p.name);
  std::size_t ignored = 0;
  for (const auto* f : files)
    for (const auto& t : f->tensors()) {
      if (used.count(t.name)) continue;
      ++ignored;
      if (t.name == "lm_head.weight" && cfg_.tied_embeddings)
        spdlog::info(
            "--weights {}: lm_head.weight ignored (tied embeddings: the head uses "
            "model.embed_tokens.weight)",
            f->path());
      else
        spdlog::debug("--weights {}: tensor '{}' not used by the model", f->path(), t.name);
    }
  if (ignored) spdlog::info("--weights {}: {} tensor(s) not used by the model", label, ignored);
  // LoRA adapters a base checkpoint does not hold start as peft's do: B zero, A drawn (seed 0).
  std::size_t fresh = 0;
  for (std::size_t pi = 0; pi < params_.size(); ++pi)
    if (!source[pi]) {
      ++fresh;
      if (be_.computes()) init_parameter(pi, 0);
    }
  if (fresh)
    spdlog::info("--weights {}: {} LoRA adapter tensor(s) not in the file start fresh (B zero)",
                 label, fresh);
  for (std::size_t pi = 0; pi < params_.size(); ++pi) {
    // A 4-bit weight's quantization allocates on every backend (the meta trace books it; its
    // values are read only where they are computed with).
    if (!source[pi] || (!be_.computes() && params_[pi].quant < 0)) continue;
    const std::string& name = params_[pi].name;
    const SafeTensorsReader* f = source[pi];
    std::uint64_t bad = 0;
    write_parameter(pi, [&](float* dst, std::uint64_t first, std::uint64_t count) {
      f->read_f32(name, dst, first, count);
      for (std::uint64_t e = 0; e < count; ++e) bad += std::isfinite(dst[e]) ? 0 : 1;
    });
    if (bad)
      non_finite_weights_.push_back(name + " (" + std::to_string(bad) + " of " +
                                    std::to_string(params_[pi].numel()) + ")");
  }
  if (!non_finite_weights_.empty()) {
    std::string list;
    for (std::size_t k = 0; k < non_finite_weights_.size() && k < 4; ++k)
      list += (k ? ", " : "") + non_finite_weights_[k];
    if (non_finite_weights_.size() > 4)
      list += " and " + std::to_string(non_finite_weights_.size() - 4) + " more";
    spdlog::warn(
        "--weights {}: {} tensor(s) hold NaN or Inf values: {}; the losses and gradients will "
        "not be finite",
        label, non_finite_weights_.size(), list);
  }
  weights_set_ = true;
}

void LlamaModel::write_parameter(
    std::size_t index, const std::function<void(float*, std::uint64_t, std::uint64_t)>& fill) {
  auto& p = params_[index];
  const std::uint64_t n = p.numel();
  const std::size_t w = dtype_size(D_);
  // D values into dst, and the fp32 master (when there is one) from the values as given.
  auto upload = [&](void* dst, float* master) {
    std::vector<float> vals(std::min(n, kChunkElems));
    std::vector<unsigned char> stored(vals.size() * w);
    for (std::uint64_t first = 0; first < n; first += kChunkElems) {
      const std::uint64_t count = std::min(kChunkElems, n - first);
      fill(vals.data(), first, count);
      for (std::uint64_t e = 0; e < count; ++e) store_from_f32(stored.data(), e, D_, vals[e]);
      be_.upload(static_cast<unsigned char*>(dst) + first * w, stored.data(), count * w);
      if (master) be_.upload(master + first, vals.data(), count * 4);
    }
  };
  if (p.quant >= 0)  // quantized from the values rounded to D, as bitsandbytes quantizes a model
    quantize_parameter(index, [&](void* dense) { upload(dense, nullptr); });
  else
    upload(p.value.data(), opt_.master(p.opt_index));
}

// ------------------------------------------------------------------------------ --tokens

std::vector<std::int32_t> load_tokens_file(const std::string& path, std::int64_t batch,
                                           std::int64_t seq, std::int64_t vocab) {
  // A regular file (a FIFO would block), whose size is checked against batch x seq below.
  check_input_file(path, "--tokens", kMaxWeightsBytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("--tokens " + path + ": cannot open file");
  in.seekg(0, std::ios::end);
  const std::uint64_t size = std::uint64_t(in.tellg());
  in.seekg(0);
  const std::uint64_t n = checked_mul(std::uint64_t(batch), std::uint64_t(seq), "batch x seq");
  const std::uint64_t want = checked_mul(n, 4, "token file bytes");
  if (size != want)
    throw InputError("--tokens " + path + ": file has " + std::to_string(size) +
                     " bytes, expected batch x seq x 4 = " + std::to_string(batch) + " x " +
                     std::to_string(seq) + " x 4 = " + std::to_string(want) +
                     " (raw int32 little-endian ids, row-major)");
  std::vector<std::int32_t> ids(n);
  in.read(reinterpret_cast<char*>(ids.data()), std::streamsize(want));
  if (!in) throw InputError("--tokens " + path + ": read failed");
  for (std::size_t j = 0; j < ids.size(); ++j)
    if (ids[j] < 0 || ids[j] >= vocab)
      throw InputError("--tokens " + path + ": token id " + std::to_string(ids[j]) +
                       " at position " + std::to_string(j) + " is outside the vocabulary [0, " +
                       std::to_string(vocab) + ")");
  return ids;
}

// ------------------------------------------------------------------------------ --dump

GradientDump::GradientDump(std::string path, const LlamaModel& model) : path_(std::move(path)) {
  writer_.set_metadata("format", "trainmem gradient dump");
  writer_.set_metadata("model", model.model_config().name);
  writer_.declare("loss", SafeDType::F32, {1});
  // The trained parameters' gradients (LoRA: the adapters'; a frozen weight has none).
  for (const auto& p : model.parameters())
    if (p.trainable) writer_.declare(p.name, SafeDType::F32, p.shape);
  writer_.open(path_, "--dump");
}

GradientCapture GradientDump::capture() {
  return [this](const Parameter& p, const std::vector<float>& g) { writer_.put(p.name, g.data()); };
}

void GradientDump::finish(float loss) {
  writer_.put("loss", &loss);
  writer_.close();
}

}  // namespace trainmem
