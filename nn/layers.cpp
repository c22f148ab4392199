#include "nn/layers.h"

#include <algorithm>
#include <cmath>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/format.h"
#include "nn/init.h"
#include "ops/ops.h"

namespace asc::nn {

namespace {
// True when x's trailing dims equal `tail`.
bool ends_with(const Tensor& x, const Shape& tail) {
  if (x.dim() < tail.size()) return false;
  for (int i = 0; i < tail.size(); ++i)
    if (x.size(x.dim() - tail.size() + i) != tail[i]) return false;
  return true;
}

void check_floating_input(const Tensor& x, const char* cls) {
  ASC_CHECK(x.defined(), "{}: undefined input", cls);
  ASC_CHECK(is_floating(x.dtype()), "{}: expected a floating input, got dtype {}", cls, x.dtype());
}
}  // namespace

// ---- Embedding --------------------------------------------------------------------------------------------------

Embedding::Embedding(const EmbeddingOptions& o) : Module("Embedding"), options(o) {
  ASC_CHECK(o.num_embeddings() > 0 && o.embedding_dim() > 0,
            "Embedding: num_embeddings and embedding_dim must be positive, got {} and {}", o.num_embeddings(),
            o.embedding_dim());
  ASC_CHECK(o.padding_idx() == -1 || (o.padding_idx() >= 0 && o.padding_idx() < o.num_embeddings()),
            "Embedding: padding_idx must be -1 (none) or in [0, {}), got {}", o.num_embeddings(), o.padding_idx());
  weight = register_parameter("weight", empty({o.num_embeddings(), o.embedding_dim()}));
  reset_parameters();
}

void Embedding::reset_parameters() {
  init::normal_(weight, 0.0, 1.0);
  if (options.padding_idx() >= 0) {
    NoGradGuard g;
    weight.select(0, options.padding_idx()).zero_();
  }
}

Tensor Embedding::forward(const Tensor& index) {
  ASC_CHECK(index.defined() && index.dtype() == kInt64, "Embedding: expected an int64 index tensor, got {}",
            index.defined() ? dtype_name(index.dtype()) : "undefined");
  return embedding(weight, index, options.padding_idx());
}

std::string Embedding::extra_repr() const {
  std::string s = fmt::format("{}, {}", options.num_embeddings(), options.embedding_dim());
  if (options.padding_idx() >= 0) s += fmt::format(", padding_idx={}", options.padding_idx());
  return s;
}

// ---- LayerNorm / RMSNorm ----------------------------------------------------------------------------------------

LayerNorm::LayerNorm(const LayerNormOptions& o) : Module("LayerNorm"), options(o) {
  const Shape& ns = o.normalized_shape();
  ASC_CHECK(!ns.empty(), "LayerNorm: normalized_shape must not be empty");
  for (auto d : ns) ASC_CHECK(d > 0, "LayerNorm: normalized_shape {} has a non-positive size", ns);
  ASC_CHECK(o.eps() >= 0, "LayerNorm: eps must be >= 0, got {}", o.eps());
  if (o.elementwise_affine()) {
    weight = register_parameter("weight", empty(ns));
    if (o.bias()) bias = register_parameter("bias", empty(ns));
  }
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (weight.defined()) init::ones_(weight);
  if (bias.defined()) init::zeros_(bias);
}

Tensor LayerNorm::forward(const Tensor& x) {
  check_floating_input(x, "LayerNorm");
  ASC_CHECK(ends_with(x, options.normalized_shape()), "LayerNorm: expected input (..., {}), got {}",
            options.normalized_shape(), x.shape());
  return layer_norm(x, options.normalized_shape(), weight, bias, options.eps());
}

std::string LayerNorm::extra_repr() const {
  return fmt::format("{}, eps={}, elementwise_affine={}", options.normalized_shape(), options.eps(),
                     options.elementwise_affine());
}

RMSNorm::RMSNorm(const RMSNormOptions& o) : Module("RMSNorm"), options(o) {
  ASC_CHECK(o.dim() > 0, "RMSNorm: dim must be positive, got {}", o.dim());
  ASC_CHECK(o.eps() >= 0, "RMSNorm: eps must be >= 0, got {}", o.eps());
  if (o.elementwise_affine()) weight = register_parameter("weight", empty({o.dim()}));
  reset_parameters();
}

void RMSNorm::reset_parameters() {
  if (weight.defined()) init::ones_(weight);
}

Tensor RMSNorm::forward(const Tensor& x) {
  check_floating_input(x, "RMSNorm");
  ASC_CHECK(x.dim() >= 1 && x.size(-1) == options.dim(), "RMSNorm: expected input (..., {}), got {}", options.dim(),
            x.shape());
  return rms_norm(x, Shape{options.dim()}, weight, options.eps());
}

std::string RMSNorm::extra_repr() const {
  return fmt::format("{}, eps={}, elementwise_affine={}", options.dim(), options.eps(), options.elementwise_affine());
}

// ---- Dropout ----------------------------------------------------------------------------------------------------

Dropout::Dropout(double p_) : Module("Dropout"), p(p_) {
  ASC_CHECK(p_ >= 0.0 && p_ <= 1.0, "Dropout: p must be in [0, 1], got {}", p_);
}

Tensor Dropout::forward(const Tensor& x) {
  ASC_CHECK(x.defined(), "Dropout: undefined input");
  ASC_CHECK(p >= 0.0 && p <= 1.0, "Dropout: p must be in [0, 1], got {}", p);  // p is a public member
  if (!is_training() || p == 0.0) return x;
  return dropout(x, p, true);
}

std::string Dropout::extra_repr() const { return fmt::format("p={}", p); }

// ---- activations ------------------------------------------------------------------------------------------------

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor SiLU::forward(const Tensor& x) { return silu(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }

// ---- Flatten, Softmax, LogSoftmax ---------------------------------------------------------------------------------

Flatten::Flatten(int64_t start, int64_t end) : Module("Flatten"), start_dim(start), end_dim(end) {}
Tensor Flatten::forward(const Tensor& x) { return x.flatten(start_dim, end_dim); }
std::string Flatten::extra_repr() const { return fmt::format("start_dim={}, end_dim={}", start_dim, end_dim); }

Softmax::Softmax(int64_t d) : Module("Softmax"), dim(d) {}
Tensor Softmax::forward(const Tensor& x) { return softmax(x, dim); }
std::string Softmax::extra_repr() const { return fmt::format("dim={}", dim); }

LogSoftmax::LogSoftmax(int64_t d) : Module("LogSoftmax"), dim(d) {}
Tensor LogSoftmax::forward(const Tensor& x) { return log_softmax(x, dim); }
std::string LogSoftmax::extra_repr() const { return fmt::format("dim={}", dim); }

GELU::GELU(const std::string& approximate) : Module("GELU") {
  ASC_CHECK(approximate == "none" || approximate == "tanh", "GELU: approximate must be 'none' or 'tanh', got '{}'",
            approximate);
  tanh_approximation = approximate == "tanh";
}
Tensor GELU::forward(const Tensor& x) { return gelu(x, tanh_approximation); }
std::string GELU::extra_repr() const { return tanh_approximation ? "approximate='tanh'" : ""; }

namespace {
class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& x) override { return x; }
};
}  // namespace

std::shared_ptr<Module> make_activation(const std::string& name) {
  if (name == "relu") return std::make_shared<ReLU>();
  if (name == "gelu") return std::make_shared<GELU>();
  if (name == "gelu_tanh") return std::make_shared<GELU>("tanh");
  if (name == "silu") return std::make_shared<SiLU>();
  if (name == "tanh") return std::make_shared<Tanh>();
  if (name == "sigmoid") return std::make_shared<Sigmoid>();
  if (name == "identity") return std::make_shared<Identity>();
  ASC_THROW("make_activation: unknown activation '{}' (relu, gelu, gelu_tanh, silu, tanh, sigmoid, identity)", name);
}

// ---- Sequential -------------------------------------------------------------------------------------------------

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) : Module("Sequential") {
  for (const auto& m : modules) push_back(m);
}
Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) : Module("Sequential") {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  ASC_CHECK(module != nullptr, "{}.push_back: null module at position {}", type_name(), modules_.size());
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

const std::shared_ptr<Module>& Sequential::operator[](size_t i) const {
  ASC_CHECK(i < modules_.size(), "{}[{}]: index out of range (size {})", type_name(), i, modules_.size());
  return modules_[i];
}

void Sequential::check_cast(bool ok, size_t i) const {
  ASC_CHECK(ok, "{}.at({}): the module is a {}, not the requested type", type_name(), i, modules_[i]->type_name());
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& m : modules_) y = (*m)(y);
  return y;
}

// ---- ModuleList -------------------------------------------------------------------------------------------------

ModuleList::ModuleList(std::initializer_list<std::shared_ptr<Module>> modules) : Module("ModuleList") {
  for (const auto& m : modules) push_back(m);
}
ModuleList::ModuleList(const std::vector<std::shared_ptr<Module>>& modules) : Module("ModuleList") {
  for (const auto& m : modules) push_back(m);
}

void ModuleList::push_back(std::shared_ptr<Module> module) {
  ASC_CHECK(module != nullptr, "ModuleList.push_back: null module at position {}", modules_.size());
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

const std::shared_ptr<Module>& ModuleList::operator[](size_t i) const {
  ASC_CHECK(i < modules_.size(), "ModuleList[{}]: index out of range (size {})", i, modules_.size());
  return modules_[i];
}

// ---- ModuleDict -------------------------------------------------------------------------------------------------

ModuleDict::ModuleDict(std::initializer_list<Item> items) : Module("ModuleDict") {
  for (const auto& [key, m] : items) insert(key, m);
}

void ModuleDict::insert(const std::string& key, std::shared_ptr<Module> module) {
  ASC_CHECK(module != nullptr, "ModuleDict.insert: null module for key '{}'", key);
  ASC_CHECK(!contains(key), "ModuleDict.insert: key '{}' is already in the dict", key);
  register_module(key, module);  // checks the name (non-empty, no '.')
  items_.emplace_back(key, std::move(module));
}

bool ModuleDict::contains(const std::string& key) const {
  return std::any_of(items_.begin(), items_.end(), [&](const Item& it) { return it.first == key; });
}

const std::shared_ptr<Module>& ModuleDict::operator[](const std::string& key) const {
  for (const Item& it : items_)
    if (it.first == key) return it.second;
  std::string known;
  for (const Item& it : items_) known += (known.empty() ? "" : ", ") + it.first;
  ASC_THROW("ModuleDict['{}']: no such key (keys: {})", key, known.empty() ? "none" : known);
}

std::vector<std::string> ModuleDict::keys() const {
  std::vector<std::string> out;
  for (const Item& it : items_) out.push_back(it.first);
  return out;
}

void ModuleDict::check_cast(bool ok, const std::string& key) const {
  ASC_CHECK(ok, "ModuleDict.at('{}'): the module is a {}, not the requested type", key, (*this)[key]->type_name());
}

// ---- MLP --------------------------------------------------------------------------------------------------------

namespace {
std::string join(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}
const MLPOptions& checked(const MLPOptions& o) {
  ASC_CHECK(o.sizes().size() >= 2, "MLP: sizes must list at least (in, out), got {} entries", o.sizes().size());
  for (auto s : o.sizes()) ASC_CHECK(s > 0, "MLP: sizes must be positive, got {}", join(o.sizes()));
  ASC_CHECK(o.dropout() >= 0.0 && o.dropout() < 1.0, "MLP: dropout must be in [0, 1), got {}", o.dropout());
  make_activation(o.activation());  // throws on an unknown name before anything is built
  return o;
}
}  // namespace

MLP::MLP(const MLPOptions& o) : Sequential("MLP"), options(checked(o)) {
  const auto& s = o.sizes();
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    push_back(std::make_shared<Linear>(LinearOptions(s[i], s[i + 1]).bias(o.bias())));
    if (i + 2 < s.size()) {
      push_back(make_activation(o.activation()));
      if (o.dropout() > 0.0) push_back(std::make_shared<Dropout>(o.dropout()));
    }
  }
}

std::string MLP::extra_repr() const {
  return fmt::format("sizes={}, activation={}, dropout={}", join(options.sizes()), options.activation(),
                     options.dropout());
}

}  // namespace asc::nn
