// make_task: the task names of data/tasks.h, dispatched to each task's builder (data/<task>.cpp).
#include "data/tasks.h"

#include <charconv>
#include <cmath>
#include <string_view>

#include "core/error.h"
#include "data/gzip.h"

namespace asc::data {

namespace {

// Images average-pooled by a whole factor f: a (S, S) float image becomes (S/f, S/f); a pixel sequence of S² tokens
// 0..255 becomes (S/f)² tokens, each the rounded mean of its f x f block (round half up). Labels and groups pass
// through (groups are per token and have no pooled meaning: an example carrying them is refused).
class PooledImages : public Dataset {
 public:
  PooledImages(std::shared_ptr<const Dataset> base, int64_t side, int64_t factor)
      : base_(std::move(base)), side_(side), f_(factor) {}
  int64_t size() const override { return base_->size(); }
  Example get(int64_t i) const override {
    Example ex = base_->get(i);
    ASC_CHECK(!ex.groups.defined(), "image_size: pooling an example that carries per-token groups");
    const int64_t out = side_ / f_;
    const bool tokens = ex.input.dtype() == kInt64;
    Tensor in = ex.input.contiguous();
    ASC_CHECK(in.numel() == side_ * side_, "image_size: expected {} pixels, got {}", side_ * side_, in.numel());
    std::vector<double> acc(static_cast<size_t>(out * out), 0.0);
    const int64_t* tok = tokens ? in.data_ptr<int64_t>() : nullptr;
    const float* px = tokens ? nullptr : in.data_ptr<float>();
    for (int64_t r = 0; r < side_; ++r)
      for (int64_t c = 0; c < side_; ++c)
        acc[(r / f_) * out + c / f_] += tokens ? static_cast<double>(tok[r * side_ + c]) : px[r * side_ + c];
    const double n = static_cast<double>(f_ * f_);
    if (tokens) {
      Tensor t = empty({out * out}, {.dtype = kInt64});
      int64_t* o = t.data_ptr<int64_t>();
      for (int64_t k = 0; k < out * out; ++k) o[k] = static_cast<int64_t>(std::floor(acc[k] / n + 0.5));
      ex.input = t;
    } else {
      Tensor t = empty({out, out}, {.dtype = kFloat32});
      float* o = t.data_ptr<float>();
      for (int64_t k = 0; k < out * out; ++k) o[k] = static_cast<float>(acc[k] / n);
      ex.input = t;
    }
    return ex;
  }

 private:
  std::shared_ptr<const Dataset> base_;
  int64_t side_, f_;
};

Task pooled(Task task, int64_t size) {
  // The native side from the task itself (its files may hold another size than the usual one): a square image.
  const int64_t native = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(task.max_len))));
  if (size == 0 || size == native) return task;
  ASC_CHECK(native * native == task.max_len, "make_task: image_size needs square images; {} holds {} values an image",
            task.name, task.max_len);
  ASC_CHECK(size >= 1 && size < native && native % size == 0,
            "make_task: image_size must divide the task's native side {} (e.g. {}), got {}", native, native / 2, size);
  const int64_t f = native / size;
  task.train = std::make_shared<PooledImages>(task.train, native, f);
  task.val = std::make_shared<PooledImages>(task.val, native, f);
  task.test = std::make_shared<PooledImages>(task.test, native, f);
  task.max_len = size * size;  // tokens of a sequence, or values of an image
  task.description += fmt::format(" (average-pooled {}x{} to {}x{})", f, f, size, size);
  return task;
}

}  // namespace

Inputs image_inputs(const IdxArray& images, bool as_sequence, int64_t image_size) {
  ASC_CHECK(images.dims.size() == 3, "image inputs: expected images (N, rows, cols), got {} dimensions",
            images.dims.size());
  const int64_t N = images.dims[0], R = images.dims[1], C = images.dims[2];
  ASC_CHECK(image_size == 0 || R == C, "image inputs: image_size needs square images, got {} x {}", R, C);
  Inputs in;
  auto all = std::make_shared<InMemoryDataset>();
  for (int64_t i = 0; i < N; ++i) {
    all->push_back(image_example(images.data.data() + i * R * C, R, C, -1, as_sequence));
    in.lines.push_back(i + 1);
  }
  in.examples = all;
  if (image_size > 0 && image_size != R) {
    ASC_CHECK(image_size < R && R % image_size == 0,
              "image inputs: the model reads {} x {} images, pooled from a side it divides; these are {} x {}",
              image_size, image_size, R, C);
    in.examples = std::make_shared<PooledImages>(in.examples, R, R / image_size);
  }
  return in;
}

namespace {

template <class F>
Inputs line_inputs(const std::string& path, const char* who, F&& tokens) {
  const std::string text = read_file_maybe_gzip(path, who);
  Inputs in;
  auto all = std::make_shared<InMemoryDataset>();
  int64_t line = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view l(text.data() + start, end - start);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    ++line;
    start = end + 1;
    if (l.find_first_not_of(" \t") == std::string_view::npos) continue;  // a blank line
    std::vector<int64_t> ids = tokens(l, line);
    ASC_CHECK(!ids.empty(), "{}: {}:{}: no input on the line", who, path, line);
    Example ex;
    ex.input = tensor(ids, {static_cast<int64_t>(ids.size())});
    all->push_back(std::move(ex));
    in.lines.push_back(line);
  }
  ASC_CHECK(all->size() > 0, "{}: {} holds no input (one example per line)", who, path);
  in.examples = all;
  return in;
}

}  // namespace

Inputs text_inputs(const std::string& path, bool tsv, int64_t max_len) {
  return line_inputs(path, "text inputs", [&](std::string_view l, int64_t line) {
    if (tsv) {
      const size_t tab = l.find('\t');
      ASC_CHECK(tab != std::string_view::npos, "text inputs: {}:{}: no tab (a TSV line is <label or id><TAB>text)",
                path, line);
      l = l.substr(tab + 1);
    }
    if (max_len > 0 && static_cast<int64_t>(l.size()) > max_len) l = l.substr(0, static_cast<size_t>(max_len));
    std::vector<int64_t> ids;
    for (char ch : l) ids.push_back(static_cast<uint8_t>(ch));
    return ids;
  });
}

Inputs id_inputs(const std::string& path, int64_t vocab, int64_t max_len) {
  return line_inputs(path, "token-id inputs", [&](std::string_view l, int64_t line) {
    std::vector<int64_t> ids;
    size_t i = 0;
    while (i < l.size()) {
      if (l[i] == ' ' || l[i] == '\t' || l[i] == ',') {
        ++i;
        continue;
      }
      int64_t v = 0;
      const auto r = std::from_chars(l.data() + i, l.data() + l.size(), v);
      ASC_CHECK(
          r.ec == std::errc() && (r.ptr == l.data() + l.size() || *r.ptr == ' ' || *r.ptr == '\t' || *r.ptr == ','),
          "token-id inputs: {}:{}: '{}' is not a token id", path, line, l.substr(i, 20));
      ASC_CHECK(v >= 0 && v < vocab, "token-id inputs: {}:{}: token {} is outside the model's vocabulary [0, {})", path,
                line, v, vocab);
      ids.push_back(v);
      i = static_cast<size_t>(r.ptr - l.data());
    }
    if (max_len > 0 && static_cast<int64_t>(ids.size()) > max_len) ids.resize(static_cast<size_t>(max_len));
    return ids;
  });
}

std::vector<std::string> task_names() {
  return {"fashion-mnist", "fashion-mnist-seq", "listops", "text", "fortunes", "pathfinder", "grouping", "file:PATH"};
}

Task make_task(const std::string& name, const TaskOptions& options) {
  ASC_CHECK(options.train_size >= 0 && options.val_size >= 0 && options.test_size >= 0,
            "make_task: split sizes must be >= 0 (0: the task's default), got train {} val {} test {}",
            options.train_size, options.val_size, options.test_size);
  ASC_CHECK(options.min_len >= 0 && options.max_len >= 0 &&
                (options.max_len == 0 || options.windows || options.min_len <= options.max_len),
            "make_task: need 0 <= min_len <= max_len (0: the task's default), got min_len {} max_len {}",
            options.min_len, options.max_len);
  ASC_CHECK(!options.windows || name == "text" || name.rfind("file:", 0) == 0,
            "make_task: windows apply to the text and file: tasks (texts a language model reads), not '{}'", name);
  ASC_CHECK(options.image_size >= 0, "make_task: image_size must be >= 0 (0: native), got {}", options.image_size);
  const bool image_task = name == "fashion-mnist" || name == "fashion-mnist-seq" || name == "pathfinder";
  ASC_CHECK(options.image_size == 0 || image_task,
            "make_task: image_size applies to fashion-mnist, fashion-mnist-seq and pathfinder, not '{}'", name);
  ASC_CHECK(
      (options.pathfinder_size == 0 && options.path_steps == 0 && options.distractors == -1 &&
       !options.pathfinder_solid) ||
          name == "pathfinder",
      "make_task: pathfinder_size, path_steps, distractors and pathfinder_solid apply to the pathfinder task, not '{}'",
      name);
  if (name == "fashion-mnist") return pooled(fashion_mnist_task(options, /*as_sequence=*/false), options.image_size);
  if (name == "fashion-mnist-seq") return pooled(fashion_mnist_task(options, /*as_sequence=*/true), options.image_size);
  if (name == "pathfinder") return pooled(pathfinder_task(options), options.image_size);
  if (name == "listops") return listops_task(options);
  if (name == "text") return text_task(options);
  if (name == "fortunes") return fortunes_task(options);
  if (name == "grouping") return grouping_task(options);
  if (name.rfind("file:", 0) == 0) {
    ASC_CHECK(name.size() > 5, "make_task: file: needs a path, as in file:data/my_task.tsv");
    return file_task(name.substr(5), options);
  }
  std::string known;
  for (const std::string& n : task_names()) known += (known.empty() ? "" : ", ") + n;
  ASC_THROW("make_task: unknown task '{}' (known: {})", name, known);
}

}  // namespace asc::data
