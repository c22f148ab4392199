#pragma once
// Pathfinder (Linsley et al. 2018; the Long Range Arena's Pathfinder-32, Tay et al. 2020): a 32 x 32 greyscale image
// with two marker dots and several dashed paths; label 1 when one path joins the two dots, 0 otherwise.
//
//   auto img = asc::data::pathfinder_render(/*seed=*/1, /*index=*/0);       // img.label, img.dots
//   asc::Tensor x = asc::data::pathfinder_tokens(img);                      // (1024) int64 pixel values 0..255
//   asc::Tensor im = asc::data::pathfinder_image(img);                      // (32, 32) float32 in [0, 1]
//
// Our generator (faithful in spirit, not a port of Linsley's code):
//   paths     smooth random walks: `steps` steps of step_len pixels; the heading takes one of 64 directions and
//             turns by a uniform integer in [-max_turn, max_turn] sixty-fourths of a turn per step (default +-22.5
//             degrees). Every point stays in [1, size - 2] so a dot around an end fits in the image.
//   scene     two long paths A and B (path_steps each) and `distractors` short ones (distractor_steps each).
//             A seeded coin picks the class (balanced in expectation). Label 1: the dots sit on both ends of A.
//             Label 0: one dot on an end of A, the other on an end of B. Both classes have two long paths and two
//             dots, so pixel counts carry no label. The dots are at least min_dot_distance pixels apart.
//   drawing   a path is sampled every <= 0.5 px along its arc and each sample lights the pixel it rounds to; with
//             `dashed` only samples whose arc position lies in a dash (dash_len on, gap_len off, starting on) light
//             up. A dot is the 3 x 3 square around its path end. Paths and dots are 255 on a 0 background.
//
// Guarantee (the generator rejects and redraws any path that would break it): in the *undashed* rendering each path
// with its dots is 8-connected, and no two paths touch, not even diagonally (no pixel of one is among the 8
// neighbours of a pixel of another). So an 8-connected flood fill from one dot over the undashed image reaches the
// other dot exactly when the label is 1. The geometry does not depend on `dashed`: the dashed image of (seed, index)
// is a subset of its undashed image, with the same dots.
#include <array>
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace asc::data {

struct PathfinderOptions {
  int size = 32;                  // the image is size x size, 8..256
  int path_steps = 12;            // steps of each of the two long paths (arc length path_steps * step_len)
  int distractors = 3;            // short paths without dots
  int distractor_steps = 4;       // steps of each distractor
  double step_len = 2.0;          // pixels per step, in [0.5, 8]
  int max_turn = 4;               // largest heading change per step, in 64ths of a full turn, 0..16
  bool dashed = true;             // false: every path drawn solid (the test's flood-fill view)
  double dash_len = 3.0;          // pixels of arc drawn per dash ...
  double gap_len = 2.0;           // ... and left dark between dashes (>= 1 so a gap can show)
  double min_dot_distance = 6.0;  // smallest Euclidean distance between the two dots, pixels
};

struct PathfinderSample {
  int size = 0;
  std::vector<uint8_t> pixels;               // (size, size) row-major, 0 or 255
  int label = 0;                             // 1: the dots are joined by a path
  std::array<std::array<int, 2>, 2> dots{};  // the two dot centres, (row, col)
};

// Image `index` of the stream `seed` (a pure function of its arguments). Bad options are an asc::Error, as is a
// configuration so crowded that 1000 scenes fail to place their paths.
PathfinderSample pathfinder_render(uint64_t seed, uint64_t index, const PathfinderOptions& options = {});

Tensor pathfinder_tokens(const PathfinderSample& sample);  // (size * size) int64, pixel values 0..255, row-major
Tensor pathfinder_image(const PathfinderSample& sample);   // (size, size) float32, pixel / 255

}  // namespace asc::data
