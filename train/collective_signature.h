#pragma once
// For the process-group backends (train/process_group.cpp, cuda/process_group_nccl.cpp), not for users: what a rank
// passes to a collective, as 4 int64 the ranks all-gather before it, and the comparison that makes every rank throw
// the same asc::Error when they differ (instead of the transport reading past a buffer).
#include <array>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace asc::distributed::detail {

enum class Collective : int64_t { AllReduce = 0, Broadcast = 1, AllGather = 2 };
const char* collective_name(Collective op);

// (operation, dtype, element count, root); root -1 for collectives without one.
std::array<int64_t, 4> collective_signature(Collective op, const Tensor& t, int64_t root);
// all: every rank's signature, rank r's at [4r, 4r + 4). Throws naming rank 0's call and the first that differs.
void check_collective_signatures(const std::vector<int64_t>& all, const std::string& backend);

}  // namespace asc::distributed::detail
