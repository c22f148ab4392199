// Optimizers, schedulers, clipping and hooks. Optimizer trajectories are checked against golden values from
// torch.optim (tests/data/gen_optim_golden.py, float64, same parameters and gradient sequence), schedulers against
// their closed forms written out here, clipping against plain loops.
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numbers>
#include <string>

#include "optim/optim.h"
#include "testing.h"
using namespace asc;
using namespace asc::testing;
using namespace asc::optim;

namespace {

const std::vector<double> kP0 = {0.5, -1.25, 2.0, 0.75, -0.3, 1.1};
const std::vector<std::vector<double>> kGrads = {
    {0.3, -0.8, 1.5, 2.0, 0.05, -1.2},  {0.1, -0.6, 1.1, 1.5, -0.4, -0.9},     {-0.2, 0.4, 0.2, 0.1, 0.0, -0.3},
    {0.25, 0.9, -0.05, 0.02, 0.6, 0.1}, {-0.35, 0.15, 0.4, -0.01, -0.2, 0.05},
};

struct Golden {
  std::string name;
  std::vector<std::vector<double>> steps;  // the (2, 3) parameter after each step
};

// Printed by tests/data/gen_optim_golden.py (torch 1.13, float64).
const std::vector<Golden> kGolden = {
    {"sgd_plain",
     {
         {0.47, -1.17, 1.85, 0.55, -0.305, 1.2200000000000002},
         {0.45999999999999996, -1.1099999999999999, 1.74, 0.4, -0.265, 1.3100000000000003},
         {0.48, -1.15, 1.72, 0.39, -0.265, 1.3400000000000003},
         {0.45499999999999996, -1.24, 1.7249999999999999, 0.388, -0.325, 1.3300000000000003},
         {0.48999999999999994, -1.255, 1.6849999999999998, 0.389, -0.305, 1.3250000000000004},
     }},
    {"sgd_momentum",
     {
         {0.47, -1.17, 1.85, 0.55, -0.305, 1.2200000000000002},
         {0.433, -1.0379999999999998, 1.605, 0.22000000000000006, -0.26949999999999996, 1.4180000000000001},
         {0.4197, -0.9591999999999998, 1.3645, -0.08699999999999994, -0.23754999999999996, 1.6262},
         {0.38273, -0.9782799999999998, 1.15305, -0.36529999999999996, -0.26879499999999995, 1.8035800000000002},
         {0.384457, -1.010452, 0.9227449999999998, -0.61477, -0.2769154999999999, 1.9582220000000001},
     }},
    {"sgd_nesterov",
     {
         {0.443, -1.098, 1.715, 0.37, -0.3095, 1.328},
         {0.3997, -0.9192000000000001, 1.3845, -0.077, -0.23754999999999998, 1.5962},
         {0.40773, -0.8882800000000001, 1.14805, -0.3633, -0.20879499999999998, 1.81358},
         {0.34945699999999996, -0.9954520000000001, 0.962745, -0.61577, -0.2969155, 1.963222},
         {0.38601129999999995, -1.0394068, 0.7154704999999999, -0.8392930000000001, -0.28422395, 2.0973998},
     }},
    {"sgd_dampening_wd",
     {
         {0.46749999999999997, -1.16375, 1.84, 0.54625, -0.3035, 1.2145000000000001},
         {0.43286375, -1.048676875, 1.62856, 0.276338125, -0.27723775, 1.3648492500000002},
         {0.417639726875, -0.9809480059375, 1.43970804, 0.052441441562499955, -0.255257617875, 1.5013516776250002},
         {0.3864987693309375, -0.9863315926667188, 1.2870874938599999, -0.12825945023296884, -0.2787801105124375,
          1.5982988888533127},
         {0.38473325760302923, -0.9976863014757602, 1.13248625071949, -0.2716712555935285, -0.282622374235594,
          1.666762611724976},
     }},
    {"sgd_nesterov_wd",
     {
         {0.46675, -1.162125, 1.8385, 0.552875, -0.3019, 1.2035500000000001},
         {0.438640875, -1.0566223125, 1.64768425, 0.3210851875, -0.26184195, 1.321761275},
         {0.4347759491875, -1.02186154428125, 1.499070324625, 0.16991198446874994, -0.242660756475, 1.4090106653875},
         {0.3963910283764688, -1.0531239686199532, 1.3722412028285624, 0.0362868212319218, -0.28127069389098747,
          1.4570974411525688},
         {0.40453537664830796, -1.049603849772162, 1.2115545182457097, -0.08170594655281742, -0.26843953937754933,
          1.492623661644425},
     }},
    {"adam",
     {
         {0.4900000003333333, -1.240000000125, 1.9900000000666667, 0.74000000005, -0.3099999980000004,
          1.1099999999166668},
         {0.4812893612157195, -1.2301742494493826, 1.9801955761167878, 0.7301742492910024, -0.30344673206786255,
          1.1198257506386065},
         {0.47901710910104295, -1.2254971299361734, 1.9719767533129662, 0.7223294639578172, -0.2983810385488977,
          1.1285271580932443},
         {0.47423892535144296, -1.2262876737172375, 1.9654022652419143, 0.7158571860385444, -0.3008937667912267,
          1.1352600279087297},
         {0.4744043089767004, -1.2275324319249614, 1.9588263720999528, 0.7104085201603656, -0.30148483265930154,
          1.1407696612039573},
     }},
    {"adam_amsgrad_wd",
     {
         {0.4800000571426939, -1.2300000216215983, 1.980000011764699, 0.7300000096385496, -0.3199990000499975,
          1.119999981651393},
         {0.4621418102672998, -1.210358061589219, 1.960406480200608, 0.7104217662340301, -0.3050730744565938,
          1.1394718758245854},
         {0.4555099030508893, -1.1997234730099615, 1.943816080864262, 0.6955229218845398, -0.29344253150398014,
          1.1553178608187986},
         {0.4434822951381205, -1.2003586764345346, 1.9304100899069905, 0.6838315667600143, -0.2986344757933185,
          1.1651410270737061},
         {0.4423234312316903, -1.2011274700921712, 1.9164438845867549, 0.6744728289989338, -0.2985320479843302,
          1.1711689347526426},
     }},
    {"adamw",
     {
         {0.4895000003333333, -1.238750000125, 1.9880000000666667, 0.73925000005, -0.30969999800000036,
          1.1088999999166667},
         {0.4802998612153862, -1.2276854994492576, 1.976207576116721, 0.7286849992909523, -0.3028370320698625,
          1.1176168506386897},
         {0.47754730923949423, -1.2217806944365992, 1.9660125457367827, 0.7201115289584762, -0.2974685015188278,
          1.125200641242689},
         {0.47229157818065476, -1.2213494575232267, 1.957472045119994, 0.712919139510245, -0.299683761259638,
          1.1308083104169315},
         {0.47198467022773155, -1.2213728662734273, 1.9489386799329125, 0.706757554492556, -0.2999751433664532,
          1.1351871354017422},
     }},
    {"adamw_amsgrad",
     {
         {0.47950000066666665, -1.22875000025, 1.9780000001333333, 0.7292500001, -0.31969999600000076,
          1.1188999998333333},
         {0.4614840093386852, -1.2078057815169645, 1.9563448800555803, 0.7088052811985766, -0.3061545935998305,
          1.1374965686599177},
         {0.4572926715870304, -1.1978031515959306, 1.9386004128877454, 0.6931743592903558, -0.2961932260061086,
          1.153397800928488},
         {0.44739792470926054, -1.199409033029718, 1.9247812809721274, 0.6808502710890247, -0.30157039506124605,
          1.1646131765626095},
         {0.4482761134042407, -1.2016951600001429, 1.9109608359074586, 0.6709448290651073, -0.302676917014625,
          1.1729303400158768},
     }},
    {"rmsprop",
     {
         {0.40000003333332224, -1.1500000124999985, 1.9000000066666662, 0.6500000049999998, -0.3999998000003999,
          1.1999999916666675},
         {0.3682339965246466, -1.0898070919957608, 1.8406704219699008, 0.589807080872574, -0.30076440316062236,
          1.2601929141837875},
         {0.42205092265258637, -1.1272104613049452, 1.8298920398234417, 0.5857772792582576, -0.30076440316062236,
          1.27996039162539},
         {0.36604101948208473, -1.1917896291419332, 1.8325992176683135, 0.584967285229117, -0.3840301513307543,
          1.273352511282583},
         {0.42793842555432143, -1.2025443060227, 1.8113306905326207, 0.5853743191719016, -0.3571608904337716,
          1.2700337556451333},
     }},
    {"rmsprop_momentum",
     {
         {0.46837722673164917, -1.2183772246483162, 1.9683772240649828, 0.7183772238983162, -0.33162275660169643,
          1.1316227757683506},
         {0.4325961608486503, -1.1734673914941764, 1.9237390449421736, 0.673467389759561, -0.32551821746923026,
          1.176532609469499},
         {0.4220858812380421, -1.1501734835472763, 1.8843471390608069, 0.6361626656858712, -0.32063458616325735,
          1.2191933000319832},
         {0.3946269639468437, -1.1532889113103197, 1.8538032823861752, 0.6060286317624363, -0.34379365836030085,
          1.2509627713925247},
         {0.3936707531710032, -1.1595748408231679, 1.8214516180040643, 0.5820743804738052, -0.35321381335290397,
          1.2751359635126347},
     }},
    {"rmsprop_centered",
     {
         {0.3998317945884962, -1.149622322675977, 1.8995635134520872, 0.6495466981575885, -0.3985233869347837,
          1.2004196768820359},
         {0.3679123015981295, -1.088895270325643, 1.8396813364073812, 0.588782745650005, -0.29915810724155456,
          1.2611672237849307},
         {0.4216571713907759, -1.126420828144727, 1.8287877198450706, 0.5847128358570938, -0.29915810724155456,
          1.28116628798647},
         {0.3654981727000276, -1.1909544697149415, 1.8315223940105572, 0.5838947710684727, -0.382361119909273,
          1.2744890408981475},
         {0.42729356720116707, -1.2017016293678977, 1.8099792477714236, 0.5843057926724663, -0.35552720197797927,
          1.2711375296771872},
     }},
    {"rmsprop_all",
     {
         {0.47705842962046224, -1.2270584277509238, 1.9770584272321388, 0.7270584271202362, -0.32294152075559796,
          1.1229415724213392},
         {0.4517190900164356, -1.1962894750194064, 1.9465002230708868, 0.6965650802334261, -0.31613508977873067,
          1.1530001724187728},
         {0.4428993846182523, -1.1803143172307844, 1.9206201739700401, 0.6736221919024514, -0.3096555785087233,
          1.1773997789287691},
         {0.42260715297415324, -1.1818732234083071, 1.9008461994805392, 0.6567187642064661, -0.323253214773856,
          1.190543226948815},
         {0.420680296979137, -1.1834959081104817, 1.8801125523005922, 0.6443356374162724, -0.325586496340129,
          1.1966698719092008},
     }},
};

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, std::vector<Tensor> ps) {
  if (name == "sgd_plain") return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1});
  if (name == "sgd_momentum") return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.9});
  if (name == "sgd_nesterov")
    return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
  if (name == "sgd_dampening_wd")
    return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.8, .dampening = 0.3, .weight_decay = 0.05});
  if (name == "sgd_nesterov_wd")
    return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true});
  if (name == "adam") return std::make_unique<Adam>(ps, AdamOptions{.lr = 0.01});
  if (name == "adam_amsgrad_wd")
    return std::make_unique<Adam>(
        ps, AdamOptions{.lr = 0.02, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1, .amsgrad = true});
  if (name == "adamw") return std::make_unique<AdamW>(ps, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
  if (name == "adamw_amsgrad")
    return std::make_unique<AdamW>(
        ps, AdamWOptions{.lr = 0.02, .beta1 = 0.85, .beta2 = 0.9, .weight_decay = 0.05, .amsgrad = true});
  if (name == "rmsprop") return std::make_unique<RMSprop>(ps, RMSpropOptions{.lr = 0.01});
  if (name == "rmsprop_momentum")
    return std::make_unique<RMSprop>(ps, RMSpropOptions{.lr = 0.01, .alpha = 0.9, .momentum = 0.8});
  if (name == "rmsprop_centered")
    return std::make_unique<RMSprop>(ps, RMSpropOptions{.lr = 0.01, .eps = 1e-4, .centered = true});
  if (name == "rmsprop_all")
    return std::make_unique<RMSprop>(
        ps, RMSpropOptions{.lr = 0.005, .alpha = 0.95, .weight_decay = 0.1, .momentum = 0.7, .centered = true});
  FAIL("unknown config " << name);
  return nullptr;
}

Tensor param(DType dt = kFloat64, const std::vector<double>& v = kP0) {
  return tensor(v, {2, 3}).to(dt).set_requires_grad(true);
}
Tensor grad_at(size_t t, DType dt = kFloat64) { return tensor(kGrads[t], {2, 3}).to(dt); }

bool same_state_dict(const StateDict& a, const StateDict& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, t] : a) {
    const Tensor* u = b.find(k);
    if (!u || !same_bits(t, *u)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("optimizers match torch.optim over a fixed gradient sequence (float64 and float32)") {
  for (const auto& gold : kGolden) {
    for (DType dt : {kFloat64, kFloat32}) {
      CAPTURE(gold.name);
      CAPTURE(dtype_name(dt));
      Tensor p = param(dt);
      auto opt = make_optimizer(gold.name, {p});
      for (size_t t = 0; t < kGrads.size(); ++t) {
        CAPTURE(t);
        p.set_grad(grad_at(t, dt));
        opt->step();
        CHECK(p.requires_grad());
        if (dt == kFloat64)
          check_close(p, gold.steps[t], 1e-14, 1e-12);
        else
          check_close(p, gold.steps[t], 2e-6, 2e-5);
      }
      CHECK(opt->step_count(p) == 5);
    }
  }
}

TEST_CASE("vectorised updates: a long parameter's elements get the bits of one-element parameters (the scalar tail)") {
  // The update loops run as vector instructions over a parameter's body and one element at a time over its tail: the
  // same IEEE operations lane by lane, so a 1001-element parameter and 1001 parameters of one element each must
  // agree to the bit, for every optimizer configuration, in float32 and float64.
  for (const auto& gold : kGolden) {
    for (DType dt : {kFloat32, kFloat64}) {
      CAPTURE(gold.name);
      CAPTURE(dtype_name(dt));
      const int64_t n = 1001;
      const Tensor start = randn64({n}, false, 7).to(dt);
      Tensor whole = start.clone().set_requires_grad(true);
      std::vector<Tensor> parts;
      for (int64_t i = 0; i < n; ++i) parts.push_back(start.slice(0, i, i + 1).clone().set_requires_grad(true));
      auto a = make_optimizer(gold.name, {whole});
      auto b = make_optimizer(gold.name, parts);
      for (uint64_t t = 0; t < 3; ++t) {
        const Tensor g = randn64({n}, false, 100 + t).to(dt);
        whole.set_grad(g.clone());
        for (int64_t i = 0; i < n; ++i) parts[static_cast<size_t>(i)].set_grad(g.slice(0, i, i + 1).clone());
        a->step();
        b->step();
      }
      CHECK(same_bits(whole, cat(parts, 0)));
    }
  }
}

TEST_CASE("torch's defaults and option accessors") {
  Tensor p = param();
  SGD sgd({p});
  CHECK(sgd.lr(0) == 1e-2);
  Adam adam({param()});
  CHECK(adam.options(0).beta1 == 0.9);
  CHECK(adam.options(0).beta2 == 0.999);
  CHECK(adam.options(0).eps == 1e-8);
  CHECK(adam.options(0).weight_decay == 0);
  AdamW adamw({param()});
  CHECK(adamw.options(0).weight_decay == 1e-2);
  CHECK(adamw.lr(0) == 1e-3);
  RMSprop rms({param()});
  CHECK(rms.options(0).alpha == 0.99);
  CHECK(rms.lr(0) == 1e-2);
  // Designated initializers, as the rest of the project writes them.
  AdamW opt(std::vector<Tensor>{param()}, {.lr = 1e-3, .weight_decay = 0.01});
  CHECK(opt.option(0, "weight_decay") == 0.01);
  opt.set_option(0, "amsgrad", 1);
  CHECK(opt.options(0).amsgrad);
  CHECK(opt.name() == "AdamW");
}

TEST_CASE("param groups keep their own options") {
  Tensor a = param(), b = param(kFloat64, {1, 2, 3, 4, 5, 6});
  SGD opt({a}, {.lr = 0.1, .momentum = 0.9});
  opt.add_param_group({b}, {.lr = 0.05});
  REQUIRE(opt.num_groups() == 2);
  CHECK(opt.params(1).size() == 1);
  CHECK(opt.params(1)[0].is_same(b));
  CHECK(opt.lr(0) == 0.1);
  CHECK(opt.lr(1) == 0.05);
  std::vector<double> bv = {1, 2, 3, 4, 5, 6};
  const Golden& gold = kGolden[1];  // sgd_momentum, lr 0.1
  REQUIRE(gold.name == "sgd_momentum");
  for (size_t t = 0; t < kGrads.size(); ++t) {
    a.set_grad(grad_at(t));
    b.set_grad(grad_at(t));
    if (t == 3) opt.set_lr(1, 0.02);
    opt.step();
    for (size_t i = 0; i < 6; ++i) bv[i] -= (t >= 3 ? 0.02 : 0.05) * kGrads[t][i];  // plain SGD, no momentum
    check_close(a, gold.steps[t], 1e-14, 1e-12);
    check_close(b, bv, 1e-14, 1e-12);
  }
  CHECK(opt.state(a, "momentum_buffer").defined());
  CHECK_FALSE(opt.state(b, "momentum_buffer").defined());  // momentum 0: no buffer
}

TEST_CASE("parameters without a grad are skipped, state untouched; zero_grad drops grads") {
  Tensor a = param(), b = param(kFloat64, {1, 2, 3, 4, 5, 6});
  Tensor b0 = b.detach().clone();
  Adam opt({a, b}, {.lr = 0.01});
  for (size_t t = 0; t < kGrads.size(); ++t) {
    a.set_grad(grad_at(t));
    opt.step();
    check_close(a, kGolden[5].steps[t], 1e-14, 1e-12);
  }
  REQUIRE(kGolden[5].name == "adam");
  CHECK(same_bits(b, b0));
  CHECK(opt.step_count(b) == 0);
  CHECK_FALSE(opt.state(b, "exp_avg").defined());
  CHECK(opt.step_count(a) == 5);

  // b gets a grad in one step only: its step count is 1, and it moved like a first Adam step: -lr sign(g).
  b.set_grad(grad_at(0));
  a.zero_grad();
  Tensor a_before = a.detach().clone();
  opt.step();
  CHECK(same_bits(a, a_before));
  CHECK(opt.step_count(a) == 5);
  CHECK(opt.step_count(b) == 1);
  std::vector<double> expect(6);
  for (size_t i = 0; i < 6; ++i) {
    // m̂ = g, v̂ = g^2 after one step: update = lr g / (|g| + eps)
    double g = kGrads[0][i];
    expect[i] = b0.to_vector<double>()[i] - 0.01 * g / (std::abs(g) + 1e-8);
  }
  check_close(b, expect, 1e-14, 1e-12);

  a.set_grad(grad_at(0));
  opt.zero_grad();
  CHECK_FALSE(a.grad().defined());
  CHECK_FALSE(b.grad().defined());
  Tensor a1 = a.detach().clone(), b1 = b.detach().clone();
  opt.step();  // nothing to do
  CHECK(same_bits(a, a1));
  CHECK(same_bits(b, b1));
}

TEST_CASE("updates are in place and keep the caller's handles") {
  Tensor p = param();
  Tensor view = p.detach();  // shares storage
  SGD opt({p}, {.lr = 0.1});
  p.set_grad(grad_at(0));
  opt.step();
  check_close(view, kGolden[0].steps[0], 1e-15, 0);
  CHECK(p.is_leaf());
  CHECK(p.requires_grad());
}

TEST_CASE("state_dict round trip resumes bit-identically") {
  for (const char* name : {"sgd_nesterov_wd", "adam_amsgrad_wd", "adamw", "rmsprop_all"}) {
    CAPTURE(name);
    Tensor pa = param(), qa = param(kFloat64, {3, 1, 4, 1, 5, 9});
    auto A = make_optimizer(name, {pa});
    A->add_step_pre_hook([](Optimizer&) {});
    // a second group with a different lr
    if (auto* s = dynamic_cast<SGD*>(A.get()))
      s->add_param_group({qa}, {.lr = 0.3, .momentum = 0.5});
    else if (auto* ad = dynamic_cast<Adam*>(A.get()))
      ad->add_param_group({qa}, {.lr = 0.3});
    else if (auto* aw = dynamic_cast<AdamW*>(A.get()))
      aw->add_param_group({qa}, {.lr = 0.3});
    else if (auto* r = dynamic_cast<RMSprop*>(A.get()))
      r->add_param_group({qa}, {.lr = 0.3, .centered = true});
    for (size_t t = 0; t < 3; ++t) {
      pa.set_grad(grad_at(t));
      qa.set_grad(grad_at(4 - t));
      A->step();
    }
    StateDict sd = A->state_dict();
    // Layout: options as float64 scalars, step counts as int64.
    REQUIRE(sd.contains("groups.0.lr"));
    CHECK(sd.at("groups.0.lr").dtype() == kFloat64);
    CHECK(sd.at("groups.1.lr").item<double>() == 0.3);
    CHECK(sd.at("groups.1.num_params").dtype() == kInt64);
    REQUIRE(sd.contains("state.1.0.step"));
    CHECK(sd.at("state.1.0.step").dtype() == kInt64);
    CHECK(sd.at("state.1.0.step").item<int64_t>() == 3);

    // B: fresh parameters with A's current values, different options, loads A's state.
    Tensor pb = pa.detach().clone().set_requires_grad(true), qb = qa.detach().clone().set_requires_grad(true);
    std::unique_ptr<Optimizer> B;  // the same type as A, built below
    if (dynamic_cast<SGD*>(A.get())) {
      auto s = std::make_unique<SGD>(std::vector<Tensor>{pb}, SGDOptions{.lr = 0.9});
      s->add_param_group({qb}, {});
      B = std::move(s);
    } else if (dynamic_cast<Adam*>(A.get())) {
      auto s = std::make_unique<Adam>(std::vector<Tensor>{pb});
      s->add_param_group({qb}, {});
      B = std::move(s);
    } else if (dynamic_cast<AdamW*>(A.get())) {
      auto s = std::make_unique<AdamW>(std::vector<Tensor>{pb});
      s->add_param_group({qb}, {});
      B = std::move(s);
    } else {
      auto s = std::make_unique<RMSprop>(std::vector<Tensor>{pb});
      s->add_param_group({qb}, {});
      B = std::move(s);
    }
    B->load_state_dict(sd);
    CHECK(B->lr(0) == A->lr(0));
    CHECK(B->lr(1) == 0.3);
    CHECK(same_state_dict(B->state_dict(), sd));
    // The loaded state is a copy: A's later steps do not leak into B.
    for (size_t t = 3; t < 5; ++t) {
      pa.set_grad(grad_at(t));
      qa.set_grad(grad_at(t - 3));
      pb.set_grad(grad_at(t));
      qb.set_grad(grad_at(t - 3));
      A->step();
      B->step();
    }
    CHECK(same_bits(pa, pb));
    CHECK(same_bits(qa, qb));
    CHECK(same_state_dict(A->state_dict(), B->state_dict()));
  }
}

TEST_CASE("load_state_dict validates everything before changing anything") {
  Tensor pa = param();
  Adam A({pa}, {.lr = 0.01, .amsgrad = true});
  for (size_t t = 0; t < 2; ++t) {
    pa.set_grad(grad_at(t));
    A.step();
  }
  const StateDict good = A.state_dict();

  Tensor pb = param();
  Adam B({pb}, {.lr = 0.5});
  pb.set_grad(grad_at(4));
  B.step();
  const StateDict before = B.state_dict();

  auto with = [&](const std::string& key, Tensor t) {
    StateDict sd;
    for (const auto& [k, v] : good) sd.set(k, k == key ? t : v);
    if (!good.contains(key)) sd.set(key, t);
    return sd;
  };
  auto without = [&](const std::string& key) {
    StateDict sd;
    for (const auto& [k, v] : good)
      if (k != key) sd.set(k, v);
    return sd;
  };
  check_error(
      [&] {
        B.load_state_dict(with("state.0.0.exp_avg", zeros({3, 2}, {.dtype = kFloat64})));
      },
      {"Adam.load_state_dict", "state.0.0.exp_avg", "[3, 2]", "[2, 3]"});
  check_error(
      [&] {
        B.load_state_dict(with("state.0.0.exp_avg_sq", zeros({2, 3})));
      },
      {"state.0.0.exp_avg_sq", "float32"});
  check_error([&] { B.load_state_dict(without("groups.0.beta1")); }, {"missing entry 'groups.0.beta1'"});
  check_error([&] { B.load_state_dict(without("state.0.0.step")); }, {"missing entry 'state.0.0.step'"});
  check_error(
      [&] {
        B.load_state_dict(with("state.0.0.bogus", zeros({2, 3}, {.dtype = kFloat64})));
      },
      {"unexpected entry 'state.0.0.bogus'"});
  // A non-canonical index never aliases a real one ("00" is not "0").
  check_error([&] { B.load_state_dict(with("state.00.0.step", tensor(std::vector<int64_t>{1}, Shape{}))); },
              {"unexpected entry 'state.00.0.step'"});
  check_error([&] { B.load_state_dict(with("state.0.1.step", tensor(std::vector<int64_t>{1}, Shape{}))); },
              {"state.0.1.step", "parameter 1 of group 0"});
  check_error([&] { B.load_state_dict(with("groups.1.lr", scalar_tensor(0.1, {.dtype = kFloat64}))); },
              {"group 1", "1 groups"});
  check_error([&] { B.load_state_dict(with("groups.0.lr", scalar_tensor(-1.0, {.dtype = kFloat64}))); },
              {"Adam", "lr", "-1"});
  check_error([&] { B.load_state_dict(with("groups.0.num_params", tensor(std::vector<int64_t>{2}, Shape{}))); },
              {"group 0 has 2 parameters"});
  check_error([&] { B.load_state_dict(with("state.0.0.step", scalar_tensor(2.0, {.dtype = kFloat64}))); },
              {"state.0.0.step", "int64"});
  check_error([&] { B.load_state_dict(with("groups.0.lr", scalar_tensor(0.1, {.dtype = kFloat32}))); },
              {"groups.0.lr", "float64"});
  CHECK(same_state_dict(B.state_dict(), before));
  CHECK(B.lr(0) == 0.5);
  B.load_state_dict(good);
  CHECK(same_state_dict(B.state_dict(), good));
}

TEST_CASE("bad options, parameters and gradients are rejected") {
  check_error([] { SGD({param()}, {.lr = -1}); }, {"SGD", "lr", "-1"});
  check_error([] { SGD({param()}, {.lr = 0.1, .nesterov = true}); }, {"SGD", "nesterov", "momentum"});
  check_error([] { SGD({param()}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}); },
              {"nesterov", "dampening"});
  check_error([] { Adam({param()}, {.beta1 = 1.0}); }, {"Adam", "beta1", "[0, 1)"});
  check_error([] { AdamW({param()}, {.eps = -1e-8}); }, {"AdamW", "eps"});
  check_error([] { RMSprop({param()}, {.alpha = 1.5}); }, {"RMSprop", "alpha", "1.5"});
  check_error([] { Adam({param()}, {.lr = std::nan("")}); }, {"Adam", "lr", "nan"});
  Tensor p = param();
  check_error([&] { SGD({p, p}); }, {"SGD", "more than one place"});
  check_error([&] { SGD({p}).add_param_group({p}, {}); }, {"more than one place"});
  check_error([] { SGD({tensor(std::vector<int64_t>{1, 2}, {2})}); }, {"SGD", "int64"});
  check_error([&] { SGD({p * 2.0}); }, {"SGD", "not a leaf"});
  check_error([&] { SGD({Tensor()}); }, {"SGD", "undefined"});
  check_error([] { SGD({randn64({3, 4}).t()}); }, {"SGD", "not contiguous"});

  // A bad grad anywhere: nothing moves, not even parameters with good grads listed before it.
  Tensor a = param(), b = param();
  SGD opt({a}, {.lr = 0.1, .momentum = 0.9});
  opt.add_param_group({b}, {});
  a.set_grad(grad_at(0));
  b.set_grad(zeros({3, 2}, {.dtype = kFloat64}));
  check_error([&] { opt.step(); }, {"SGD.step", "parameter 0 of group 1", "[3, 2]"});
  CHECK(same_bits(a, param()));
  CHECK_FALSE(opt.state(a, "momentum_buffer").defined());
  b.set_grad(zeros({2, 3}, {.dtype = kFloat32}));
  check_error([&] { opt.step(); }, {"SGD.step", "float32"});
  check_error([&] { opt.lr(2); }, {"SGD.lr", "group 2", "2 groups"});
  check_error([&] { opt.set_lr(0, -0.5); }, {"SGD", "lr", "-0.5"});
  CHECK(opt.lr(0) == 0.1);
  check_error([&] { opt.option(0, "beta1"); }, {"SGD.option", "no option named 'beta1'"});
  check_error([&] { opt.state(a, "exp_avg"); }, {"SGD.state", "exp_avg"});
  check_error([&] { opt.remove_hook(42); }, {"SGD.remove_hook", "42"});
}

namespace {
struct RecordingRule : LocalRule {
  std::vector<std::string>* log;
  Tensor p;
  explicit RecordingRule(std::vector<std::string>* l, Tensor param) : log(l), p(param) {}
  void apply() override { log->push_back(fmt::format("rule apply p0={}", p.to_vector<double>()[0])); }
  void clear() override { log->push_back("rule clear"); }
};
}  // namespace

TEST_CASE("hooks and rules fire in order around the update") {
  std::vector<std::string> log;
  Tensor p = param(kFloat64, {1, 1, 1, 1, 1, 1});
  SGD opt({p}, {.lr = 0.5});
  auto v = [&] { return p.to_vector<double>()[0]; };
  int h1 = opt.add_step_pre_hook([&](Optimizer& o) { log.push_back(fmt::format("pre1 p0={}", v())); });
  opt.add_step_pre_hook([&](Optimizer& o) {
    CHECK(&o == &opt);
    log.push_back(fmt::format("pre2 p0={}", v()));
  });
  int h3 = opt.add_step_post_hook([&](Optimizer&) { log.push_back(fmt::format("post1 p0={}", v())); });
  opt.add_step_post_hook([&](Optimizer&) { log.push_back(fmt::format("post2 p0={}", v())); });
  opt.add_local_rule(std::make_shared<RecordingRule>(&log, p));
  p.set_grad(ones({2, 3}, {.dtype = kFloat64}));
  opt.step();
  std::vector<std::string> expect = {"pre1 p0=1",    "pre2 p0=1",    "rule apply p0=0.5",
                                     "post1 p0=0.5", "post2 p0=0.5", "rule clear"};
  CHECK(log == expect);
  log.clear();
  opt.remove_hook(h1);
  opt.remove_hook(h3);
  opt.step();
  expect = {"pre2 p0=0.5", "rule apply p0=0", "post2 p0=0", "rule clear"};
  CHECK(log == expect);
  check_error([&] { opt.remove_hook(h1); }, {"no hook with id"});
}

// ---- schedulers ----------------------------------------------------------------------------------------------

TEST_CASE("WarmupCosine follows its closed form on every group") {
  Tensor a = param(), b = param();
  SGD opt({a}, {.lr = 0.1});
  opt.add_param_group({b}, {.lr = 0.02});
  const int64_t W = 5, T = 25;
  const double min_lr = 1e-3, f0 = 0.1;
  WarmupCosine sched(opt, {.warmup_steps = W, .total_steps = T, .min_lr = min_lr, .start_factor = f0});
  for (int64_t s = 0; s <= 30; ++s) {
    CAPTURE(s);
    CHECK(sched.last_step() == s);
    for (size_t g = 0; g < 2; ++g) {
      const double base = g == 0 ? 0.1 : 0.02;
      double expect;
      if (s < W)
        expect = base * (f0 + (1 - f0) * double(s) / W);
      else if (s <= T)
        expect = min_lr + 0.5 * (base - min_lr) * (1 + std::cos(std::numbers::pi * double(s - W) / (T - W)));
      else
        expect = min_lr;
      CHECK(opt.lr(g) == doctest::Approx(expect).epsilon(1e-13));
    }
    sched.step();
  }
  // Landmarks by hand: start factor, peak, midpoint of the cosine, floor.
  WarmupCosine s2(opt, {.warmup_steps = 4, .total_steps = 14, .min_lr = 0.0});
  CHECK(opt.lr(0) == 0.0);  // base lrs are the current lrs (min_lr after the first schedule); start factor 0
  Tensor c = param();
  SGD o3({c}, {.lr = 1.0});
  WarmupCosine s3(o3, {.warmup_steps = 4, .total_steps = 14, .min_lr = 0.2});
  std::vector<double> seen;
  for (int i = 0; i < 16; ++i) {
    seen.push_back(o3.lr(0));
    s3.step();
  }
  CHECK(seen[0] == 0.0);
  CHECK(seen[2] == doctest::Approx(0.5));
  CHECK(seen[4] == 1.0);
  CHECK(seen[9] == doctest::Approx(0.6));  // halfway through the cosine: (1 + 0.2) / 2
  CHECK(seen[14] == doctest::Approx(0.2));
  CHECK(seen[15] == 0.2);
  check_error([&] { WarmupCosine(o3, {.warmup_steps = 10, .total_steps = 5}); }, {"WarmupCosine", "total_steps"});
  check_error([&] { WarmupCosine(o3, {.total_steps = 5, .start_factor = 2}); }, {"WarmupCosine", "start_factor"});
}

TEST_CASE("StepLR and LambdaLR follow their closed forms") {
  Tensor a = param();
  Adam opt({a}, {.lr = 0.8});
  StepLR sched(opt, 3, 0.5);
  const double expect[] = {0.8, 0.8, 0.8, 0.4, 0.4, 0.4, 0.2, 0.2, 0.2, 0.1};
  for (double e : expect) {
    CHECK(opt.lr(0) == e);
    sched.step();
  }
  Tensor b = param();
  SGD o2({b}, {.lr = 2.0});
  LambdaLR lam(o2, [](int64_t s) { return 1.0 / (1.0 + double(s)); });
  for (int64_t s = 0; s < 6; ++s) {
    CHECK(o2.lr(0) == doctest::Approx(2.0 / (1.0 + s)).epsilon(1e-15));
    lam.step();
  }
  check_error([&] { StepLR(o2, 0); }, {"StepLR", "step_size"});
  LambdaLR bad(o2, [](int64_t s) { return s < 2 ? 1.0 : -1.0; });
  bad.step();
  const double lr_before = o2.lr(0);
  check_error([&] { bad.step(); }, {"LambdaLR", "group 0 at step 2", "must be finite and >= 0"});
  CHECK(bad.last_step() == 1);  // nothing changed
  CHECK(o2.lr(0) == lr_before);
}

TEST_CASE("scheduler state round trip") {
  Tensor a = param(), b = param();
  AdamW A({a}, {.lr = 0.01});
  A.add_param_group({b}, {.lr = 0.004});
  WarmupCosine sa(A, {.warmup_steps = 3, .total_steps = 20, .min_lr = 1e-4});
  for (int i = 0; i < 7; ++i) sa.step();
  StateDict sd = sa.state_dict();
  CHECK(sd.at("last_step").item<int64_t>() == 7);
  CHECK(sd.at("base_lrs.1").item<double>() == 0.004);

  Tensor c = param(), d = param();
  AdamW B({c}, {.lr = 0.5});
  B.add_param_group({d}, {.lr = 0.5});
  WarmupCosine sb(B, {.warmup_steps = 3, .total_steps = 20, .min_lr = 1e-4});
  sb.load_state_dict(sd);
  CHECK(sb.last_step() == 7);
  for (int i = 0; i < 5; ++i) {
    CHECK(B.lr(0) == A.lr(0));
    CHECK(B.lr(1) == A.lr(1));
    sa.step();
    sb.step();
  }
  StateDict bad;
  bad.set("last_step", tensor(std::vector<int64_t>{2}, Shape{}));
  bad.set("base_lrs.0", scalar_tensor(0.1, {.dtype = kFloat64}));
  check_error([&] { sb.load_state_dict(bad); }, {"WarmupCosine.load_state_dict", "base_lrs"});
  bad.set("base_lrs.1", scalar_tensor(0.1, {.dtype = kFloat64}));
  bad.set("base_lrs.2", scalar_tensor(0.1, {.dtype = kFloat64}));
  check_error([&] { sb.load_state_dict(bad); }, {"'base_lrs.2'", "2 groups"});
  // "base_lrs.00" is not group 0: with it standing in for group 1 the load must fail, not pass the count check.
  StateDict aliased;
  aliased.set("last_step", tensor(std::vector<int64_t>{2}, Shape{}));
  aliased.set("base_lrs.0", scalar_tensor(0.1, {.dtype = kFloat64}));
  aliased.set("base_lrs.00", scalar_tensor(0.1, {.dtype = kFloat64}));
  check_error([&] { sb.load_state_dict(aliased); }, {"unexpected entry 'base_lrs.00'"});
  StateDict none;
  check_error([&] { sb.load_state_dict(none); }, {"missing entry 'last_step'"});
  CHECK(sb.last_step() == 12);
  CHECK(B.lr(0) == A.lr(0));
}

// ---- clipping -------------------------------------------------------------------------------------------------

namespace {
double naive_total_norm(const std::vector<std::vector<double>>& gs, double p) {
  if (std::isinf(p)) {
    double m = 0;
    for (const auto& g : gs)
      for (double v : g) m = std::max(m, std::abs(v));
    return m;
  }
  double s = 0;
  for (const auto& g : gs)
    for (double v : g) s += std::pow(std::abs(v), p);
  return std::pow(s, 1.0 / p);
}
}  // namespace

TEST_CASE("clip_grad_norm matches plain loops") {
  for (DType dt : {kFloat64, kFloat32}) {
    for (double p : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
      for (double max_norm : {0.5, 1e6}) {
        CAPTURE(p);
        CAPTURE(max_norm);
        Tensor a = randn64({4, 5}, true, 1).to(dt).detach().set_requires_grad(true);
        Tensor b = randn64({7}, true, 2).to(dt).detach().set_requires_grad(true);
        Tensor c = randn64({3}, true, 3).to(dt).detach().set_requires_grad(true);  // no grad
        a.set_grad(randn64({4, 5}, false, 11).to(dt));
        b.set_grad(randn64({7}, false, 12).to(dt));
        std::vector<std::vector<double>> gs = {a.grad().to_vector<double>(), b.grad().to_vector<double>()};
        const double expect = naive_total_norm(gs, p);
        const double total = clip_grad_norm({a, b, c}, max_norm, p);
        CHECK(total == doctest::Approx(expect).epsilon(1e-12));
        const double coef = max_norm / (expect + 1e-6);
        for (int k = 0; k < 2; ++k) {
          std::vector<double> e = gs[k];
          if (coef < 1)
            for (double& v : e) v *= coef;
          check_close(k == 0 ? a.grad() : b.grad(), e, dt == kFloat64 ? 1e-15 : 1e-7, dt == kFloat64 ? 1e-13 : 1e-6);
        }
        if (coef >= 1) CHECK(a.grad().to_vector<double>() == gs[0]);  // untouched
        CHECK_FALSE(c.grad().defined());
      }
    }
  }
  CHECK(clip_grad_norm({param()}, 1.0) == 0.0);  // no grads at all
}

TEST_CASE("clip_grad_norm: non-finite totals and bad arguments") {
  Tensor a = param(), b = param();
  a.set_grad(grad_at(0));
  b.set_grad(tensor({1.0, std::numeric_limits<double>::infinity(), 0, 0, 0, 0}, {2, 3}, {.dtype = kFloat64}));
  check_error([&] { clip_grad_norm({a, b}, 1.0); }, {"clip_grad_norm", "non-finite", "inf"});
  check_close(a.grad(), kGrads[0], 0, 0);  // untouched
  b.grad().fill_(std::nan(""));
  check_error([&] { clip_grad_norm({a, b}, 1.0, 1.0); }, {"clip_grad_norm", "non-finite", "nan"});
  const double t = clip_grad_norm({a, b}, 1.0, 2.0, /*error_if_nonfinite=*/false);
  CHECK(std::isnan(t));
  CHECK(std::isnan(a.grad().to_vector<double>()[0]));  // scaled by NaN, as torch does
  check_error([&] { clip_grad_norm({a}, -1.0); }, {"clip_grad_norm", "max_norm"});
  check_error([&] { clip_grad_norm({a}, 1.0, 0.0); }, {"clip_grad_norm", "norm_type"});
  // Every norm type: NaN anywhere gives NaN (even beside an infinity), an infinity alone gives inf.
  for (double p : {1.0, 2.0, 3.0, std::numeric_limits<double>::infinity()}) {
    CAPTURE(p);
    Tensor x = param(), y = param();
    x.set_grad(tensor({1.0, std::numeric_limits<double>::infinity(), 0, 0, 0, 0}, {2, 3}, {.dtype = kFloat64}));
    y.set_grad(grad_at(0));
    CHECK(std::isinf(clip_grad_norm({x, y}, 1.0, p, false)));
    y.grad().fill_(std::nan(""));
    CHECK(std::isnan(clip_grad_norm({x, y}, 1.0, p, false)));
  }
}

TEST_CASE("clip_grad_value matches plain loops") {
  Tensor a = param(), b = param();
  a.set_grad(grad_at(0));
  clip_grad_value({a, b}, 0.5);
  std::vector<double> e = kGrads[0];
  for (double& v : e) v = std::min(0.5, std::max(-0.5, v));
  check_close(a.grad(), e, 0, 0);
  CHECK_FALSE(b.grad().defined());
  check_error([&] { clip_grad_value({a}, -0.1); }, {"clip_grad_value", "-0.1"});
}

TEST_CASE("AdamW step on a transformer-sized parameter set (timing, informational)") {
  std::vector<Tensor> ps;
  for (int i = 0; i < 4; ++i) ps.push_back(randn32({256, 384}, i).set_requires_grad(true));
  for (auto& p : ps) p.set_grad(randn32({256, 384}, 100));
  AdamW opt(ps, {.lr = 1e-3});
  opt.step();
  const int iters = 20;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) opt.step();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
  MESSAGE(fmt::format("AdamW.step over {} float32 params: {:.3f} ms", 4 * 256 * 384, ms));
  CHECK(opt.step_count(ps[0]) == iters + 1);
}
