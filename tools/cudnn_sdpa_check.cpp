// Does cuDNN accept ascender's fused-attention graphs (cuda/cudnn_sdpa.cpp) for a given GPU, on a machine
// without one? cuDNN can plan for a device described by JSON device properties (tools/cudnn_devices/*.json);
// its heuristics then say how many engines take each graph. Run through tools/cudnn_sdpa_check.sh, which points
// the loader at the CUDA driver's stub library (plans then stop at module load, status 5001: expected).
//   bash tools/cudnn_sdpa_check.sh            # every device file, a table of shapes
// A graph with 0 engine configs would run on the composed path on that GPU (nn::sdpa_choice says why).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "ascender.h"
#include "cuda/cudnn_sdpa.h"

int main(int argc, char** argv) {
#if defined(ASC_HAVE_CUDNN) && !defined(ASC_CUDA_EMULATION)
  if (argc < 2) {
    std::fprintf(stderr, "usage: cudnn_sdpa_check DEVICE.json...\n");
    return 2;
  }
  struct Case {
    asc::DType dtype;
    int64_t B, H, T, S, D;
    bool causal, heads_last;
  };
  const Case cases[] = {
      {asc::kBFloat16, 2, 3, 24, 24, 16, false, false}, {asc::kBFloat16, 2, 3, 24, 24, 16, true, false},
      {asc::kFloat16, 1, 2, 10, 33, 8, false, false},   {asc::kBFloat16, 2, 2, 17, 17, 32, true, true},
      {asc::kBFloat16, 1, 1, 40, 40, 64, true, true},   {asc::kBFloat16, 8, 16, 1024, 1024, 64, true, true},
      {asc::kFloat16, 4, 8, 2048, 2048, 128, false, true},
  };
  int rejected = 0;
  for (int i = 1; i < argc; ++i) {
    std::ifstream f(argv[i]);
    if (!f) {
      std::fprintf(stderr, "cudnn_sdpa_check: cannot read %s\n", argv[i]);
      return 2;
    }
    std::stringstream json;
    json << f.rdbuf();
    std::printf("== %s\n", argv[i]);
    for (const Case& c : cases) {
      const std::string r = asc::cuda::cudnn_sdpa_offline_check(json.str(), c.dtype, c.B, c.H, c.T, c.S, c.D,
                                                                c.causal, c.heads_last);
      std::printf("%-8s B=%-2lld H=%-2lld T=%-5lld S=%-5lld D=%-3lld causal=%d heads_last=%d  %s\n",
                  c.dtype == asc::kBFloat16 ? "bf16" : "f16", static_cast<long long>(c.B),
                  static_cast<long long>(c.H), static_cast<long long>(c.T), static_cast<long long>(c.S),
                  static_cast<long long>(c.D), c.causal, c.heads_last, r.c_str());
      if (r.find(" 0 engine configs") != std::string::npos) ++rejected;
    }
  }
  std::printf("%d graph(s) without an engine\n", rejected);
  return rejected ? 1 : 0;
#else
  (void)argc, (void)argv;
  std::printf("cudnn_sdpa_check: this build has no real cuDNN\n");
  return 0;
#endif
}
