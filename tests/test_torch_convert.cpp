// tools/torch_convert.py against the real model: a PyTorch float64 TransformerClassifier twin with random weights
// (tests/torch_convert_check.py) is converted to ascender names, loaded into models::TransformerClassifier in float64,
// and must give PyTorch's logits on padded inputs; the state dict ascender then saves converts back to PyTorch bit for
// bit. Skipped (with a message) where python3 or PyTorch is missing.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "models/transformer_classifier.h"
#include "testing.h"

#ifndef ASC_SOURCE_DIR
#error "tests/CMakeLists.txt defines ASC_SOURCE_DIR (the source tree) for this test"
#endif
#ifndef ASC_PYTHON3
#define ASC_PYTHON3 "python3"
#endif

using namespace asc;
namespace fs = std::filesystem;

namespace {

// Runs a shell command; its exit status (-1 when it could not be run).
int run(const std::string& command) {
  int rc = std::system(command.c_str());
  return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string check_script() {
  return fmt::format("'{}' '{}/tests/torch_convert_check.py'", ASC_PYTHON3, ASC_SOURCE_DIR);
}

int64_t meta_int(const std::map<std::string, std::string>& meta, const std::string& key) {
  auto it = meta.find(key);
  REQUIRE_MESSAGE(it != meta.end(), "io.safetensors metadata lacks '" << key << "'");
  return std::stoll(it->second);
}

}  // namespace

TEST_CASE("a converted PyTorch checkpoint gives PyTorch's logits (float64, padded) and converts back bit-exactly") {
  if (run(fmt::format("'{}' -c 'import torch' >/dev/null 2>&1", ASC_PYTHON3)) != 0) {
    MESSAGE("skipped: " << ASC_PYTHON3 << " cannot import torch (apt-get install python3-torch)");
    return;
  }
  const fs::path dir = fs::temp_directory_path() / fmt::format("asc_torch_convert_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  REQUIRE(run(fmt::format("{} export '{}'", check_script(), dir.string())) == 0);

  std::ifstream list(dir / "cases.txt");
  std::string name;
  int cases = 0;
  while (std::getline(list, name)) {
    if (name.empty()) continue;
    ++cases;
    CAPTURE(name);
    std::map<std::string, std::string> meta;
    StateDict io = load_safetensors((dir / name / "io.safetensors").string(), &meta);
    auto options = models::TransformerClassifierOptions(meta_int(meta, "vocab"), meta_int(meta, "max_len"),
                                                        meta_int(meta, "classes"))
                       .d_model(meta_int(meta, "d_model"))
                       .heads(meta_int(meta, "heads"))
                       .layers(meta_int(meta, "layers"))
                       .ffn(meta_int(meta, "ffn"))
                       .norm_first(meta_int(meta, "norm_first") != 0);
    auto model = std::make_shared<models::TransformerClassifier>(options);
    model->to(kFloat64);
    model->load_state_dict(load_safetensors((dir / name / "ascender.safetensors").string()));  // strict: all keys
    model->eval();

    const Tensor tokens = io.at("tokens");                                      // (B, T) int64
    const Tensor valid = meta_int(meta, "masked") ? io.at("valid") : Tensor();  // (B, T) bool, true = real token
    const Tensor expected = io.at("logits");                                    // (B, classes) float64, PyTorch's
    Tensor logits = model->forward(tokens, valid);
    REQUIRE(logits.dtype() == kFloat64);
    REQUIRE(logits.shape() == expected.shape());
    const double diff = amax(abs(logits - expected)).item<double>();
    MESSAGE(name << ": max |ascender - PyTorch| = " << diff);
    CHECK(diff <= 1e-10);
    // What ascender itself writes goes back through to-torch in the round trip below.
    save_safetensors((dir / name / "from_ascender.safetensors").string(), model->state_dict());
  }
  CHECK(cases >= 3);
  CHECK(run(fmt::format("{} roundtrip '{}'", check_script(), dir.string())) == 0);
  fs::remove_all(dir);
}
