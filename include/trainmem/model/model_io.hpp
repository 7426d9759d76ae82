// The model's file I/O: which files a --weights path stands for (HF shards), the --tokens
// reader and the --dump gradient writer. LlamaModel::load_weights (model.hpp) reads the
// weights; it is defined beside these, in src/model/model_io.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trainmem/base/error.hpp"
#include "trainmem/base/safetensors.hpp"
#include "trainmem/model/model.hpp"

namespace trainmem {

// The files a --weights path stands for: itself, or every shard of an HF sharded checkpoint
// when it is named <stem>-0000k-of-0000n.safetensors.
std::vector<std::string> weight_files(const std::string& path);

// A --weights file's error with the flag in front ("--weights: <file>: ..."), as the other
// flags' errors name their flag.
std::string weights_error(const InputError& e);

// --tokens: a raw file of batch·seq int32 little-endian ids. InputError naming --tokens when
// the size is not exactly batch·seq·4 bytes or an id is outside [0, vocab).
std::vector<std::int32_t> load_tokens_file(const std::string& path, std::int64_t batch,
                                           std::int64_t seq, std::int64_t vocab);

// --dump: writes `loss` (fp32 [1]) and every parameter gradient (fp32, HF names) of a step.
// Declare the parameters, then capture() inside train_step and finish(loss) after it.
class GradientDump {
 public:
  GradientDump(std::string path, const LlamaModel& model);
  GradientCapture capture();
  void finish(float loss);

 private:
  std::string path_;
  SafeTensorsWriter writer_;
};

}  // namespace trainmem
