// make_task: the task names of data/tasks.h, dispatched to each task's builder (data/<task>.cpp).
#include "data/tasks.h"

#include <cmath>

#include "core/error.h"

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

std::vector<std::string> task_names() {
  return {"fashion-mnist", "fashion-mnist-seq", "listops", "text", "pathfinder", "grouping", "file:PATH"};
}

Task make_task(const std::string& name, const TaskOptions& options) {
  ASC_CHECK(options.train_size >= 0 && options.val_size >= 0 && options.test_size >= 0,
            "make_task: split sizes must be >= 0 (0: the task's default), got train {} val {} test {}",
            options.train_size, options.val_size, options.test_size);
  ASC_CHECK(
      options.min_len >= 0 && options.max_len >= 0 && (options.max_len == 0 || options.min_len <= options.max_len),
      "make_task: need 0 <= min_len <= max_len (0: the task's default), got min_len {} max_len {}", options.min_len,
      options.max_len);
  ASC_CHECK(options.image_size >= 0, "make_task: image_size must be >= 0 (0: native), got {}", options.image_size);
  const bool image_task = name == "fashion-mnist" || name == "fashion-mnist-seq" || name == "pathfinder";
  ASC_CHECK(options.image_size == 0 || image_task,
            "make_task: image_size applies to fashion-mnist, fashion-mnist-seq and pathfinder, not '{}'", name);
  if (name == "fashion-mnist") return pooled(fashion_mnist_task(options, /*as_sequence=*/false), options.image_size);
  if (name == "fashion-mnist-seq") return pooled(fashion_mnist_task(options, /*as_sequence=*/true), options.image_size);
  if (name == "pathfinder") return pooled(pathfinder_task(options), options.image_size);
  if (name == "listops") return listops_task(options);
  if (name == "text") return text_task(options);
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
