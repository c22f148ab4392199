// InMemoryDataset and Subset (data/dataset.h).
#include "data/dataset.h"

#include "core/error.h"

namespace asc::data {

Example InMemoryDataset::get(int64_t i) const {
  ASC_CHECK(i >= 0 && i < size(), "InMemoryDataset.get: index {} is out of range for {} examples (0 <= i < {})", i,
            size(), size());
  return examples_[static_cast<size_t>(i)];  // copies the handles: the tensors share their storage
}

Subset::Subset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices)
    : base_(std::move(base)), indices_(std::move(indices)) {
  ASC_CHECK(base_ != nullptr, "Subset: the base dataset is null");
  const int64_t n = base_->size();
  for (size_t k = 0; k < indices_.size(); ++k)
    ASC_CHECK(indices_[k] >= 0 && indices_[k] < n,
              "Subset: index {} (entry {}) is out of range for a base dataset of {} examples (0 <= i < {})",
              indices_[k], k, n, n);
}

Example Subset::get(int64_t i) const {
  ASC_CHECK(i >= 0 && i < size(), "Subset.get: index {} is out of range for {} examples (0 <= i < {})", i, size(),
            size());
  return base_->get(indices_[static_cast<size_t>(i)]);
}

}  // namespace asc::data
