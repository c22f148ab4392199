#include "models/decoder_lm.h"
#include "core/format.h"
#include "models/checks.h"
#include "ops/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "autograd/grad_mode.h"

namespace asc::models {

DecoderLM::DecoderLM(const DecoderLMOptions& o, const nn::AttentionFactory& attention)
    : Module("DecoderLM"), options(o) {
  detail::check_model_options(
      "DecoderLM",
      {{"vocab", o.vocab()}, {"d_model", o.d_model()}, {"heads", o.heads()}, {"layers", o.layers()}, {"ffn", o.ffn()}},
      o.dropout());
  ASC_CHECK(attention != nullptr, "DecoderLM: empty attention factory");
  detail::check_parameter_memory("DecoderLM", static_cast<double>(o.vocab()) * (o.tie_embeddings() ? 1 : 2),
                                 o.d_model(), o.ffn(), o.layers());
  tok_emb = register_module("tok_emb", std::make_shared<nn::Embedding>(o.vocab(), o.d_model()));
  auto block = nn::TransformerBlockOptions(o.d_model(), o.heads())
                   .ffn(o.ffn())
                   .dropout(o.dropout())
                   .attention_dropout(o.attention_dropout())
                   .rope(true);
  blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < o.layers(); ++i)
    blocks->push_back(std::make_shared<nn::TransformerDecoderBlock>(block, attention));
  norm = register_module("norm", std::make_shared<nn::LayerNorm>(nn::LayerNormOptions({o.d_model()})));
  // Small embedding init (as GPT-2): tied to the output head, N(0, 1) rows would give logits of size sqrt(D).
  nn::init::normal_(tok_emb->weight, 0.0, 0.02);
  if (!o.tie_embeddings()) head = register_module("head", std::make_shared<nn::Linear>(o.d_model(), o.vocab(), false));
}

Tensor DecoderLM::forward(const Tensor& tokens) {
  ASC_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.size(1) >= 1,
            "DecoderLM: expected tokens (B, T >= 1), got {}", tokens.defined() ? tokens.shape() : Shape{});
  Tensor x = (*tok_emb)(tokens);        // (B, T, D); positions enter through RoPE inside attention
  for (auto& b : *blocks) x = (*b)(x);  // each block: causal self-attention + FFN
  x = (*norm)(x);
  return head ? (*head)(x) : linear(x, tok_emb->weight);  // (B, T, vocab)
}

Tensor DecoderLM::loss(const Tensor& tokens) {
  ASC_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.size(1) >= 2,
            "DecoderLM.loss: expected tokens (B, T >= 2), got {}", tokens.defined() ? tokens.shape() : Shape{});
  const int64_t T = tokens.size(1);
  Tensor logits = forward(tokens.narrow(1, 0, T - 1));      // (B, T-1, V)
  Tensor target = tokens.narrow(1, 1, T - 1).contiguous();  // (B, T-1)
  return cross_entropy(logits.reshape({-1, options.vocab()}), target.reshape({-1}));
}

Tensor DecoderLM::generate(const Tensor& prompt, int64_t steps) {
  GenerateOptions o;
  o.max_new_tokens = steps, o.temperature = 0.0;
  return generate(prompt, o);
}

bool DecoderLM::supports_kv_cache() const {
  for (const auto& b : *blocks)
    if (!std::static_pointer_cast<nn::TransformerDecoderBlock>(b)->attn->supports_kv_cache()) return false;
  return true;
}

Tensor DecoderLM::forward_incremental(const Tensor& x_new, std::vector<nn::KVCache>& caches) {
  ASC_CHECK(x_new.defined() && x_new.dim() == 2 && x_new.size(1) >= 1,
            "DecoderLM.forward_incremental: expected tokens (B, t >= 1), got {}",
            x_new.defined() ? x_new.shape() : Shape{});
  caches.resize(static_cast<size_t>(options.layers()));
  Tensor x = (*tok_emb)(x_new);  // (B, t, D)
  size_t l = 0;
  for (auto& b : *blocks)
    x = std::static_pointer_cast<nn::TransformerDecoderBlock>(b)->forward_incremental(x, caches[l++]);
  x = (*norm)(x.select(1, x.size(1) - 1));                // (B, D): the last position
  return head ? (*head)(x) : linear(x, tok_emb->weight);  // (B, V)
}

namespace {

// The next token of each row of logits (B, V), as `o` says; uniform numbers from `gen`, one Philox block per row.
Tensor pick_next(const Tensor& logits, const GenerateOptions& o, Generator& gen) {
  const Tensor host = logits.detach().to(Device::cpu()).to(kFloat64).contiguous();
  const int64_t B = host.size(0), V = host.size(1);
  const std::vector<double> all = host.to_vector<double>();
  std::vector<int64_t> next(static_cast<size_t>(B));
  const Generator::State draw = o.temperature > 0 ? gen.draw(static_cast<uint64_t>(B)) : Generator::State{0, 0};
  for (int64_t b = 0; b < B; ++b) {
    const double* row = all.data() + b * V;
    if (o.temperature <= 0) {  // greedy: the first largest (NaN counts as largest, as argmax)
      next[static_cast<size_t>(b)] =
          std::max_element(row, row + V,
                           [](double x, double y) { return !std::isnan(x) && (std::isnan(y) || x < y); }) -
          row;
      continue;
    }
    // candidates by logit, largest first (ties: the smaller id first); top-k, then the softmax, then top-p
    ASC_CHECK(std::all_of(row, row + V, [](double v) { return !std::isnan(v) && v != INFINITY; }) &&
                  std::any_of(row, row + V, [](double v) { return std::isfinite(v); }),
              "DecoderLM.generate: row {} of the logits holds NaN or +inf (or nothing finite): nothing to sample", b);
    std::vector<int64_t> ids(static_cast<size_t>(V));  // a strict order now: no NaN
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int64_t x, int64_t y) { return row[x] > row[y]; });
    size_t keep = o.top_k > 0 ? std::min<size_t>(static_cast<size_t>(o.top_k), ids.size()) : ids.size();
    std::vector<double> p(keep);
    double z = 0;
    for (size_t i = 0; i < keep; ++i) z += p[i] = std::exp((row[ids[i]] - row[ids[0]]) / o.temperature);
    double cum = 0;
    size_t nucleus = keep;
    for (size_t i = 0; i < keep; ++i) {
      cum += p[i] / z;
      if (cum >= o.top_p) {
        nucleus = i + 1;
        break;
      }
    }
    double mass = 0;
    for (size_t i = 0; i < nucleus; ++i) mass += p[i];
    const auto w = philox4x32(draw.seed, draw.offset + static_cast<uint64_t>(b));
    const double u = uint_to_unit_double(w[0], w[1]) * mass;
    size_t pick = nucleus - 1;
    double acc = 0;
    for (size_t i = 0; i < nucleus; ++i)
      if ((acc += p[i]) > u) {
        pick = i;
        break;
      }
    next[static_cast<size_t>(b)] = ids[pick];
  }
  return tensor(next, {B, 1});
}

}  // namespace

Tensor DecoderLM::generate(const Tensor& prompt, const GenerateOptions& o) {
  ASC_CHECK(prompt.defined() && prompt.dim() == 2 && prompt.size(1) >= 1 && prompt.dtype() == kInt64,
            "DecoderLM.generate: expected an int64 prompt (B, T >= 1), got {} {}",
            prompt.defined() ? dtype_name(prompt.dtype()) : "undefined", prompt.defined() ? prompt.shape() : Shape{});
  ASC_CHECK(o.max_new_tokens >= 0, "DecoderLM.generate: expected steps >= 0 (max_new_tokens), got {}",
            o.max_new_tokens);
  ASC_CHECK(o.max_new_tokens <= std::numeric_limits<int64_t>::max() - prompt.size(1),
            "DecoderLM.generate: a prompt of {} tokens plus {} steps overflows int64", prompt.size(1),
            o.max_new_tokens);
  ASC_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
            "DecoderLM.generate: temperature must be a finite number >= 0, got {}", o.temperature);
  ASC_CHECK(o.top_k >= 0, "DecoderLM.generate: top_k must be >= 0, got {}", o.top_k);
  ASC_CHECK(o.top_p > 0 && o.top_p <= 1, "DecoderLM.generate: top_p must be in (0, 1], got {}", o.top_p);
  for (int64_t t : o.stop_tokens)
    ASC_CHECK(t >= 0 && t < options.vocab(), "DecoderLM.generate: stop token {} is not in the vocabulary [0, {})", t,
              options.vocab());
  if (o.max_new_tokens == 0) return prompt;
  // RoPE's tables cover a fixed number of positions: a sequence past them is refused before anything is generated
  for (const auto& b : *blocks)
    if (auto mha = std::dynamic_pointer_cast<nn::MultiHeadAttention>(
            std::static_pointer_cast<nn::TransformerDecoderBlock>(b)->attn);
        mha && mha->options.rope())
      ASC_CHECK(prompt.size(1) + o.max_new_tokens <= mha->options.rope_max_len(),
                "DecoderLM.generate: a prompt of {} tokens plus {} new ones passes the {} positions of the model's "
                "rotary tables",
                prompt.size(1), o.max_new_tokens, mha->options.rope_max_len());
  NoGradGuard g;
  const bool was_training = is_training();
  eval();
  Generator& gen = o.generator ? *o.generator : default_generator();
  const bool cached = o.use_cache && supports_kv_cache();
  const int64_t B = prompt.size(0);
  std::vector<nn::KVCache> caches;
  std::vector<int64_t> stopped(static_cast<size_t>(B), -1);  // the stop token a row ended with
  Tensor seq = prompt;
  try {
    Tensor logits = cached ? forward_incremental(prompt, caches) : forward(prompt).select(1, prompt.size(1) - 1);
    for (int64_t s = 0; s < o.max_new_tokens; ++s) {
      Tensor next = pick_next(logits, o, gen);  // (B, 1) int64 on the CPU
      std::vector<int64_t> ids = next.to_vector<int64_t>();
      bool all_stopped = true;
      for (int64_t b = 0; b < B; ++b) {
        auto& id = ids[static_cast<size_t>(b)];
        if (stopped[static_cast<size_t>(b)] >= 0)
          id = stopped[static_cast<size_t>(b)];
        else if (std::find(o.stop_tokens.begin(), o.stop_tokens.end(), id) != o.stop_tokens.end())
          stopped[static_cast<size_t>(b)] = id;
        all_stopped = all_stopped && stopped[static_cast<size_t>(b)] >= 0;
      }
      next = tensor(ids, {B, 1});
      if (o.on_token) o.on_token(next.reshape({B}));
      const Tensor dev = next.to(prompt.device());
      seq = cat({seq, dev}, 1);
      if (all_stopped || s + 1 == o.max_new_tokens || (o.stop_when && o.stop_when(seq))) break;
      logits = cached ? forward_incremental(dev, caches) : forward(seq).select(1, seq.size(1) - 1);
    }
  } catch (...) {
    if (was_training) train();
    throw;
  }
  if (was_training) train();
  return seq;
}

}  // namespace asc::models
