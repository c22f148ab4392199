// Analyses of a trained model (train/analyses.h).
#include "train/analyses.h"

#include <chrono>
#include <optional>
#include <set>

#include "data/loader.h"
#include "nn/safetensors.h"
#include "stats/cluster.h"

namespace asc::train {

namespace {

// Sums of the clustering scores per space ("A", "z"), layer and head, and the counts of the defined ones.
class ClusterScores {
 public:
  static constexpr int kMetrics = 4;
  ClusterScores(size_t layers, int64_t heads) : L_(layers), H_(heads) {}

  // k-means with k clusters on the T rows of x (T, d), scored against the true groups.
  void add(const std::string& space, size_t l, int64_t h, const std::vector<double>& x, int64_t d,
           const std::vector<int64_t>& truth, int64_t k, uint64_t seed) {
    if (!sums_.count(space)) sums_[space] = grid(), counts_[space] = grid();
    const stats::KMeansResult km = stats::kmeans(x, d, k, {.seed = seed});
    const int64_t found = static_cast<int64_t>(std::set<int64_t>(km.labels.begin(), km.labels.end()).size());
    const int64_t T = static_cast<int64_t>(truth.size());
    const bool spread = found >= 2 && found <= T - 1;  // silhouette and Calinski-Harabasz need 2..T-1 clusters
    const double v[kMetrics] = {stats::normalized_mutual_info(truth, km.labels),
                                stats::adjusted_rand_index(truth, km.labels),
                                spread ? stats::silhouette_score(x, d, km.labels) : std::nan(""),
                                spread ? stats::calinski_harabasz_score(x, d, km.labels) : std::nan("")};
    for (int m = 0; m < kMetrics; ++m)
      if (std::isfinite(v[m])) sums_[space][l][h][m] += v[m], counts_[space][l][h][m] += 1;
  }

  // {"examples", "k", "spaces": {space: {"layers": [[{metric, metric_undefined}]], "mean_over_heads"}}}
  json to_json(int64_t seen) const {
    json out = {{"examples", seen}, {"k", "the number of true groups in each example"}, {"spaces", json::object()}};
    for (const auto& [space, s] : sums_) {
      const Grid& n = counts_.at(space);
      json layers = json::array();
      std::array<double, kMetrics> total{}, total_n{};
      for (size_t l = 0; l < L_; ++l) {
        json heads = json::array();
        for (int64_t h = 0; h < H_; ++h) {
          json m = json::object();
          for (int k = 0; k < kMetrics; ++k) {
            m[kNames[k]] = n[l][h][k] > 0 ? json(s[l][h][k] / n[l][h][k]) : json(nullptr);
            m[std::string(kNames[k]) + "_undefined"] = static_cast<double>(seen) - n[l][h][k];
            total[k] += s[l][h][k], total_n[k] += n[l][h][k];
          }
          heads.push_back(m);
        }
        layers.push_back(heads);
      }
      json mean = json::object();
      for (int k = 0; k < kMetrics; ++k) mean[kNames[k]] = total_n[k] > 0 ? json(total[k] / total_n[k]) : json(nullptr);
      out["spaces"][space] = {{"layers", layers}, {"mean_over_heads", mean}};
    }
    return out;
  }

 private:
  using Grid = std::vector<std::vector<std::array<double, kMetrics>>>;  // [layer][head][metric]
  static constexpr const char* kNames[kMetrics] = {"nmi", "ari", "silhouette", "calinski_harabasz"};
  Grid grid() const { return Grid(L_, std::vector<std::array<double, kMetrics>>(H_)); }
  size_t L_;
  int64_t H_;
  std::map<std::string, Grid> sums_, counts_;
};

// While alive: the classifier keeps its attention weights, each ASCender layer's input is kept (for z); after, the
// model as it was (also when a measure throws).
class AttentionCapture {
 public:
  explicit AttentionCapture(Run& r) : r_(r), inputs(r.attention.size()), hooks_(r.attention.size(), -1) {
    r.model->eval();
    r.classifier->need_weights = true;
    for (size_t l = 0; l < r.attention.size(); ++l)
      if (std::dynamic_pointer_cast<nn::AscenderAttention>(r.attention[l]))
        hooks_[l] =
            r.attention[l]->add_forward_pre_hook([this, l](nn::Module&, const Tensor& x) -> std::optional<Tensor> {
              inputs[l] = x.detach();
              return std::nullopt;
            });
  }
  ~AttentionCapture() {
    r_.classifier->need_weights = false;
    for (size_t l = 0; l < hooks_.size(); ++l)
      if (hooks_[l] >= 0) r_.attention[l]->remove_hook(hooks_[l]);
    r_.model->train();
  }
  AttentionCapture(const AttentionCapture&) = delete;
  AttentionCapture& operator=(const AttentionCapture&) = delete;

 private:
  Run& r_;

 public:
  std::vector<Tensor> inputs;  // per layer: the last batch's input (ASCender layers only)

 private:
  std::vector<int> hooks_;
};

}  // namespace

json cluster_metrics(Run& r, int64_t n) {
  ASC_CHECK(r.classifier, "cluster_metrics needs the attention classifier");
  NoGradGuard ng;
  AttentionCapture capture(r);
  const size_t L = r.attention.size();
  const int64_t H = r.c.heads;
  ClusterScores scores(L, H);
  int64_t seen = 0;
  struct Stop {};
  try {
    data::for_each_batch(*r.task.test, r.c.batch, r.task.pad_id, [&](const data::Batch& b) {
      run_batch(r, b, false);
      const std::vector<int64_t> groups = b.groups.to_vector<int64_t>();  // (B, T)
      const int64_t B = b.size(), T = b.groups.size(1);
      // Once per batch and layer: A (B, H, T, T); z (B, T, H·d_z) from the layer's input (ASCender only)
      std::vector<Tensor> As(L), zs(L);
      for (size_t l = 0; l < L; ++l) {
        As[l] = r.attention[l]->attention_weights().to(Device::cpu()).to(kFloat64);
        if (auto a = std::dynamic_pointer_cast<nn::AscenderAttention>(r.attention[l]))
          zs[l] = (*a->z_proj)(capture.inputs[l]).to(Device::cpu()).to(kFloat64);
      }
      for (int64_t i = 0; i < B && seen < n; ++i, ++seen) {
        std::vector<int64_t> truth(groups.begin() + i * T, groups.begin() + (i + 1) * T);
        const int64_t k = static_cast<int64_t>(std::set<int64_t>(truth.begin(), truth.end()).size());
        if (k < 2) continue;  // one group: nothing to recover
        for (size_t l = 0; l < L; ++l)
          for (int64_t h = 0; h < H; ++h) {
            const uint64_t seed = (static_cast<uint64_t>(seen) * L + l) * static_cast<uint64_t>(H) + h;  // distinct
            scores.add("A", l, h, As[l].select(0, i).select(0, h).contiguous().to_vector<double>(), T, truth, k, seed);
            if (!zs[l].defined()) continue;
            const int64_t dz = zs[l].size(2) / H;
            Tensor zh = zs[l].select(0, i).view({T, H, dz}).select(1, h).contiguous();  // (T, d_z)
            scores.add("z", l, h, zh.to_vector<double>(), dz, truth, k, seed);
          }
      }
      if (seen >= n) throw Stop{};
    });
  } catch (const Stop&) {
  }
  return scores.to_json(seen);
}

namespace {

// (1) of robustness(): the classifier's logits on the first test examples with the input embeddings perturbed through
// a hook on the token embedding — Gaussian noise (the correlation with the clean logits) and one FGSM step (the
// logits' relative change).
json input_perturbations(Run& r, Generator& gen) {
  const Config& c = r.c;
  auto& model = *r.classifier;
  // (1) The input embeddings of the first examples of the test set, perturbed through a hook on the token embedding.
  std::function<Tensor(const Tensor&)> perturb;  // embeddings (B, T, D) -> what the model reads
  const int hook =
      model.tok_emb->add_forward_post_hook([&](nn::Module&, const Tensor&, const Tensor& out) -> std::optional<Tensor> {
        if (!perturb) return std::nullopt;
        return perturb(out);
      });
  struct RemoveHook {  // the hook refers to `perturb`: it must not outlive this function, also when a measure throws
    nn::Module& m;
    int id;
    ~RemoveHook() { m.remove_hook(id); }
  } remove_hook{*model.tok_emb, hook};
  double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0, n = 0;  // Pearson sums over every logit, clean vs noisy
  double clean_sq = 0, change_sq = 0;                       // FGSM: ||L_adv - L||² and ||L||²
  int64_t seen = 0;
  struct Stop {};
  try {
    data::for_each_batch(*r.task.test, c.batch, r.task.pad_id, [&](const data::Batch& b) {
      if (seen >= c.robustness_examples) throw Stop{};
      Tensor x = b.input.to(r.device), valid = b.valid.defined() ? b.valid.to(r.device) : Tensor();
      Tensor labels = b.labels.to(r.device);
      Tensor clean, noisy, adv;
      {
        NoGradGuard ng;
        perturb = nullptr;
        clean = model.forward(x, valid);  // (B, classes)
        perturb = [&](const Tensor& e) {  // Gaussian noise of 10 % of the embeddings' standard deviation
          const double sd = std::sqrt(mean(pow(e - mean(e), 2.0)).item<double>());
          return e + randn(e.shape(), {.dtype = e.dtype(), .device = e.device()}, &gen) * (0.1 * sd);
        };
        noisy = model.forward(x, valid);
      }
      Tensor leaf;  // FGSM: the gradient of the loss with respect to the embeddings
      perturb = [&](const Tensor& e) {
        leaf = e.detach();
        leaf.set_requires_grad(true);
        return leaf;
      };
      cross_entropy(model.forward(x, valid), labels).backward();
      const Tensor step = (gt(leaf.grad(), 0.0).to(leaf.dtype()) - lt(leaf.grad(), 0.0).to(leaf.dtype())) * 0.01;
      {
        NoGradGuard ng;
        perturb = [&](const Tensor& e) { return e + step; };
        adv = model.forward(x, valid);
      }
      perturb = nullptr;
      model.zero_grad();
      const std::vector<double> a = clean.to(Device::cpu()).to(kFloat64).contiguous().to_vector<double>();
      const std::vector<double> z = noisy.to(Device::cpu()).to(kFloat64).contiguous().to_vector<double>();
      const std::vector<double> v = adv.to(Device::cpu()).to(kFloat64).contiguous().to_vector<double>();
      for (size_t i = 0; i < a.size(); ++i) {
        sx += a[i], sy += z[i], sxx += a[i] * a[i], syy += z[i] * z[i], sxy += a[i] * z[i], n += 1;
        clean_sq += a[i] * a[i], change_sq += (v[i] - a[i]) * (v[i] - a[i]);
      }
      seen += b.size();
    });
  } catch (const Stop&) {
  }
  perturb = nullptr;
  const double cov = sxy - sx * sy / n, vx = sxx - sx * sx / n, vy = syy - sy * sy / n;
  return {{"examples", seen},
          {"noise_correlation", jnum(cov / std::sqrt(vx * vy))},
          {"fgsm_relative_change", jnum(std::sqrt(change_sq / clean_sq))}};
}

// (2): the first attention layer alone on N(0, 1) inputs of width d_model, float32 against float64 with the same
// weights: the largest difference relative to the largest output.
double precision_gap(Run& r, Generator& gen) {
  // (2) The first attention layer alone on N(0, 1) inputs of width d_model: float32 against float64, same weights.
  auto& layer = *r.attention[0];
  NoGradGuard ng;
  Tensor x = randn({2, r.task.max_len, r.c.d_model}, {.device = r.device}, &gen);
  Tensor y32 = layer.attend(x, {}).to(Device::cpu()).to(kFloat64);
  layer.to(kFloat64);
  Tensor y64 = layer.attend(x.to(kFloat64), {}).to(Device::cpu());
  layer.to(kFloat32);
  return amax(abs(y32 - y64)).item<double>() / amax(abs(y64)).item<double>();
}

// (3): forward + backward of that layer at every power of two from 16 to robustness_max_len: time, peak memory,
// whether the output and gradient are finite (or the error that stopped it).
json length_sweep(Run& r, Generator& gen) {
  // (3) Forward + backward of that layer at every power of two from 16 to --robustness-max-len.
  auto& layer = *r.attention[0];
  const int64_t D = r.c.d_model;
  json lengths = json::array();
  for (int64_t len = 16; len <= r.c.robustness_max_len; len *= 2) {
    json row = {{"length", len}};
    try {
      reset_cpu_peak_memory();
      const auto t0 = std::chrono::steady_clock::now();
      Tensor x = randn({1, len, D}, {.device = r.device, .requires_grad = true}, &gen);
      Tensor y = layer.attend(x, {});
      sum(y).backward();
      const bool finite = std::isfinite(sum(y).item<double>()) && std::isfinite(sum(x.grad()).item<double>());
      row["ok"] = finite;
      row["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      row["peak_mb"] = static_cast<double>(cpu_memory_stats().peak_allocated) / (1 << 20);
    } catch (const std::exception& e) {
      row["ok"] = false;
      row["error"] = e.what();
    }
    layer.zero_grad();
    lengths.push_back(row);
  }
  return lengths;
}

}  // namespace

json robustness(Run& r) {
  ASC_CHECK(r.classifier, "robustness needs an attention classifier");
  r.model->eval();
  Generator gen(r.c.seed + 7919);
  json out = input_perturbations(r, gen);
  out["float32_vs_float64_max_relative"] = jnum(precision_gap(r, gen));
  out["lengths"] = length_sweep(r, gen);
  r.model->train();
  return out;
}

void dump_decomposition(Run& r, int64_t i, const std::string& path) {
  std::vector<std::shared_ptr<nn::AscenderAttention>> layers;  // the indices and the layers were checked at start
  for (auto& a : r.attention)
    if (auto x = std::dynamic_pointer_cast<nn::AscenderAttention>(a)) layers.push_back(x);
  data::Example ex = r.task.test->get(i);
  data::Batch b = data::collate({ex}, r.task.pad_id);
  NoGradGuard ng;
  r.model->eval();
  for (auto& l : layers) l->need_decomposition = true;
  run_batch(r, b, false);
  StateDict d;
  for (size_t l = 0; l < r.attention.size(); ++l) {
    auto a = std::dynamic_pointer_cast<nn::AscenderAttention>(r.attention[l]);
    if (!a) continue;
    AscenderDecomposition dec = a->decomposition();
    const std::pair<const char*, Tensor> parts[] = {{"S_base", dec.S_base}, {"align", dec.align}, {"sep", dec.sep},
                                                    {"coh", dec.coh},       {"S", dec.S},         {"A", dec.A}};
    for (const auto& [name, t] : parts)
      d.set(fmt::format("L{}.{}", l, name), t.select(0, 0).to(Device::cpu()).to(kFloat32).contiguous());
    a->need_decomposition = false;
  }
  d.set("tokens", b.input.select(0, 0).contiguous());
  save_safetensors(path, d, {{"example", std::to_string(i)}, {"label", std::to_string(ex.label)}});
  r.model->train();
}

}  // namespace asc::train
