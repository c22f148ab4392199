// Pathfinder: scenes of random-walk paths placed without touching, rendered dashed or solid, and the task builder.
// Every image is drawn from its own Philox stream, so the datasets generate lazily in get().
#include "data/pathfinder.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"
#include "core/generator.h"
#include "data/generated.h"
#include "data/tasks.h"

namespace asc::data {
namespace {

using detail::GeneratedDataset;
using detail::mix64;
using detail::Stream;

constexpr int kHeadings = 64;

// (cos, sin) of the 64 headings 2 pi k / 64, from their Taylor series: only +, * and / (exactly rounded IEEE
// operations), so every machine gets the same bits, which libm's cos / sin do not promise.
const std::array<std::array<double, 2>, kHeadings>& heading_table() {
  static const auto table = [] {
    std::array<std::array<double, 2>, kHeadings> t{};
    constexpr double kPi = 3.141592653589793238462643383279502884;
    for (int k = 0; k < kHeadings; ++k) {
      const double x = (k < kHeadings / 2 ? k : k - kHeadings) * (2.0 * kPi / kHeadings);  // in [-pi, pi)
      double c = 0.0, s = 0.0, term = 1.0;                                                 // term = x^n / n!
      for (int n = 0; n < 40; ++n) {
        if (n % 4 == 0)
          c += term;
        else if (n % 4 == 1)
          s += term;
        else if (n % 4 == 2)
          c -= term;
        else
          s -= term;
        term = term * x / (n + 1);
      }
      t[static_cast<size_t>(k)] = {c, s};
    }
    return t;
  }();
  return table;
}

void check_options(const PathfinderOptions& o) {
  ASC_CHECK(o.size >= 8 && o.size <= 256, "pathfinder: size must be in [8, 256], got {}", o.size);
  ASC_CHECK(o.path_steps >= 1 && o.path_steps <= 1000, "pathfinder: path_steps must be in [1, 1000], got {}",
            o.path_steps);
  ASC_CHECK(o.distractors >= 0 && o.distractors <= 100, "pathfinder: distractors must be in [0, 100], got {}",
            o.distractors);
  ASC_CHECK(o.distractor_steps >= 1 && o.distractor_steps <= 1000,
            "pathfinder: distractor_steps must be in [1, 1000], got {}", o.distractor_steps);
  ASC_CHECK(o.step_len >= 0.5 && o.step_len <= 8.0, "pathfinder: step_len must be in [0.5, 8] pixels, got {}",
            o.step_len);
  ASC_CHECK(o.max_turn >= 0 && o.max_turn <= 16, "pathfinder: max_turn must be in [0, 16] (64ths of a turn), got {}",
            o.max_turn);
  ASC_CHECK(o.dash_len >= 0.5 && o.dash_len <= 64.0, "pathfinder: dash_len must be in [0.5, 64] pixels, got {}",
            o.dash_len);
  ASC_CHECK(o.gap_len >= 1.0 && o.gap_len <= 64.0, "pathfinder: gap_len must be in [1, 64] pixels, got {}", o.gap_len);
  ASC_CHECK(o.min_dot_distance >= 0.0 && o.min_dot_distance <= o.size,
            "pathfinder: min_dot_distance must be in [0, size = {}], got {}", o.size, o.min_dot_distance);
}

// One placed path: the pixels its samples round to (with whether each lies in a dash) and its dots.
struct Path {
  std::vector<int> pixels;  // row * size + col, one per arc sample
  std::vector<bool> on;     // the sample lies in a dash
  std::vector<int> dots;    // the centres of this path's dots (0, 1 or 2)
};

// A random walk of `steps` steps; false when it leaves [1, size - 2] (the caller draws again).
bool walk(Stream& s, const PathfinderOptions& o, int steps, Path& p) {
  const auto& dir = heading_table();
  const double lo = 1.0, hi = o.size - 2.0;
  // Samples every `spacing` <= 0.5 px: consecutive samples round to pixels at most one apart in each coordinate,
  // so the solid path is 8-connected.
  const int sub = static_cast<int>(std::ceil(o.step_len / 0.5));
  const double spacing = o.step_len / sub;
  const int dash = std::max(1, static_cast<int>(std::floor(o.dash_len / spacing + 0.5)));
  const int gap = std::max(1, static_cast<int>(std::floor(o.gap_len / spacing + 0.5)));
  double x = lo + s.unit() * (hi - lo), y = lo + s.unit() * (hi - lo);
  int h = s.below(kHeadings);
  p.pixels.clear();
  p.on.clear();
  p.dots.clear();
  auto add = [&](double px, double py) {
    const int m = static_cast<int>(p.pixels.size());
    const int row = static_cast<int>(std::floor(py + 0.5)), col = static_cast<int>(std::floor(px + 0.5));
    p.pixels.push_back(row * o.size + col);
    p.on.push_back(m % (dash + gap) < dash);
  };
  add(x, y);
  for (int step = 0; step < steps; ++step) {
    if (step > 0) h = (h + s.between(-o.max_turn, o.max_turn) + kHeadings) % kHeadings;
    const double dx = dir[static_cast<size_t>(h)][0], dy = dir[static_cast<size_t>(h)][1];
    for (int j = 1; j <= sub; ++j) {
      const double px = x + dx * (spacing * j), py = y + dy * (spacing * j);
      if (px < lo || px > hi || py < lo || py > hi) return false;
      add(px, py);
    }
    x += dx * o.step_len;
    y += dy * o.step_len;
  }
  return true;
}

// Claims the path's pixels and its dots' 3 x 3 squares for path `id` in `owner` (-1 = free), unless one of them or
// one of their 8 neighbours belongs to another path: then nothing is changed and the result is false.
bool place(const Path& p, int id, int size, std::vector<int>& owner) {
  std::vector<int> cells = p.pixels;
  for (int d : p.dots)
    for (int dr = -1; dr <= 1; ++dr)
      for (int dc = -1; dc <= 1; ++dc) cells.push_back(d + dr * size + dc);  // dots lie in [1, size - 2]: in range
  for (int c : cells) {
    const int r = c / size, col = c % size;
    for (int dr = -1; dr <= 1; ++dr)
      for (int dc = -1; dc <= 1; ++dc) {
        const int rr = r + dr, cc = col + dc;
        if (rr < 0 || rr >= size || cc < 0 || cc >= size) continue;
        const int other = owner[static_cast<size_t>(rr * size + cc)];
        if (other >= 0 && other != id) return false;
      }
  }
  for (int c : cells) owner[static_cast<size_t>(c)] = id;
  return true;
}

double pixel_distance(int a, int b, int size) {
  const double dr = a / size - b / size, dc = a % size - b % size;
  return std::sqrt(dr * dr + dc * dc);
}

}  // namespace

PathfinderSample pathfinder_render(uint64_t seed, uint64_t index, const PathfinderOptions& o) {
  check_options(o);
  constexpr int kScenes = 1000, kPathTries = 100;
  Stream s(mix64(seed ^ 0x5041544846494E44ull /* "PATHFIND" */), index);
  const int S = o.size;
  const int label = s.below(2);  // drawn first: the class does not depend on how many scenes were rejected
  std::vector<int> owner(static_cast<size_t>(S * S));
  std::vector<Path> paths(static_cast<size_t>(2 + o.distractors));
  for (int scene = 0; scene < kScenes; ++scene) {
    std::fill(owner.begin(), owner.end(), -1);
    bool ok = true;
    for (int id = 0; id < static_cast<int>(paths.size()) && ok; ++id) {
      Path& p = paths[static_cast<size_t>(id)];
      ok = false;
      for (int attempt = 0; attempt < kPathTries && !ok; ++attempt) {
        if (!walk(s, o, id < 2 ? o.path_steps : o.distractor_steps, p)) continue;
        // Path A (id 0) carries both dots (label 1) or one (label 0; path B, id 1, carries the other).
        if (id == 0)
          p.dots =
              label == 1 ? std::vector<int>{p.pixels.front(), p.pixels.back()} : std::vector<int>{p.pixels.front()};
        if (id == 1 && label == 0) p.dots = {p.pixels.front()};
        if (id == 0 && label == 1 && pixel_distance(p.dots[0], p.dots[1], S) < o.min_dot_distance) continue;
        if (id == 1 && label == 0 && pixel_distance(paths[0].dots[0], p.dots[0], S) < o.min_dot_distance) continue;
        ok = place(p, id, S, owner);
      }
    }
    if (!ok) continue;
    PathfinderSample out;
    out.size = S;
    out.label = label;
    out.pixels.assign(static_cast<size_t>(S * S), 0);
    for (const Path& p : paths)
      for (size_t m = 0; m < p.pixels.size(); ++m)
        if (!o.dashed || p.on[m]) out.pixels[static_cast<size_t>(p.pixels[m])] = 255;
    std::vector<int> dots = paths[0].dots;
    if (label == 0) dots.push_back(paths[1].dots[0]);
    for (size_t k = 0; k < 2; ++k) {
      const int d = dots[k];
      out.dots[k] = {d / S, d % S};
      for (int dr = -1; dr <= 1; ++dr)
        for (int dc = -1; dc <= 1; ++dc) out.pixels[static_cast<size_t>(d + dr * S + dc)] = 255;
    }
    return out;
  }
  ASC_THROW(
      "pathfinder: could not place {} paths without touching in a {} x {} image in {} scenes (path_steps {}, "
      "distractors {}): use fewer or shorter paths",
      paths.size(), S, S, kScenes, o.path_steps, o.distractors);
}

Tensor pathfinder_tokens(const PathfinderSample& sample) {
  const int64_t n = static_cast<int64_t>(sample.size) * sample.size;
  ASC_CHECK(n > 0 && static_cast<int64_t>(sample.pixels.size()) == n,
            "pathfinder_tokens: sample of size {} holds {} pixels, expected {}", sample.size, sample.pixels.size(), n);
  std::vector<int64_t> tokens(sample.pixels.begin(), sample.pixels.end());
  return tensor(tokens, {n});  // (size * size) int64
}

Tensor pathfinder_image(const PathfinderSample& sample) {
  const int64_t n = static_cast<int64_t>(sample.size) * sample.size;
  ASC_CHECK(n > 0 && static_cast<int64_t>(sample.pixels.size()) == n,
            "pathfinder_image: sample of size {} holds {} pixels, expected {}", sample.size, sample.pixels.size(), n);
  std::vector<float> values(sample.pixels.size());
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(sample.pixels[i]) / 255.0f;
  return tensor(values, {sample.size, sample.size});  // (size, size) float32
}

Task pathfinder_task(const TaskOptions& options) {
  PathfinderOptions po;
  ASC_CHECK(options.pathfinder_size >= 0 && options.path_steps >= 0 && options.distractors >= -1,
            "pathfinder: pathfinder_size and path_steps must be >= 0 and distractors >= -1 (0, -1: the default), got "
            "{}, {} and {}",
            options.pathfinder_size, options.path_steps, options.distractors);
  if (options.pathfinder_size > 0) po.size = static_cast<int>(std::min<int64_t>(options.pathfinder_size, 1 << 20));
  if (options.path_steps > 0) po.path_steps = static_cast<int>(std::min<int64_t>(options.path_steps, 1 << 20));
  if (options.distractors >= 0) po.distractors = static_cast<int>(std::min<int64_t>(options.distractors, 1 << 20));
  po.dashed = !options.pathfinder_solid;
  pathfinder_render(0, 0, po);  // bad or too crowded options: an asc::Error here, not in a loader thread
  const int64_t pixels = static_cast<int64_t>(po.size) * po.size;
  ASC_CHECK((options.min_len == 0 || options.min_len == pixels) && (options.max_len == 0 || options.max_len == pixels),
            "pathfinder: every image is {} pixel tokens; min_len / max_len must be 0 or {}, got {} and {}", pixels,
            pixels, options.min_len, options.max_len);
  const int64_t sizes[3] = {options.train_size > 0 ? options.train_size : 20000,
                            options.val_size > 0 ? options.val_size : 2000,
                            options.test_size > 0 ? options.test_size : 2000};
  std::shared_ptr<const Dataset> splits[3];
  for (uint64_t split = 0; split < 3; ++split) {
    const uint64_t seed = mix64(options.seed) + split;  // each split its own stream key
    splits[split] = std::make_shared<GeneratedDataset>(sizes[split], [seed, po](int64_t i) {
      PathfinderSample p = pathfinder_render(seed, static_cast<uint64_t>(i), po);
      return Example{.input = pathfinder_tokens(p), .label = p.label, .groups = {}};  // input (1024) int64
    });
  }
  Task task;
  task.name = "pathfinder";
  task.train = splits[0];
  task.val = splits[1];
  task.test = splits[2];
  task.vocab = 256;
  task.classes = 2;
  task.max_len = pixels;
  task.pad_id = 0;
  task.class_names = {"disconnected", "connected"};
  task.description = fmt::format(
      "Pathfinder-{}: generated {}x{} images of {} random-walk paths ({} steps each, {} distractors), two dots; "
      "label 1 when one path joins them; {} pixel tokens 0..255; {} / {} / {} examples (seed {})",
      po.size, po.size, po.size, po.dashed ? "dashed" : "solid", po.path_steps, po.distractors, pixels, sizes[0],
      sizes[1], sizes[2], options.seed);
  return task;
}

}  // namespace asc::data
