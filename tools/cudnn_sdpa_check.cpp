// Does cuDNN accept ascender's fused-attention graphs (cuda/cudnn_sdpa.cpp) for a given GPU, on a machine
// without one? cuDNN can plan for a device described by JSON device properties (tools/cudnn_devices/*.json);
// its heuristics then say how many engines take each graph. Run through tools/cudnn_sdpa_check.sh, which points
// the loader at the CUDA driver's stub library (plans then stop at module load, status 5001: expected).
//   bash tools/cudnn_sdpa_check.sh            # every device file, a table of shapes
//   cudnn_sdpa_check DEVICE.json... [--csv out.csv] [--json out.json]
// A graph with 0 engine configs would run on the composed path on that GPU (nn::sdpa_choice says why); the exit status
// is then 1. --help lists the options in any build; a missing or unreadable device file exits 2 (tools/cli.h).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "ascender.h"
#include "cuda/cudnn_sdpa.h"
#include "tools/cli.h"

using namespace asc;

int main(int argc, char** argv) {
  std::vector<std::string> devices;
  tools::Outputs out;
  CLI::App app{
      "cudnn_sdpa_check: how many cuDNN engines take each of ascender's fused-attention graphs, for GPUs "
      "described by JSON device files (no GPU needed; run through tools/cudnn_sdpa_check.sh)",
      "cudnn_sdpa_check"};
  app.add_option("devices", devices, "cuDNN device-property files (tools/cudnn_devices/*.json)")
      ->required()
      ->check(CLI::ExistingFile)
      ->type_name("DEVICE.json");
  tools::add_output_options(app, out);
  tools::parse_or_exit(app, argc, argv);
#if defined(ASC_HAVE_CUDNN) && !defined(ASC_CUDA_EMULATION)
  return tools::guarded("cudnn_sdpa_check", [&] {
    struct Case {
      asc::DType dtype;
      int64_t B, H, T, S, D;
      bool causal, heads_last;
    };
    const Case cases[] = {
        {asc::kBFloat16, 2, 3, 24, 24, 16, false, false},    {asc::kBFloat16, 2, 3, 24, 24, 16, true, false},
        {asc::kFloat16, 1, 2, 10, 33, 8, false, false},      {asc::kBFloat16, 2, 2, 17, 17, 32, true, true},
        {asc::kBFloat16, 1, 1, 40, 40, 64, true, true},      {asc::kBFloat16, 8, 16, 1024, 1024, 64, true, true},
        {asc::kFloat16, 4, 8, 2048, 2048, 128, false, true},
    };
    int rejected = 0;
    tools::Table table({"device_file", "dtype", "B", "H", "T", "S", "D", "causal", "heads_last", "result"});
    for (const std::string& device : devices) {
      std::ifstream f(device);
      if (!f) {
        std::fprintf(stderr, "cudnn_sdpa_check: cannot read %s\n", device.c_str());
        return 2;
      }
      std::stringstream json;
      json << f.rdbuf();
      std::printf("== %s\n", device.c_str());
      for (const Case& c : cases) {
        const std::string r =
            asc::cuda::cudnn_sdpa_offline_check(json.str(), c.dtype, c.B, c.H, c.T, c.S, c.D, c.causal, c.heads_last);
        std::printf("%-8s B=%-2lld H=%-2lld T=%-5lld S=%-5lld D=%-3lld causal=%d heads_last=%d  %s\n",
                    c.dtype == asc::kBFloat16 ? "bf16" : "f16", static_cast<long long>(c.B),
                    static_cast<long long>(c.H), static_cast<long long>(c.T), static_cast<long long>(c.S),
                    static_cast<long long>(c.D), c.causal, c.heads_last, r.c_str());
        if (r.find(" 0 engine configs") != std::string::npos) ++rejected;
        table.add({tools::Cell::str(device), tools::Cell::str(c.dtype == asc::kBFloat16 ? "bf16" : "f16"),
                   tools::Cell::integer(c.B), tools::Cell::integer(c.H), tools::Cell::integer(c.T),
                   tools::Cell::integer(c.S), tools::Cell::integer(c.D), tools::Cell::integer(c.causal),
                   tools::Cell::integer(c.heads_last), tools::Cell::str(r)});
      }
    }
    std::printf("%d graph(s) without an engine\n", rejected);
    if (!tools::write_results(table, out, tools::run_facts("cudnn_sdpa_check", argc, argv), /*announce=*/false))
      return 1;
    return rejected ? 1 : 0;
  });
#else
  std::printf("cudnn_sdpa_check: this build has no real cuDNN\n");
  return 0;
#endif
}
