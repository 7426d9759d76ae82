// The tiny model-family configurations of issue 16 (tiny-mistral, tiny-qwen2, tiny-qwen3,
// tiny-llama3), built here field by field with the values the presets of src/base/config.cpp
// are specified to have, so that the model and analytic tests do not depend on the presets
// landing first. When a preset of that name exists, tests/test_model_families.cpp checks that it
// equals this construction.
#pragma once
#include <string>
#include <vector>

#include "trainmem/base/config.hpp"
#include "trainmem/base/error.hpp"

namespace trainmem::test {

inline ModelConfig family_config(const std::string& name) {
  ModelConfig c;
  c.name = name;
  c.vocab = 96;
  c.hidden = 48;
  c.intermediate = 128;
  c.layers = 2;
  c.heads = 6;
  c.kv_heads = 2;
  c.max_positions = 256;
  if (name == "tiny-mistral") {
    c.family = "mistral";
    c.rms_eps = 1e-5;
    c.rope_theta = 1e4;
    c.sliding_window = 5;
    c.window_from_layer = 0;
    c.tied_embeddings = false;
  } else if (name == "tiny-qwen2") {
    c.family = "qwen2";
    c.rms_eps = 1e-6;
    c.rope_theta = 1e6;
    c.qkv_bias = true;
    c.tied_embeddings = true;
    c.sliding_window = 6;
    c.window_from_layer = 1;
  } else if (name == "tiny-qwen3") {
    c.family = "qwen3";
    c.heads = 4;
    c.explicit_head_dim = 16;
    c.rms_eps = 1e-6;
    c.rope_theta = 1e6;
    c.qk_norm = true;
    c.tied_embeddings = false;
  } else if (name == "tiny-llama3") {
    c.family = "llama";
    c.rms_eps = 1e-5;
    c.rope_theta = 5e5;
    c.tied_embeddings = true;
    c.rope_scaling.kind = RopeScalingKind::llama3;
    c.rope_scaling.factor = 8;
    c.rope_scaling.low_freq_factor = 1;
    c.rope_scaling.high_freq_factor = 4;
    c.rope_scaling.original_max_positions = 16;
  } else {
    throw Error("test: no family config " + name);
  }
  return c;
}

// Larger family shapes for the meta backend only (2 layers keep them quick): the published
// Qwen3-0.6B (a·d = 2048 > h = 1024), Qwen2-7B (biases, untied here) and Mistral-7B (window
// 4096) widths; and small synthetic shapes the presets lack (narrow MLPs: h > i).
inline ModelConfig family_big(const std::string& name) {
  ModelConfig c;
  c.name = name;
  c.layers = 2;
  c.max_positions = 32768;
  if (name == "qwen3-0.6b-2l") {
    c.family = "qwen3";
    c.vocab = 151936;
    c.hidden = 1024;
    c.intermediate = 3072;
    c.heads = 16;
    c.kv_heads = 8;
    c.explicit_head_dim = 128;
    c.qk_norm = true;
    c.tied_embeddings = true;
    c.rms_eps = 1e-6;
    c.rope_theta = 1e6;
  } else if (name == "qwen3-narrow-mlp") {
    // Synthetic: wide heads (a·d = 128 > h = 48) and a narrow MLP (i = 16), so that the q/k
    // norm backward's buffers (step 7) are the workspace peak.
    c.family = "qwen3";
    c.vocab = 64;
    c.hidden = 48;
    c.intermediate = 16;
    c.heads = 4;
    c.kv_heads = 4;
    c.explicit_head_dim = 32;
    c.qk_norm = true;
    c.qkv_bias = true;
    c.max_positions = 256;
    c.rms_eps = 1e-6;
    c.rope_theta = 1e6;
  } else if (name == "llama-narrow-mlp") {
    // Synthetic LLaMA with a narrow MLP (h = 64 > 3·i = 48), so that the MLP steps of the
    // backward (steps 1-3, where gate/up/act are freed) hold the peak: a free moved by one
    // step changes the peak (issue 37, mutation M7).
    c.vocab = 64;
    c.hidden = 64;
    c.intermediate = 16;
    c.heads = 8;
    c.kv_heads = 2;
    c.max_positions = 256;
    c.rms_eps = 1e-5;
    c.rope_theta = 1e4;
  } else if (name == "narrow-awkward") {
    // Synthetic, no size a power of two (the head dim even, as rotate-half RoPE needs), MQA,
    // tied, 3 layers, narrow MLP (h = 50 > 3·i = 39).
    c.vocab = 37;
    c.hidden = 50;
    c.intermediate = 13;
    c.layers = 3;
    c.heads = 5;
    c.kv_heads = 1;
    c.tied_embeddings = true;
    c.max_positions = 256;
    c.rms_eps = 1e-5;
    c.rope_theta = 1e4;
  } else if (name == "qwen2-7b-2l") {
    c.family = "qwen2";
    c.vocab = 152064;
    c.hidden = 3584;
    c.intermediate = 18944;
    c.heads = 28;
    c.kv_heads = 4;
    c.qkv_bias = true;
    c.rms_eps = 1e-6;
    c.rope_theta = 1e6;
  } else if (name == "mistral-7b-2l") {
    c.family = "mistral";
    c.vocab = 32000;
    c.hidden = 4096;
    c.intermediate = 14336;
    c.heads = 32;
    c.kv_heads = 8;
    c.sliding_window = 4096;
    c.rms_eps = 1e-5;
    c.rope_theta = 1e4;
  } else {
    throw Error("test: no big family config " + name);
  }
  return c;
}

// A preset when one has that name, else a family configuration above. "tiny-qwen2-moe-all" is
// the tiny-qwen2-moe preset with every layer MoE (decoder_sparse_step 1, no mlp_only_layers):
// its shared expert in trainmem's own step, which models one kind of layer. "tiny-mixtral-aux" is
// tiny-mixtral with output_router_logits on and router_aux_loss_coef 0.5 (the load-balancing loss).
//
// Skewed MoE shapes, so that each of the native MoE layer's instants decides some figure (the
// ledger tests then check every one of them): "moe-wide-router" (h 8, 64 experts of width 1, top
// 1: the router's (b,s,E) tensors dominate the layer's workspace), "moe-wide-router-aux" (the same
// with the load-balancing loss's (E) f32 buffer), "moe-wide-shared" (two experts of width 1 beside
// a shared expert of width 300: its backward's transients dominate).
inline ModelConfig any_config(const std::string& name) {
  if (name.rfind("moe-wide-", 0) == 0) {
    ModelConfig c = *find_preset(name == "moe-wide-shared" ? "tiny-qwen2-moe" : "tiny-mixtral");
    c.name = name;
    c.vocab = 16;
    c.hidden = 8;
    c.heads = 2;
    c.kv_heads = 1;
    c.layers = 2;
    c.intermediate = 1;
    c.expert_intermediate = 1;
    c.experts_per_token = 1;
    c.experts = name == "moe-wide-shared" ? 2 : 64;
    c.decoder_sparse_step = 1;
    c.mlp_only_layers.clear();
    c.shared_expert_intermediate = name == "moe-wide-shared" ? 300 : 0;
    c.output_router_logits = name == "moe-wide-router-aux";
    return c;
  }
  if (name == "tiny-mixtral-aux") {
    ModelConfig c = *find_preset("tiny-mixtral");
    c.name = name;
    c.output_router_logits = true;
    c.router_aux_loss_coef = 0.5;
    return c;
  }
  // Dense layers among MoE ones (Qwen's mlp_only_layers): Qwen3-MoE with only its middle layer
  // MoE (the last layer dense), and two skewed shapes in which the kind that is not last decides
  // a figure: a wide dense MLP in layer 0 before two MoE layers, and a 64-expert router in layers
  // 0 and 1 before a narrow dense layer 2.
  if (name == "tiny-qwen3-moe-mixed") {
    ModelConfig c = *find_preset("tiny-qwen3-moe");
    c.name = name;
    c.layers = 3;
    c.mlp_only_layers = {0, 2};
    return c;
  }
  if (name == "moe-mixed-dense-first" || name == "moe-mixed-router-first") {
    ModelConfig c = any_config("moe-wide-router");
    c.name = name;
    c.layers = 3;
    const bool dense_first = name == "moe-mixed-dense-first";
    c.mlp_only_layers = {dense_first ? 0 : 2};
    c.intermediate = dense_first ? 400 : 1;
    if (dense_first) c.experts = 4;
    return c;
  }
  if (name == "tiny-qwen2-moe-all") {
    ModelConfig c = *find_preset("tiny-qwen2-moe");
    c.name = name;
    c.decoder_sparse_step = 1;
    c.mlp_only_layers.clear();
    return c;
  }
  if (auto p = find_preset(name)) return *p;
  if (name.rfind("tiny-", 0) == 0) return family_config(name);
  return family_big(name);
}

inline const std::vector<std::string>& family_names() {
  static const std::vector<std::string> names = {"tiny-mistral", "tiny-qwen2", "tiny-qwen3",
                                                 "tiny-llama3"};
  return names;
}

}  // namespace trainmem::test
