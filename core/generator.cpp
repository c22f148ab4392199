#include "core/generator.h"

namespace asc {

Generator& default_generator() {
  static Generator gen(0x5eed);
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace asc
