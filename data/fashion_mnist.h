#pragma once
// Fashion-MNIST (Zalando's 28 x 28 grey clothing images, 10 classes) and the IDX file format it ships in.
//
//   asc::data::IdxArray a = asc::data::read_idx("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz");
//   // a.dims == {10000}, a.data.size() == 10000, each byte a label 0..9
//   asc::data::Task task = asc::data::make_task("fashion-mnist");   // fashion_mnist_task (data/tasks.h)
//
// The task reads the four IDX files {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from options.data_dir, else
// $ASC_FMNIST_DIR, else /usr/share/datasets/fashion-mnist (Debian: apt-get install dataset-fashion-mnist). Splits:
// train = the first 55000 images of the training file, val = its last 5000 (a fixed cut, the same for every seed),
// test = the 10000 t10k images; a non-zero options.train_size / val_size / test_size keeps the first n of a split.
// Inputs: (28, 28) float32 pixel / 255 in [0, 1], or (fashion-mnist-seq) (784) int64 tokens = the pixel bytes 0..255
// in row-major order. All 70000 images live in one shared uint8 buffer; get(i) builds the example's tensor.
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace asc::data {

// An IDX array of unsigned bytes: dims (each > 0) and the row-major payload, prod(dims) bytes.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

// The largest payload read_idx accepts (4 GiB): a header claiming more is refused before anything is allocated.
inline constexpr int64_t kMaxIdxBytes = int64_t{1} << 32;

// Reads an IDX file, gzip-compressed or plain (zlib's gzopen reads both). Format: a big-endian uint32 magic
// 0x00000800 | type << 8 | ndims (type 0x08, unsigned byte, is the only type accepted; ndims >= 1), ndims big-endian
// uint32 sizes (each > 0, their product <= kMaxIdxBytes), then exactly prod(sizes) bytes and nothing after them.
// A missing or unreadable file, a bad magic, a zero or oversized dimension, a truncated payload, trailing bytes or a
// corrupt gzip stream is an asc::Error naming the file; nothing is returned then.
IdxArray read_idx(const std::string& path);

// One grey image of rows x cols bytes as the image tasks' example: (R*C) int64 pixel tokens 0..255 (as_sequence) or
// an (R, C) float32 image in [0, 1].
Example image_example(const uint8_t* pixels, int64_t rows, int64_t cols, int64_t label, bool as_sequence);

// The ten Fashion-MNIST classes in label order: T-shirt/top, Trouser, ..., Ankle boot.
const std::vector<std::string>& fashion_mnist_class_names();

}  // namespace asc::data
