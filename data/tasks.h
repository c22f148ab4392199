#pragma once
// The tasks the `train` tool and the experiments run on: each is a train / validation / test split of Datasets
// (data/dataset.h) and what a model needs to know about them. docs/data.md describes each task, its source, its
// labels and its splits.
//
//   asc::data::Task task = asc::data::make_task("listops", {.seed = 1, .train_size = 2000});
//   auto model = std::make_shared<asc::models::TransformerClassifier>(
//       asc::models::TransformerClassifierOptions(task.vocab, task.max_len, task.classes));
//
// Names accepted by make_task:
//   fashion-mnist       Fashion-MNIST images, input (28, 28) float32 in [0, 1]        (Debian: dataset-fashion-mnist)
//   fashion-mnist-seq   the same images as pixel sequences: 784 int64 tokens 0..255 (LRA's "Image" task, in grey)
//   listops             generated ListOps expressions (LRA rules), 10 classes
//   text                man pages read as bytes, labelled by section                 (Debian: manpages, manpages-dev)
//   fortunes            short texts read as bytes, labelled by topic (4 classes)     (Debian: fortunes, pinned version)
//   pathfinder          generated 32 x 32 Pathfinder images as 1024 pixel tokens, 2 classes
//   grouping            synthetic tokens drawn around latent cluster centres, with each token's true group
//   file:PATH           a TSV / CSV file of `label<TAB or ,>text` (bytes) or `label<TAB or ,>id id id ...`
// A missing package or file is an asc::Error naming the apt package (or the path) and the command that fixes it.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/fashion_mnist.h"  // IdxArray

namespace asc::data {

struct TaskOptions {
  uint64_t seed = 0;       // generated tasks: the data; file tasks: the train / validation split
  int64_t train_size = 0;  // 0: the task's default size of each split; smaller: the first n examples
  int64_t val_size = 0;
  int64_t test_size = 0;
  int64_t min_len = 0;  // sequence length bounds of generated / read sequences; 0: the task's default
  int64_t max_len = 0;
  std::string data_dir;    // "": the task's default location (e.g. /usr/share/datasets/fashion-mnist)
  int64_t image_size = 0;  // image tasks (fashion-mnist*, pathfinder): side after average pooling by a whole factor
                           // (fashion-mnist 28 -> 14 or 7: 196 or 49 pixel tokens); 0: the native size
  // text and file: tasks: every text split into windows of max_len tokens (max_len >= 2 required) that overlap by one
  // token, instead of cut at max_len — a language model's contexts, in which every token after a text's first is a
  // target exactly once; each window keeps its text's label and split. min_len still applies to the whole text.
  bool windows = false;
  // pathfinder: the scene's difficulty (data/pathfinder.h, PathfinderOptions); 0 (distractors: -1) keeps its default
  int64_t pathfinder_size = 0;    // side the scene is drawn at, before any pooling to image_size (default 32)
  int64_t path_steps = 0;         // steps of each of the two long paths (default 12): their length
  int64_t distractors = -1;       // short paths without dots (default 3)
  bool pathfinder_solid = false;  // paths drawn solid instead of dashed (an easier scene)
};

struct Task {
  std::string name;
  std::shared_ptr<const Dataset> train, val, test;
  int64_t vocab = 0;    // token ids lie in [0, vocab); 0 for float inputs (images)
  int64_t classes = 0;  // labels lie in [0, classes)
  int64_t max_len = 0;  // the longest input sequence (tokens), or the number of input values of an image
  int64_t pad_id = 0;   // the token a loader pads sequences with (its valid mask is false there)
  std::vector<std::string> class_names;  // one per class (may be empty)
  std::string description;               // one line: source, sizes, labels
};

// The task `name` (see the list above), built with `options`. Unknown names and bad options are an asc::Error.
Task make_task(const std::string& name, const TaskOptions& options = {});
// The names make_task accepts (file:PATH listed as "file:PATH").
std::vector<std::string> task_names();

// New inputs for a model trained on a task, prepared as the task prepared its own examples (the predict tool), each
// unlabelled (label -1); `lines` holds each example's 1-based line in its file (images: its index, from 1).
struct Inputs {
  std::shared_ptr<const Dataset> examples;
  std::vector<int64_t> lines;
};
// Grey images (N, R, C) of bytes (an IDX file: read_idx), as the image tasks': pixel tokens 0..255 (as_sequence:
// fashion-mnist-seq, pathfinder) or [0, 1] floats (fashion-mnist), average-pooled to image_size x image_size as
// make_task does (0: as they are).
Inputs image_inputs(const IdxArray& images, bool as_sequence, int64_t image_size);
// One example per non-empty line of a text file (gzip or plain): its bytes (tsv: those after the first tab), cut at
// max_len (0: no cut), as the text and file: tasks read theirs.
Inputs text_inputs(const std::string& path, bool tsv, int64_t max_len);
// One example per non-empty line of token ids (separated by spaces, tabs or commas), each in [0, vocab), cut at
// max_len.
Inputs id_inputs(const std::string& path, int64_t vocab, int64_t max_len);

// Each task's builder (make_task dispatches to these; data/<task>.cpp).
Task fashion_mnist_task(const TaskOptions& options, bool as_sequence);
Task listops_task(const TaskOptions& options);
Task text_task(const TaskOptions& options);
Task fortunes_task(const TaskOptions& options);
Task file_task(const std::string& path, const TaskOptions& options);
Task pathfinder_task(const TaskOptions& options);
Task grouping_task(const TaskOptions& options);

}  // namespace asc::data
