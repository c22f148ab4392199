// Deprecated names of 0.2, kept for one minor version (CHANGELOG.md): the firing layer's rule_b / rule_a members,
// which build a rule of optim/ from a layer of nn/. They are defined here, in the layer above both, since nn/ may not
// include optim/ (docs/architecture.md).
#include "nn/firing.h"
#include "optim/firing_rules.h"

namespace asc::nn {

std::shared_ptr<optim::FiringRuleB> FiringLayer::rule_b(const optim::RuleBOptions& o) {
  return optim::rule_b(*this, o);
}
std::shared_ptr<optim::FiringRuleA> FiringLayer::rule_a(const optim::RuleAOptions& o) {
  return optim::rule_a(*this, o);
}
std::shared_ptr<optim::FiringRuleB> FiringLayer::rule_b() { return optim::rule_b(*this); }
std::shared_ptr<optim::FiringRuleA> FiringLayer::rule_a() { return optim::rule_a(*this); }

}  // namespace asc::nn
