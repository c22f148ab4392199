// Option checks shared by the models (models/checks.h).
#include "models/checks.h"

#include <unistd.h>

#include <cmath>

#include "core/error.h"
#include "core/format.h"

namespace asc::models::detail {

void check_model_options(const char* model, const std::vector<std::pair<const char*, int64_t>>& positive,
                         double dropout) {
  for (const auto& [name, value] : positive) ASC_CHECK(value >= 1, "{}: {} must be >= 1, got {}", model, name, value);
  ASC_CHECK(dropout >= 0 && dropout < 1, "{}: dropout must be in [0, 1), got {}", model, dropout);
}

void check_attention_shape(const char* model, const char* attention, int64_t attn_d_model, int64_t attn_heads,
                           int64_t d_model, int64_t heads) {
  ASC_CHECK((attn_d_model == 0 || attn_d_model == d_model) && (attn_heads == 0 || attn_heads == heads),
            "{}: the {} attention options have d_model {} and heads {}, the model has d_model {} and heads {}; make "
            "them equal (or leave the attention's at 0 to take the model's)",
            model, attention, attn_d_model, attn_heads, d_model, heads);
}

void check_parameter_memory(const char* model, double embedding_rows, int64_t d_model, int64_t ffn, int64_t layers) {
  const double d = static_cast<double>(d_model), f = static_cast<double>(ffn);
  // Per block: the attention's four d x d projections and biases, the feed-forward net, two layer norms.
  const double block = 4 * d * d + 4 * d + 2 * d * f + d + f + 4 * d;
  const double bytes = 4.0 * (embedding_rows * d + static_cast<double>(layers) * block);
  const double physical = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  ASC_CHECK(physical <= 0 || bytes <= physical,
            "{}: {} layers of width {} (ffn {}) and {} embedding rows need about {:.3g} GiB of parameters, more than "
            "this machine's {:.3g} GiB",
            model, layers, d_model, ffn, embedding_rows, bytes / (1 << 30), physical / (1 << 30));
}

}  // namespace asc::models::detail
