#pragma once
// Option checks shared by the models (models/transformer_classifier.h, models/decoder_lm.h): each refuses a bad value
// with an asc::Error naming the model, the option and the value, before anything is allocated.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace asc::models::detail {

// Every (name, value) must be >= 1; dropout must be in [0, 1) (NaN refused).
void check_model_options(const char* model, const std::vector<std::pair<const char*, int64_t>>& positive,
                         double dropout);
// An attention layer's own options inside a model: d_model and heads are 0 (take the model's) or the model's.
void check_attention_shape(const char* model, const char* attention, int64_t attn_d_model, int64_t attn_heads,
                           int64_t d_model, int64_t heads);
// The float32 parameters of `embedding_rows` embedding rows and `layers` Transformer blocks of width d_model and
// feed-forward width ffn (computed in double: no overflow) must fit in this machine's memory, so that
// layers = INT64_MAX is an error rather than an allocation loop ended by the out-of-memory killer.
void check_parameter_memory(const char* model, double embedding_rows, int64_t d_model, int64_t ffn, int64_t layers);

}  // namespace asc::models::detail
