#pragma once
// nn layers built on the functional ops: Embedding, LayerNorm, RMSNorm, Dropout, the activations as modules
// (ReLU, GELU, SiLU, Tanh, Sigmoid), and the containers Sequential, ModuleList and MLP.
//
//   auto emb = std::make_shared<asc::nn::Embedding>(1000, 64, /*padding_idx=*/0);     // (B, T) int64 -> (B, T, 64)
//   auto ln = std::make_shared<asc::nn::LayerNorm>(asc::nn::LayerNormOptions({64}).eps(1e-6));
//   auto net = std::make_shared<asc::nn::Sequential>(asc::nn::Sequential{
//       std::make_shared<asc::nn::Linear>(64, 256), std::make_shared<asc::nn::GELU>(),
//       std::make_shared<asc::nn::Linear>(256, 64)});
//   auto mlp = std::make_shared<asc::nn::MLP>(asc::nn::MLPOptions({64, 256, 256, 10}).activation("silu").dropout(0.1));
//   asc::Tensor y = (*mlp)((*ln)((*emb)(tokens)));                                    // (B, T, 10)
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "nn/linear.h"
#include "nn/module.h"

namespace asc::nn {

// ---- Embedding --------------------------------------------------------------------------------------------------

struct EmbeddingOptions {
  EmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  ASC_ARG(int64_t, num_embeddings);
  ASC_ARG(int64_t, embedding_dim);
  ASC_ARG(int64_t, padding_idx) = -1;  // -1: none; else in [0, num): that row starts at zero and gets no gradient
};

// A lookup table: weight (num, dim) ~ N(0, 1) with the padding row zeroed (as in PyTorch).
class Embedding : public Module {
 public:
  explicit Embedding(const EmbeddingOptions& options);
  Embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx = -1)
      : Embedding(EmbeddingOptions(num_embeddings, embedding_dim).padding_idx(padding_idx)) {}
  Tensor forward(const Tensor& index) override;  // (...) int64 -> (..., dim)
  std::string extra_repr() const override;
  void reset_parameters();

  EmbeddingOptions options;
  Tensor weight;  // (num, dim)
};

// ---- normalisation ----------------------------------------------------------------------------------------------

struct LayerNormOptions {
  LayerNormOptions(Shape normalized_shape) : normalized_shape_(std::move(normalized_shape)) {}
  ASC_ARG(Shape, normalized_shape);
  ASC_ARG(double, eps) = 1e-5;
  ASC_ARG(bool, elementwise_affine) = true;  // learnable weight (ones) and bias (zeros) of normalized_shape
  ASC_ARG(bool, bias) = true;                // with elementwise_affine: false drops the bias
};

// (x - mean) / sqrt(var + eps) * weight + bias over the trailing normalized_shape dims (population variance).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(const LayerNormOptions& options);
  LayerNorm(int64_t dim, double eps = 1e-5, bool elementwise_affine = true)
      : LayerNorm(LayerNormOptions(Shape{dim}).eps(eps).elementwise_affine(elementwise_affine)) {}
  Tensor forward(const Tensor& x) override;  // (..., *normalized_shape) -> same
  std::string extra_repr() const override;
  void reset_parameters();

  LayerNormOptions options;
  Tensor weight;  // normalized_shape, or undefined
  Tensor bias;    // normalized_shape, or undefined
};

struct RMSNormOptions {
  RMSNormOptions(int64_t dim) : dim_(dim) {}
  ASC_ARG(int64_t, dim);
  ASC_ARG(double, eps) = 1e-6;
  ASC_ARG(bool, elementwise_affine) = true;  // learnable weight (ones)
};

// x / sqrt(mean(x^2) + eps) * weight over the last dim.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(const RMSNormOptions& options);
  RMSNorm(int64_t dim, double eps = 1e-6) : RMSNorm(RMSNormOptions(dim).eps(eps)) {}
  Tensor forward(const Tensor& x) override;  // (..., dim) -> same
  std::string extra_repr() const override;
  void reset_parameters();

  RMSNormOptions options;
  Tensor weight;  // (dim), or undefined
};

// ---- Dropout ----------------------------------------------------------------------------------------------------

// Zeroes each element with probability p and scales the rest by 1 / (1 - p) in training mode (masks drawn from
// the default generator); in eval mode it returns its input itself.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double p;
};

// ---- activations ------------------------------------------------------------------------------------------------

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

// Exact GELU x * Phi(x), or the tanh approximation with approximate = "tanh".
class GELU : public Module {
 public:
  explicit GELU(const std::string& approximate = "none");
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  bool tanh_approximation;
};

class SiLU : public Module {
 public:
  SiLU() : Module("SiLU") {}
  Tensor forward(const Tensor& x) override;
};

class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& x) override;
};

class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& x) override;
};

// x.flatten(start_dim, end_dim) as a module (PyTorch's nn.Flatten: by default every dim after the batch's).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int64_t start_dim, end_dim;
};

// asc::softmax / asc::log_softmax along `dim` as modules (dim required, as PyTorch's nn.Softmax(dim) advises).
class Softmax : public Module {
 public:
  explicit Softmax(int64_t dim);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int64_t dim;
};
class LogSoftmax : public Module {
 public:
  explicit LogSoftmax(int64_t dim);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  int64_t dim;
};

// An activation module by name: "relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid", "identity" (error else).
std::shared_ptr<Module> make_activation(const std::string& name);

// ---- containers -------------------------------------------------------------------------------------------------

// Modules applied in order, each to the previous one's output (through operator(), so their hooks run).
// Children are named "0", "1", ...
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  explicit Sequential(const std::vector<std::shared_ptr<Module>>& modules);
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;  // error when out of range
  // The i-th module as a T (error when it is not one).
  template <class T>
  std::shared_ptr<T> at(size_t i) const {
    auto p = std::dynamic_pointer_cast<T>((*this)[i]);
    check_cast(p != nullptr, i);
    return p;
  }
  Tensor forward(const Tensor& x) override;  // an empty Sequential is the identity

 protected:
  explicit Sequential(std::string type_name) : Module(std::move(type_name)) {}

 private:
  void check_cast(bool ok, size_t i) const;
  std::vector<std::shared_ptr<Module>> modules_;
};

// A list of child modules (registered as "0", "1", ...) with no forward of its own.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  ModuleList(std::initializer_list<std::shared_ptr<Module>> modules);
  explicit ModuleList(const std::vector<std::shared_ptr<Module>>& modules);
  void push_back(std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  const std::shared_ptr<Module>& operator[](size_t i) const;  // error when out of range
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

// Named child modules in insertion order (PyTorch's nn.ModuleDict), each registered under its key, so state-dict
// names read "<key>.<parameter>"; no forward of its own. Keys follow the registration rules (unique, no '.').
//   auto heads = std::make_shared<asc::nn::ModuleDict>();
//   heads->insert("wte", std::make_shared<asc::nn::Embedding>(V, D));
//   asc::Tensor e = heads->at<asc::nn::Embedding>("wte")->forward(ids);
class ModuleDict : public Module {
 public:
  using Item = std::pair<std::string, std::shared_ptr<Module>>;
  ModuleDict() : Module("ModuleDict") {}
  ModuleDict(std::initializer_list<Item> items);
  void insert(const std::string& key, std::shared_ptr<Module> module);  // error when the key exists
  bool contains(const std::string& key) const;
  const std::shared_ptr<Module>& operator[](const std::string& key) const;  // error naming the keys when absent
  template <class T>
  std::shared_ptr<T> at(const std::string& key) const {
    auto p = std::dynamic_pointer_cast<T>((*this)[key]);
    check_cast(p != nullptr, key);
    return p;
  }
  std::vector<std::string> keys() const;
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  auto begin() const { return items_.begin(); }  // (key, module) pairs in insertion order
  auto end() const { return items_.end(); }

 private:
  void check_cast(bool ok, const std::string& key) const;
  std::vector<Item> items_;
};

struct MLPOptions {
  MLPOptions(std::vector<int64_t> sizes) : sizes_(std::move(sizes)) {}
  ASC_ARG(std::vector<int64_t>, sizes);       // (in, hidden..., out), at least 2 entries
  ASC_ARG(std::string, activation) = "relu";  // see make_activation
  ASC_ARG(double, dropout) = 0.0;             // after each hidden activation when > 0
  ASC_ARG(bool, bias) = true;
};

// Linear -> activation [-> Dropout] -> ... -> Linear: no activation after the last layer. A Sequential, so the
// children are "0", "1", ... (e.g. sizes {4, 8, 2}: 0 Linear(4, 8), 1 ReLU, 2 Linear(8, 2)).
class MLP : public Sequential {
 public:
  explicit MLP(const MLPOptions& options);
  std::string extra_repr() const override;
  MLPOptions options;
};

}  // namespace asc::nn
